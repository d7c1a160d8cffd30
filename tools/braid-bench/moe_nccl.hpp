// The NCCL baseline of braid-bench --moe on one rank, as frameworks do it today: a routing kernel, the counts
// through ncclAlltoAll and the host, a gather kernel and an alltoallv of the rows; combine the way back.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "braid/types.hpp"
#include "cuda_objects.hpp"
#include "nccl.hpp"

namespace braid::bench::moe {

// With fp8 dispatch (`fp8` set) each row travels with its scales, packed after it as one alltoallv of bytes
// (packed_bytes a row), and the rows come back as `type` from an expert stand-in that dequantises them (expert(),
// outside the timed calls).
class NcclMoe {
 public:
  NcclMoe(NcclComm& nccl, int world, DataType type, std::optional<DataType> fp8, size_t hidden, size_t tokens, int top_k,
          int experts);

  void dispatch(const void* x, const float* scales, const int64_t* ids, const float* weights, cudaStream_t stream);

  // fp8: the experts' stand-in, y = the received rows dequantised (without fp8 y is the received rows).
  void expert(cudaStream_t stream);

  // The experts' rows go back (the expert output stand-in: y = x, dequantised after fp8), then the weighted sum
  // per token.
  void combine(void* out, cudaStream_t stream);

  // After dispatch (host-side figures of the last one): rows received from each rank.
  int64_t received_rows(int source) const { return host_counts_.get<int64_t>()[world_ + source]; }
  size_t packed_bytes() const { return packed_bytes_; }  // a received row's bytes, its scales included
  const DeviceMemory& recv() const { return recv_; }
  const DeviceMemory& back() const { return back_; }

 private:
  // From the routing counts (host: [world] sent, then [world] received, in rows): counts and displacements in
  // elements, `per_row` a row.
  void counts_of(const int64_t* host, size_t per_row, std::vector<size_t>& send_counts, std::vector<size_t>& send_displs,
                 std::vector<size_t>& recv_counts, std::vector<size_t>& recv_displs) const;

  NcclComm& nccl_;
  int world_;
  DataType type_;
  std::optional<DataType> fp8_;
  size_t hidden_, tokens_;
  int top_k_, experts_;
  size_t row_bytes_, scale_bytes_, packed_bytes_, send_rows_;
  DeviceMemory lists_, slots_, weight_sums_, counts_;
  PinnedMemory host_counts_;
  DeviceMemory send_, recv_, y_, back_;
  std::vector<size_t> send_counts_, send_displs_, recv_counts_, recv_displs_;  // dispatch, elements
  std::vector<size_t> back_send_counts_, back_send_displs_, back_recv_counts_, back_recv_displs_;  // combine
};

}  // namespace braid::bench::moe
