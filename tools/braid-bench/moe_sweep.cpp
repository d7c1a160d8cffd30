// braid-bench --moe, one T: the routing and the inputs, then braid's layouts and the NCCL baseline, each a checked
// call (moe_check.cpp) and then its phases timed alone and as a layer.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <memory>

#include "cuda_objects.hpp"
#include "moe_bench.hpp"
#include "moe_kernels.hpp"

namespace braid::bench::moe {

constexpr unsigned char kOutPoison = 0xFF;   // combine outputs before a checked combine (NaN in every float type)

void MoeBench::run_tokens(size_t tokens) {
  const int K = options_.moe_top_k, E = options_.moe_experts, L = local_experts(), W = ranks_;
  const uint64_t seed = mix(seed_ + tokens);
  routings_.clear();
  for (int r = 0; r < W; ++r) routings_.push_back(make_routing(seed, r, tokens, K, E));
  // NVLink traffic: a token crosses once to each other rank holding one of its experts (combine: the reverse).
  std::vector<uint64_t> sent(W, 0), received(W, 0);
  for (int s = 0; s < W; ++s) {
    for (size_t t = 0; t < tokens; ++t) {
      uint64_t ranks = 0;
      for (int k = 0; k < K; ++k) ranks |= uint64_t(1) << (routings_[s].ids[t * K + k] / L);
      for (int d = 0; d < W; ++d) {
        if (d == s || (ranks >> d & 1) == 0) continue;
        ++sent[s];
        ++received[d];
      }
    }
  }
  uint64_t most_rows = 0;
  for (int r = 0; r < W; ++r) most_rows = std::max({most_rows, sent[r], received[r]});
  Bytes bytes;
  bytes.dispatch_nvlink = static_cast<double>(most_rows) * static_cast<double>(dispatch_token_bytes());
  bytes.combine_nvlink = static_cast<double>(most_rows) * static_cast<double>(row_bytes());
  bytes.dispatch_logical = static_cast<double>(tokens) * K * static_cast<double>(dispatch_token_bytes());
  bytes.combine_logical = static_cast<double>(tokens) * K * static_cast<double>(row_bytes());

  // Inputs.
  DeviceMemory x(tokens * dispatch_row_bytes()), scales(tokens * scale_bytes());
  DeviceMemory ids(tokens * K * sizeof(int64_t)), weights(tokens * K * sizeof(float));
  DeviceMemory out(tokens * row_bytes()), nccl_out(tokens * row_bytes());
  cuda(moe::fill_tokens(dispatch_type(), x.get(), tokens, options_.moe_hidden, seed, rank_, stream()), "fill_tokens");
  if (fp8()) cuda(moe::fill_scales(scales.get<float>(), tokens, options_.moe_hidden, seed, rank_, stream()), "fill_scales");
  cuda(cudaMemcpyAsync(ids.get(), routings_[rank_].ids.data(), tokens * K * sizeof(int64_t), cudaMemcpyHostToDevice,
                       stream()),
       "cudaMemcpyAsync (ids)");
  cuda(cudaMemcpyAsync(weights.get(), routings_[rank_].weights.data(), tokens * K * sizeof(float), cudaMemcpyHostToDevice,
                       stream()),
       "cudaMemcpyAsync (weights)");
  cuda(cudaMemsetAsync(out.get(), 0, out.bytes(), stream()), "cudaMemsetAsync");
  cuda(cudaMemsetAsync(nccl_out.get(), 0, nccl_out.bytes(), stream()), "cudaMemsetAsync");
  cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize (inputs)");

  Slot slots[kSlots];
  for (MoeBenchLayout layout : options_.moe_layouts) run_braid(layout, tokens, x, scales, ids, weights, out, slots);
  if (nccl_) {
    NcclMoe baseline(*nccl_, W, options_.type, fp8(), options_.moe_hidden, tokens, K, E);
    const Call dispatch = [&](cudaStream_t s) {
      baseline.dispatch(x.get(), scales.get<float>(), ids.get<int64_t>(), weights.get<float>(), s);
    };
    const Call combine = [&](cudaStream_t s) { baseline.combine(nccl_out.get(), s); };
    if (options_.check) {
      cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
      comm_.barrier();
      cuda(cudaMemsetAsync(baseline.recv().get(), kRowPoison, baseline.recv().bytes(), stream()), "cudaMemsetAsync");
      cuda(cudaMemsetAsync(baseline.back().get(), kRowPoison, baseline.back().bytes(), stream()), "cudaMemsetAsync");
      cuda(cudaMemsetAsync(nccl_out.get(), kOutPoison, nccl_out.bytes(), stream()), "cudaMemsetAsync");
      dispatch(stream());
      cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
      slots[kNcclDispatch].wrong = check_nccl_dispatch(baseline, tokens);
      slots[kNcclDispatch].state = 2;
      baseline.expert(stream());
      combine(stream());
      cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
      slots[kNcclCombine].wrong = check_combined(nccl_out, tokens, "nccl combine");
      slots[kNcclCombine].state = 2;
    } else {
      dispatch(stream());  // combine needs the counts of a dispatch
      baseline.expert(stream());
    }
    slots[kNcclDispatch].time_us = time_calls(dispatch, false);
    slots[kNcclCombine].time_us = time_calls(combine, true);
    const Call layer = [&](cudaStream_t s) {
      dispatch(s);
      combine(s);
    };
    slots[kNcclLayer].time_us = time_calls(layer, false);
    slots[kNcclLayer].state = 1;
    for (int i : {kNcclDispatch, kNcclCombine}) slots[i].state = std::max(slots[i].state, 1);
    cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
    comm_.barrier();
  }
  finish_row(tokens, bytes, slots);
}

// braid's phases in one layout: a checked dispatch and combine, then each timed alone and as a layer.
void MoeBench::run_braid(MoeBenchLayout layout, size_t tokens, DeviceMemory& x, DeviceMemory& scales, DeviceMemory& ids,
                         DeviceMemory& weights, DeviceMemory& out, Slot (&slots)[kSlots]) {
  const int K = options_.moe_top_k, W = ranks_;
  const bool rank = layout != MoeBenchLayout::kExpertMajor;
  const int first = first_slot(layout);
  Slot& dispatch_slot = slots[first];
  Slot& combine_slot = slots[first + 1];
  Slot& layer_slot = slots[first + 2];
  MoeShape shape;
  shape.hidden = options_.moe_hidden;
  shape.type = options_.type;
  shape.index_type = DataType::kInt64;
  shape.max_tokens = tokens;
  shape.top_k = K;
  shape.experts = options_.moe_experts;
  shape.expert_alignment = rank ? 1 : options_.moe_alignment;
  shape.dispatch_type = fp8();
  shape.layout = rank ? MoeLayout::kRankMajor : MoeLayout::kExpertMajor;
  shape.low_latency = layout == MoeBenchLayout::kLowLatency;
  shape.max_sms = options_.moe_max_sms;
  MoeBuffer buffer = MoeBuffer::create(comm_, shape);
  if (rank_ == 0) {
    std::printf("# T=%zu %s: MoeBuffer capacity_rows=%zu, symmetric_bytes=%.1f MiB per rank\n", tokens, layout_name(layout),
                buffer.capacity_rows(), static_cast<double>(MoeBuffer::symmetric_bytes(shape, W)) / (1 << 20));
    std::fflush(stdout);
  }
  MoeDispatchOutput view;
  const Call dispatch = [&](cudaStream_t s) {
    view = fp8() ? buffer.dispatch(x.get(), scales.get<float>(), ids.get(), weights.get<float>(), tokens, nullptr, s)
                 : buffer.dispatch(x.get(), ids.get(), weights.get<float>(), tokens, nullptr, s);
  };
  dispatch(stream());  // the first call: warm, and the views to poison before the checked one
  cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
  // The experts' output combine takes. Expert-major: the dispatched rows themselves (dequantised once after fp8
  // dispatch). Rank-major: in combine_input, each received row (dequantised) times the sum of its weights here,
  // so that combine's plain sum over ranks is the weighted sum. Made after the checked dispatch, kept for the
  // timed calls.
  std::unique_ptr<DeviceMemory> dequantised;
  if (fp8() && !rank) dequantised = std::make_unique<DeviceMemory>(buffer.capacity_rows() * row_bytes());
  auto expert = [&] {
    if (rank) {
      if (fp8()) {
        cuda(moe::dequantize_rows(*fp8(), view.x, dispatch_row_bytes(), view.scales, scale_bytes(), options_.moe_hidden,
                                  view.capacity_rows, options_.type, view.combine_input, stream()),
             "dequantize_rows");
      } else {
        cuda(cudaMemcpyAsync(view.combine_input, view.x, view.capacity_rows * row_bytes(), cudaMemcpyDeviceToDevice, stream()),
             "cudaMemcpyAsync (combine_input)");
      }
      cuda(moe::weigh_rows(options_.type, view.combine_input, options_.moe_hidden, view.capacity_rows, view.topk_weights, K,
                           stream()),
           "weigh_rows");
      return;
    }
    if (!fp8()) return;
    cuda(moe::dequantize_rows(*fp8(), view.x, dispatch_row_bytes(), view.scales, scale_bytes(), options_.moe_hidden,
                              view.capacity_rows, options_.type, dequantised->get(), stream()),
         "dequantize_rows");
  };
  const void* y = nullptr;
  auto y_of = [&] { return rank ? static_cast<const void*>(view.combine_input) : fp8() ? dequantised->get() : view.x; };
  if (options_.check) {
    dispatch_slot.wrong = rank ? check_rank_dispatch(dispatch, view, tokens, shape.low_latency)
                               : check_braid_dispatch(dispatch, view, tokens);
    dispatch_slot.state = 2;
    expert();
    cuda(cudaMemsetAsync(out.get(), kOutPoison, out.bytes(), stream()), "cudaMemsetAsync");
    buffer.combine(y_of(), out.get(), !rank, stream());
    cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
    comm_.check();
    combine_slot.wrong = check_combined(out, tokens, rank ? "braid rank-major combine" : "braid combine");
    combine_slot.state = 2;
  } else {
    expert();
  }
  y = y_of();
  dispatch_slot.time_us = time_calls(dispatch, true);
  const Call combine = [&, y](cudaStream_t s) { buffer.combine(y, out.get(), !rank, s); };
  combine_slot.time_us = time_calls(combine, true);
  const Call layer = [&, y](cudaStream_t s) {
    dispatch(s);
    buffer.combine(y, out.get(), !rank, s);
  };
  layer_slot.time_us = time_calls(layer, true);
  layer_slot.state = 1;
  dispatch_slot.state = std::max(dispatch_slot.state, 1);
  combine_slot.state = std::max(combine_slot.state, 1);
  cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
  comm_.barrier();  // no rank frees its MoeBuffer while a peer may still use it
}

// ---- Timing (cuda_objects.hpp, as the collective rows) ----
double MoeBench::time_calls(const Call& call, bool graphable) {
  return bench::time_calls(comm_, stream(), call,
                           TimingPlan{options_.warmup_iters, options_.iters, options_.repeats,
                                      graphable ? options_.graph_calls : 0, options_.blocking});
}

}  // namespace braid::bench::moe
