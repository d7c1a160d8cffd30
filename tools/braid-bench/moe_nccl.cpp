// The NCCL baseline of braid-bench --moe (moe_nccl.hpp): its buffers, and each phase's kernels and NCCL calls.
#include "moe_nccl.hpp"

#include <algorithm>

#include "braid/braid.hpp"  // kMoeScaleColumns
#include "moe_kernels.hpp"

namespace braid::bench::moe {

NcclMoe::NcclMoe(NcclComm& nccl, int world, DataType type, std::optional<DataType> fp8, size_t hidden, size_t tokens, int top_k,
                 int experts)
    : nccl_(nccl),
      world_(world),
      type_(type),
      fp8_(fp8),
      hidden_(hidden),
      tokens_(tokens),
      top_k_(top_k),
      experts_(experts),
      row_bytes_(hidden * datatype_size(type)),
      scale_bytes_(fp8 ? hidden / kMoeScaleColumns * sizeof(float) : 0),
      packed_bytes_(fp8 ? hidden + scale_bytes_ : row_bytes_),
      send_rows_(tokens * static_cast<size_t>(std::min(world, top_k))),
      lists_(static_cast<size_t>(world) * tokens * sizeof(int32_t)),
      slots_(tokens * world * sizeof(int32_t)),
      weight_sums_(tokens * world * sizeof(float)),
      counts_(2 * static_cast<size_t>(world) * sizeof(int64_t)),
      host_counts_(2 * static_cast<size_t>(world) * sizeof(int64_t)),
      send_(send_rows_ * packed_bytes_),
      recv_(static_cast<size_t>(world) * tokens * packed_bytes_),
      y_(fp8 ? static_cast<size_t>(world) * tokens * row_bytes_ : 0),
      back_(send_rows_ * row_bytes_),
      send_counts_(world), send_displs_(world), recv_counts_(world), recv_displs_(world),
      back_send_counts_(world), back_send_displs_(world), back_recv_counts_(world), back_recv_displs_(world) {}

void NcclMoe::dispatch(const void* x, const float* scales, const int64_t* ids, const float* weights, cudaStream_t stream) {
  int64_t* counts = counts_.get<int64_t>();
  cuda(moe::route_tokens(ids, weights, tokens_, top_k_, experts_, world_, lists_.get<int32_t>(), slots_.get<int32_t>(),
                         weight_sums_.get<float>(), counts, stream),
       "route_tokens");
  nccl_.all_to_all(counts, counts + world_, 1, DataType::kInt64, stream);
  cuda(cudaMemcpyAsync(host_counts_.get<int64_t>(), counts, 2 * world_ * sizeof(int64_t), cudaMemcpyDeviceToHost, stream),
       "cudaMemcpyAsync (counts to the host)");
  cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize (counts)");
  const int64_t* host = host_counts_.get<int64_t>();
  // Counts in elements: of `type` rows, or (fp8) bytes of packed rows; combine's in rows of `type`.
  const size_t dispatch_elements = fp8_ ? packed_bytes_ : hidden_;
  counts_of(host, dispatch_elements, send_counts_, send_displs_, recv_counts_, recv_displs_);
  counts_of(host, hidden_, back_send_counts_, back_send_displs_, back_recv_counts_, back_recv_displs_);
  if (fp8_) {
    cuda(moe::gather_rows(*fp8_, x, hidden_, tokens_, world_, lists_.get<int32_t>(), counts, send_.get(), stream, scales,
                          scale_bytes_),
         "gather_rows");
  } else {
    cuda(moe::gather_rows(type_, x, hidden_, tokens_, world_, lists_.get<int32_t>(), counts, send_.get(), stream),
         "gather_rows");
  }
  nccl_.all_to_allv(send_.get(), send_counts_.data(), send_displs_.data(), recv_.get(), recv_counts_.data(),
                    recv_displs_.data(), fp8_ ? DataType::kUint8 : type_, stream);
}

void NcclMoe::expert(cudaStream_t stream) {
  if (!fp8_) return;
  size_t rows = 0;
  for (int q = 0; q < world_; ++q) rows += static_cast<size_t>(received_rows(q));
  const unsigned char* recv = recv_.get<unsigned char>();
  cuda(moe::dequantize_rows(*fp8_, recv, packed_bytes_, recv + hidden_, packed_bytes_, hidden_, rows, type_, y_.get(), stream),
       "dequantize_rows");
}

void NcclMoe::combine(void* out, cudaStream_t stream) {
  const void* y = fp8_ ? y_.get() : recv_.get();
  nccl_.all_to_allv(y, back_recv_counts_.data(), back_recv_displs_.data(), back_.get(), back_send_counts_.data(),
                    back_send_displs_.data(), type_, stream);
  cuda(moe::weighted_sum(type_, back_.get(), hidden_, tokens_, world_, slots_.get<int32_t>(), weight_sums_.get<float>(),
                         counts_.get<int64_t>(), out, stream),
       "weighted_sum");
}

void NcclMoe::counts_of(const int64_t* host, size_t per_row, std::vector<size_t>& send_counts, std::vector<size_t>& send_displs,
                        std::vector<size_t>& recv_counts, std::vector<size_t>& recv_displs) const {
  size_t send_at = 0, recv_at = 0;
  for (int q = 0; q < world_; ++q) {
    send_counts[q] = static_cast<size_t>(host[q]) * per_row;
    recv_counts[q] = static_cast<size_t>(host[world_ + q]) * per_row;
    send_displs[q] = send_at;
    recv_displs[q] = recv_at;
    send_at += send_counts[q];
    recv_at += recv_counts[q];
  }
}

}  // namespace braid::bench::moe
