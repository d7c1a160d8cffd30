// The NCCL backend (BRAID_BACKEND=nccl, or auto where the CUDA backend cannot serve the ranks): every call runs
// on the rank's NCCL communicator (NcclBackend). User buffers that lie in a range registered with the braid
// communicator are registered with NCCL lazily, on the first call that uses them.
#pragma once

#include <memory>

#include "backends/backend.hpp"
#include "backends/nccl/nccl_backend.hpp"
#include "memory/registration.hpp"

namespace braid::detail {

class NcclCollectives final : public Backend {
 public:
  NcclCollectives(std::shared_ptr<NcclBackend> nccl, std::shared_ptr<RegistrationCache> registrations)
      : nccl_(std::move(nccl)), registrations_(std::move(registrations)) {}

  const char* name() const override { return "nccl"; }
  void collective(const collectives::CollectiveCall& call, Stream stream) override;
  void all_to_allv(const collectives::AllToAllvCall& call, Stream stream) override;
  void send_recv(const collectives::PointToPointBatch& batch, Stream stream) override;
  void raise_recorded_failure() override { nccl_->check(); }
  void check() override { nccl_->check(); }
  void abort() noexcept override { nccl_->abort(); }
  void revoke() override;

 private:
  // Lets NCCL register the range registered with the communicator that holds [buffer, buffer + bytes), if any.
  void register_buffer(const void* buffer, size_t bytes);

  std::shared_ptr<NcclBackend> nccl_;
  std::shared_ptr<RegistrationCache> registrations_;
};

}  // namespace braid::detail
