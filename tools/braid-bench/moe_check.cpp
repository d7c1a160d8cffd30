// braid-bench --moe's checks: with the outputs poisoned and every rank idle, one call of a phase, compared with the
// host reference (moe_data.hpp); each returns the wrong entries and tells the first on stderr.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "moe_bench.hpp"
#include "moe_kernels.hpp"

namespace braid::bench::moe {

constexpr size_t kSampledRows = 256;         // rows whose data is checked per rank and path
constexpr size_t kSampledTokens = 128;       // tokens whose combined row is checked per rank and path

// After the poisoning, with every rank idle: one dispatch, synchronised, and what check() raises thrown.
void MoeBench::dispatch_once(const Call& dispatch) {
  cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
  comm_.barrier();
  dispatch(stream());
  cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
  comm_.check();
}

// With every rank idle (a barrier first), the dispatched rows and their scales poisoned on the stream.
void MoeBench::poison_rows(const MoeDispatchOutput& view) {
  comm_.barrier();
  cuda(cudaMemsetAsync(view.x, kRowPoison, view.capacity_rows * dispatch_row_bytes(), stream()), "cudaMemsetAsync");
  if (view.scales != nullptr) {
    cuda(cudaMemsetAsync(const_cast<float*>(view.scales), kRowPoison, view.capacity_rows * scale_bytes(), stream()),
         "cudaMemsetAsync");
  }
}

// Rank-major: all views poisoned with every rank idle, one dispatch, then received_tokens, every row's source
// token, the pairs of kSampledRows rows and their data. `fixed`: low-latency rows (token t of s at row
// s * tokens + t, a hole's source token -1).
uint64_t MoeBench::check_rank_dispatch(const Call& dispatch, MoeDispatchOutput& view, size_t tokens, bool fixed) {
  const int K = options_.moe_top_k, L = local_experts();
  const uint64_t seed = mix(seed_ + tokens);
  const size_t capacity = view.capacity_rows;
  poison_rows(view);
  cuda(cudaMemsetAsync(const_cast<int32_t*>(view.source_token), kRowPoison, capacity * 4, stream()), "cudaMemsetAsync");
  cuda(cudaMemsetAsync(const_cast<int32_t*>(view.topk_expert), kRowPoison, capacity * K * 4, stream()), "cudaMemsetAsync");
  cuda(cudaMemsetAsync(const_cast<int64_t*>(view.received_tokens), kRowPoison, ranks_ * sizeof(int64_t), stream()),
       "cudaMemsetAsync");
  dispatch_once(dispatch);
  std::vector<int64_t> received(ranks_);
  std::vector<int32_t> token(capacity), experts(capacity * K);
  cuda(cudaMemcpy(received.data(), view.received_tokens, ranks_ * sizeof(int64_t), cudaMemcpyDeviceToHost), "cudaMemcpy");
  cuda(cudaMemcpy(token.data(), view.source_token, capacity * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
  cuda(cudaMemcpy(experts.data(), view.topk_expert, capacity * K * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
  uint64_t wrong = 0;
  std::string first;
  struct Row {
    int source;
    size_t token, row;
  };
  std::vector<Row> rows;
  for (int s = 0; s < ranks_; ++s) {
    size_t i = 0;
    for (size_t t = 0; t < tokens; ++t) {
      bool here = false;
      for (int k = 0; k < K; ++k) here = here || routings_[s].ids[t * K + k] / L == rank_;
      if (!here) {
        if (fixed && token[s * tokens + t] != -1 && wrong++ == 0) {
          first = "row " + std::to_string(s * tokens + t) + ": source_token " + std::to_string(token[s * tokens + t]) +
                  ", expected -1 (a hole)";
        }
        continue;
      }
      const size_t row = s * tokens + (fixed ? t : i);
      ++i;
      rows.push_back({s, t, row});
      if (token[row] != static_cast<int32_t>(t) && wrong++ == 0) {
        first = "row " + std::to_string(row) + ": source_token " + std::to_string(token[row]) + ", expected " + std::to_string(t);
      }
    }
    const size_t want = fixed ? tokens : i;
    if (received[s] != static_cast<int64_t>(want) && wrong++ == 0) {
      first = "received_tokens[" + std::to_string(s) + "] = " + std::to_string(received[s]) + ", expected " + std::to_string(want);
    }
  }
  std::vector<unsigned char> data(dispatch_row_bytes());
  std::vector<float> row_scales(scale_count());
  for (size_t n : spread(rows.size(), kSampledRows)) {
    const Row& r = rows[n];
    for (int k = 0; k < K; ++k) {
      const int64_t id = routings_[r.source].ids[r.token * K + k];
      const int32_t want = id / L == rank_ ? static_cast<int32_t>(id % L) : -1;
      if (experts[r.row * K + k] != want && wrong++ == 0) {
        first = "row " + std::to_string(r.row) + " pair " + std::to_string(k) + ": expert " + std::to_string(experts[r.row * K + k]) +
                ", expected " + std::to_string(want);
      }
    }
    cuda(cudaMemcpy(data.data(), static_cast<const unsigned char*>(view.x) + r.row * dispatch_row_bytes(), dispatch_row_bytes(),
                    cudaMemcpyDeviceToHost),
         "cudaMemcpy");
    if (fp8()) {
      cuda(cudaMemcpy(row_scales.data(), view.scales + r.row * scale_count(), scale_bytes(), cudaMemcpyDeviceToHost), "cudaMemcpy");
    }
    std::string at;
    const uint64_t bad = compare_row(data.data(), row_scales.data(), r.source, r.token, seed, at);
    if (bad > 0 && wrong == 0) first = "row " + std::to_string(r.row) + ": " + at;
    wrong += bad;
  }
  report("braid rank-major dispatch", wrong, first);
  return wrong;
}

void MoeBench::report(const std::string& what, uint64_t wrong, const std::string& first) const {
  if (wrong == 0) return;
  std::fprintf(stderr, "braid-bench: rank %d: %s: %llu wrong, first %s\n", rank_, what.c_str(),
               static_cast<unsigned long long>(wrong), first.c_str());
}

// Compares the dispatched row at `got` (hidden elements of the dispatch type) with row `token` of rank `source`,
// and with fp8 dispatch its scales at `got_scales`; returns the wrong entries.
uint64_t MoeBench::compare_row(const unsigned char* got, const float* got_scales, int source, size_t token, uint64_t seed,
                               std::string& first) const {
  const size_t H = options_.moe_hidden, element = datatype_size(dispatch_type());
  uint64_t wrong = 0;
  for (size_t c = 0; c < scale_count(); ++c) {
    const float want = moe::token_scale(seed, source, token * scale_count() + c);
    if (got_scales[c] == want) continue;
    if (wrong++ == 0 && first.empty()) {
      first = "rank " + std::to_string(source) + " token " + std::to_string(token) + " scale " + std::to_string(c) + ": expected " +
              std::to_string(want) + ", got " + std::to_string(got_scales[c]);
    }
  }
  for (size_t h = 0; h < H; ++h) {
    const uint32_t want = fp8() ? moe::token_fp8_bits(*fp8(), seed, source, token * H + h)
                                : value_bits(options_.type, moe::token_value_k(seed, source, token * H + h));
    const uint32_t have = load_bits(dispatch_type(), got + h * element);
    if (want == have) continue;
    if (wrong++ == 0 && first.empty()) {
      char text[160];
      std::snprintf(text, sizeof text, "rank %d token %zu element %zu: expected 0x%x, got 0x%x", source, token, h, want,
                    have);
      first = text;
    }
  }
  return wrong;
}

// All views poisoned with every rank idle, one dispatch, then: counts, offsets and every row's metadata in full,
// and the data of kSampledRows rows.
uint64_t MoeBench::check_braid_dispatch(const Call& dispatch, MoeDispatchOutput& view, size_t tokens) {
  const int K = options_.moe_top_k, L = local_experts();
  const uint64_t seed = mix(seed_ + tokens);
  const size_t capacity = view.capacity_rows;
  poison_rows(view);
  for (const void* p : {static_cast<const void*>(view.weights), static_cast<const void*>(view.local_expert),
                        static_cast<const void*>(view.source_rank), static_cast<const void*>(view.source_token)}) {
    cuda(cudaMemsetAsync(const_cast<void*>(p), kRowPoison, capacity * 4, stream()), "cudaMemsetAsync");
  }
  cuda(cudaMemsetAsync(const_cast<int64_t*>(view.expert_counts), kRowPoison, L * sizeof(int64_t), stream()), "cudaMemsetAsync");
  cuda(cudaMemsetAsync(const_cast<int64_t*>(view.expert_offsets), kRowPoison, (L + 1) * sizeof(int64_t), stream()),
       "cudaMemsetAsync");
  dispatch_once(dispatch);

  // The reference: rows of expert j = every (s, t, k) with id == rank * L + j, in (s, t, k) order, then padding.
  struct Row {
    int source;
    int64_t token;
    int k;
    int expert;
  };
  std::vector<Row> rows;
  std::vector<int64_t> counts(L), offsets(L + 1, 0);
  const size_t alignment = static_cast<size_t>(options_.moe_alignment);
  for (int j = 0; j < L; ++j) {
    const int64_t e = static_cast<int64_t>(rank_) * L + j;
    offsets[j] = static_cast<int64_t>(rows.size());
    for (int s = 0; s < ranks_; ++s) {
      for (size_t t = 0; t < tokens; ++t) {
        for (int k = 0; k < K; ++k) {
          if (routings_[s].ids[t * K + k] == e) rows.push_back({s, static_cast<int64_t>(t), k, j});
        }
      }
    }
    counts[j] = static_cast<int64_t>(rows.size()) - offsets[j];
    rows.resize((rows.size() + alignment - 1) / alignment * alignment, Row{-1, -1, -1, -1});
  }
  offsets[L] = static_cast<int64_t>(rows.size());

  uint64_t wrong = 0;
  std::string first;
  std::vector<int64_t> got_counts(L), got_offsets(L + 1);
  cuda(cudaMemcpy(got_counts.data(), view.expert_counts, L * sizeof(int64_t), cudaMemcpyDeviceToHost), "cudaMemcpy");
  cuda(cudaMemcpy(got_offsets.data(), view.expert_offsets, (L + 1) * sizeof(int64_t), cudaMemcpyDeviceToHost), "cudaMemcpy");
  for (int j = 0; j <= L; ++j) {
    if (j < L && got_counts[j] != counts[j]) {
      if (wrong++ == 0) first = "expert_counts[" + std::to_string(j) + "] = " + std::to_string(got_counts[j]) + ", expected " + std::to_string(counts[j]);
    }
    if (got_offsets[j] != offsets[j]) {
      if (wrong++ == 0) first = "expert_offsets[" + std::to_string(j) + "] = " + std::to_string(got_offsets[j]) + ", expected " + std::to_string(offsets[j]);
    }
  }
  if (rows.size() > capacity) {
    report("braid dispatch", wrong + 1, "needs " + std::to_string(rows.size()) + " rows, capacity " + std::to_string(capacity));
    return wrong + 1;
  }
  const size_t n = rows.size();
  std::vector<float> w(n);
  std::vector<int32_t> local(n), source(n), token(n);
  if (n > 0) {
    cuda(cudaMemcpy(w.data(), view.weights, n * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
    cuda(cudaMemcpy(local.data(), view.local_expert, n * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
    cuda(cudaMemcpy(source.data(), view.source_rank, n * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
    cuda(cudaMemcpy(token.data(), view.source_token, n * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
  }
  for (size_t i = 0; i < n; ++i) {
    const Row& r = rows[i];
    const float want_w = r.source < 0 ? 0.0f : routings_[r.source].weights[static_cast<size_t>(r.token) * K + r.k];
    const bool right = r.source < 0 ? (w[i] == 0.0f && local[i] == -1 && source[i] == -1 && token[i] == -1)
                                    : (w[i] == want_w && local[i] == r.expert && source[i] == r.source && token[i] == r.token);
    if (right) continue;
    if (wrong++ == 0) {
      char text[200];
      std::snprintf(text, sizeof text, "row %zu metadata (weight %g, expert %d, rank %d, token %d), expected (%g, %d, %d, %lld)",
                    i, static_cast<double>(w[i]), local[i], source[i], token[i], static_cast<double>(want_w), r.expert,
                    r.source, static_cast<long long>(r.token));
      first = text;
    }
  }
  std::vector<unsigned char> data(dispatch_row_bytes());
  std::vector<float> row_scales(scale_count());
  for (size_t i : spread(n, kSampledRows)) {
    const Row& r = rows[i];
    if (r.source < 0) continue;  // padding rows' data is unspecified
    cuda(cudaMemcpy(data.data(), static_cast<const unsigned char*>(view.x) + i * dispatch_row_bytes(), dispatch_row_bytes(),
                    cudaMemcpyDeviceToHost),
         "cudaMemcpy");
    if (fp8()) {
      cuda(cudaMemcpy(row_scales.data(), view.scales + i * scale_count(), scale_bytes(), cudaMemcpyDeviceToHost), "cudaMemcpy");
    }
    std::string at;
    const uint64_t bad = compare_row(data.data(), row_scales.data(), r.source, static_cast<size_t>(r.token), seed, at);
    if (bad > 0 && wrong == 0) first = "row " + std::to_string(i) + ": " + at;
    wrong += bad;
  }
  report("braid dispatch", wrong, first);
  return wrong;
}

// The NCCL baseline's received rows: the counts from each rank, and kSampledRows rows' data.
uint64_t MoeBench::check_nccl_dispatch(const NcclMoe& baseline, size_t tokens) {
  const int K = options_.moe_top_k, L = local_experts();
  const uint64_t seed = mix(seed_ + tokens);
  struct Row {
    int source;
    size_t token;
  };
  std::vector<Row> rows;
  uint64_t wrong = 0;
  std::string first;
  for (int s = 0; s < ranks_; ++s) {
    const size_t before = rows.size();
    for (size_t t = 0; t < tokens; ++t) {
      for (int k = 0; k < K; ++k) {
        if (routings_[s].ids[t * K + k] / L == rank_) {
          rows.push_back({s, t});
          break;
        }
      }
    }
    const int64_t want = static_cast<int64_t>(rows.size() - before);
    if (baseline.received_rows(s) != want && wrong++ == 0) {
      first = "rows from rank " + std::to_string(s) + ": " + std::to_string(baseline.received_rows(s)) + ", expected " +
              std::to_string(want);
    }
  }
  if (wrong == 0) {
    const size_t packed = baseline.packed_bytes();  // the row, then its scales (fp8)
    std::vector<unsigned char> data(packed);
    std::vector<float> row_scales(scale_count());
    for (size_t i : spread(rows.size(), kSampledRows)) {
      cuda(cudaMemcpy(data.data(), baseline.recv().get<unsigned char>() + i * packed, packed, cudaMemcpyDeviceToHost),
           "cudaMemcpy");
      if (fp8()) std::memcpy(row_scales.data(), data.data() + dispatch_row_bytes(), scale_bytes());
      std::string at;
      const uint64_t bad = compare_row(data.data(), row_scales.data(), rows[i].source, rows[i].token, seed, at);
      if (bad > 0 && wrong == 0) first = "received row " + std::to_string(i) + ": " + at;
      wrong += bad;
    }
  }
  report("nccl dispatch", wrong, first);
  return wrong;
}

// kSampledTokens tokens of out: x[t] * (sum of t's weights) (every expert's output is the token row itself).
uint64_t MoeBench::check_combined(const DeviceMemory& out, size_t tokens, const char* what) {
  const int K = options_.moe_top_k, L = local_experts();
  const size_t H = options_.moe_hidden, element = datatype_size(options_.type);
  const uint64_t seed = mix(seed_ + tokens);
  const Routing& mine = routings_[rank_];
  uint64_t wrong = 0;
  std::string first;
  std::vector<unsigned char> data(row_bytes());
  for (size_t t : spread(tokens, kSampledTokens)) {
    cuda(cudaMemcpy(data.data(), out.get<unsigned char>() + t * row_bytes(), row_bytes(), cudaMemcpyDeviceToHost),
         "cudaMemcpy");
    double weight = 0;
    uint64_t owners = 0;
    for (int k = 0; k < K; ++k) {
      weight += mine.weights[t * K + k];
      owners |= uint64_t(1) << (mine.ids[t * K + k] / L);
    }
    double partials = 0;
    for (int r = 0; r < ranks_; ++r) partials += (owners >> r & 1) != 0 ? 1 : 0;
    for (size_t h = 0; h < H; ++h) {
      const double x = fp8() ? static_cast<double>(moe::fp8_value(*fp8(), moe::token_fp8_bits(*fp8(), seed, rank_, t * H + h))) *
                                   moe::token_scale(seed, rank_, t * scale_count() + h / kMoeScaleColumns)
                             : moe::token_value_k(seed, rank_, t * H + h) / 128.0;
      const double want = x * weight;
      const double tolerance = tolerance_unit(options_.type) * (partials + 1) * std::fabs(want);
      const double got = decode(options_.type, data.data() + h * element);
      if (std::fabs(got - want) <= tolerance) continue;
      if (wrong++ == 0) {
        char text[160];
        std::snprintf(text, sizeof text, "token %zu element %zu: expected %.6g (tolerance %.2g), got %.6g", t, h, want,
                      tolerance, got);
        first = text;
      }
    }
  }
  report(what, wrong, first);
  return wrong;
}

}  // namespace braid::bench::moe
