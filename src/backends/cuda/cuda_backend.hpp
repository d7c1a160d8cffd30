// The CUDA backend: braid's own kernels over symmetric memory, for ranks that are GPUs of one host with P2P
// access to each other. Every call goes to the collectives layer (collectives/collectives.hpp) with the
// communicator's collective context, which the communicator owns and outlives this backend.
#pragma once

#include "backends/backend.hpp"
#include "collectives/collective_context.hpp"

namespace braid::detail {

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(collectives::CollectiveContext& context) : context_(context) {}

  const char* name() const override { return "cuda"; }
  void collective(const collectives::CollectiveCall& call, Stream stream) override;
  void all_to_allv(const collectives::AllToAllvCall& call, Stream stream) override;
  void send_recv(const collectives::PointToPointBatch& batch, Stream stream) override;
  void raise_recorded_failure() override;
  void check() override;

 private:
  collectives::CollectiveContext& context_;
};

}  // namespace braid::detail
