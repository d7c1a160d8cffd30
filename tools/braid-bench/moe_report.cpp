// What rank 0 of braid-bench --moe prints and writes: the '#' header lines, a row per (T, layout, phase) with
// NCCL's numbers beside braid's, and the --json file.
#include <cuda_runtime_api.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "moe_bench.hpp"
#include "report.hpp"

namespace braid::bench::moe {

void MoeBench::header() {
  cudaDeviceProp properties{};
  cuda(cudaGetDeviceProperties(&properties, comm_.device()), "cudaGetDeviceProperties");
  const std::string gpu = "GPU " + std::to_string(comm_.device()) + " " + properties.name + " (" +
                          comm_.peer(rank_).pci_bus_id + ")";
  gpus_ = comm_.host_allgather(gpu);
  if (rank_ != 0) return;
  std::string layouts;
  for (MoeBenchLayout layout : options_.moe_layouts) layouts += (layouts.empty() ? "" : ",") + std::string(layout_name(layout));
  std::printf("# braid-bench --moe: ranks=%d type=%s dispatch=%s H=%zu K=%d E=%d (%d per rank) alignment=%d max_sms=%d ids=int64 "
              "layouts=%s graph=%d nccl=%s\n",
              ranks_, datatype_name(options_.type), fp8() ? (std::string(datatype_name(*fp8())) + "+scales").c_str() : "type",
              options_.moe_hidden, options_.moe_top_k, options_.moe_experts,
              local_experts(), options_.moe_alignment, options_.moe_max_sms, layouts.c_str(), options_.graph_calls,
              library_ ? library_->version().c_str() : "off");
  if (const char* commit = std::getenv("BRAID_COMMIT")) std::printf("# commit %s\n", commit);
  if (library_) std::printf("# nccl library %s\n", library_->path().c_str());
  for (size_t r = 0; r < gpus_.size(); ++r) std::printf("#   rank %zu: %s\n", r, gpus_[r].c_str());
  std::printf("# routing: K distinct experts per token, uniform, weights in (0, 1], from the shared seed %llu (--seed); "
              "braid: MoeBuffer::dispatch, then\n# expert-major: MoeBuffer::combine(y = the dispatched rows, weighted); "
              "rank-major: combine(y = combine_input, holding each token's rows\n# times its weights here); nccl: routing "
              "kernel, ncclAlltoAll of the counts, counts to the host\n# (stream synchronise), gather kernel, grouped "
              "ncclSend/ncclRecv alltoallv; combine: the reverse alltoallv, weighted-sum kernel\n# layer: a dispatch "
              "then a combine, as an MoE layer calls them (bytes: both ways); dispatch and combine: each alone, back to back\n",
              static_cast<unsigned long long>(seed_));
  std::printf("# %d warm-up calls; %d repetitions of %d calls per phase%s\n", options_.warmup_iters, options_.repeats,
              options_.iters,
              options_.graph_calls > 0 ? (" (braid's phases and nccl's combine as replays of a CUDA graph of " +
                                          std::to_string(options_.graph_calls) +
                                          " calls; nccl's dispatch syncs with the host: launched)")
                                             .c_str()
                                       : "");
  std::printf("# time = per call, max over ranks of each rank's median repetition; nvlink = max over ranks of\n"
              "# max(bytes sent to, received from other ranks) / time (a token crosses once per destination rank);\n"
              "# logical = T*K*(row bytes) / time, a dispatched row %zu B, a combined row %zu B; #wrong = entries and "
              "sampled elements outside the reference, summed over ranks%s\n",
              dispatch_token_bytes(), row_bytes(), options_.check ? "" : " (N/A: -c 0)");
  if (fp8()) {
    std::printf("# fp8 dispatch: rows of %s with a float32 scale per %zu columns (moved with the row; nccl: packed "
                "after it, one alltoallv of bytes);\n# combine takes %s rows, the experts' stand-in dequantising the "
                "dispatched rows (outside the timed calls)\n",
                datatype_name(*fp8()), kMoeScaleColumns, datatype_name(options_.type));
  }
  std::printf("#\n# %6s  %-12s  %-8s  %9s  %8s  %7s  %7s  %6s", "tokens", "layout", "phase", "nvlink_MB", "time", "nvlink",
              "logical", "#wrong");
  if (library_) std::printf("  %8s  %8s  %9s  %7s  %6s", "nccl_us", "n_nvlink", "n_logical", "n_wrong", "ratio");
  std::printf("\n");
  std::printf("# %6s  %-12s  %-8s  %9s  %8s  %7s  %7s  %6s", "", "", "", "(max/rank)", "(us)", "(GB/s)", "(GB/s)", "");
  if (library_) std::printf("  %8s  %8s  %9s  %7s  %6s", "(us)", "(GB/s)", "(GB/s)", "", "b/n");
  std::printf("\n");
  std::fflush(stdout);
}

void MoeBench::finish_row(size_t tokens, const Bytes& bytes, const Slot (&slots)[kSlots]) {
  Slot total[kSlots];
  gather_slots(comm_, slots, kSlots, options_.average, total);
  for (const Slot& slot : total) wrong_total_ += slot.wrong;
  if (rank_ != 0) return;
  auto gbs = [](double bytes, double us) { return us > 0 ? bytes / (us * 1e3) : 0.0; };
  auto wrong_text = [](const Slot& s) { return s.state == 2 ? std::to_string(s.wrong) : std::string("N/A"); };
  // A layer moves the bytes of both (out and back).
  struct Phase {
    int braid;
    SlotIndex nccl;
    const char* name;
    double nvlink_bytes, logical_bytes;
  };
  const Phase phases[] = {{0, kNcclDispatch, "dispatch", bytes.dispatch_nvlink, bytes.dispatch_logical},
                          {1, kNcclCombine, "combine", bytes.combine_nvlink, bytes.combine_logical},
                          {2, kNcclLayer, "layer", bytes.dispatch_nvlink + bytes.combine_nvlink,
                           bytes.dispatch_logical + bytes.combine_logical}};
  for (MoeBenchLayout layout : options_.moe_layouts) {
    for (const Phase& phase : phases) {
      const Slot& b = total[first_slot(layout) + phase.braid];
      const Slot& n = total[phase.nccl];
      const char* name = phase.name;
      const double nvlink_bytes = phase.nvlink_bytes;
      const double logical_bytes = phase.logical_bytes;
      std::printf("  %6zu  %-12s  %-8s  %9.2f  %8.2f  %7.1f  %7.1f  %6s", tokens, layout_name(layout), name, nvlink_bytes / 1e6,
                  b.time_us, gbs(nvlink_bytes, b.time_us), gbs(logical_bytes, b.time_us), wrong_text(b).c_str());
      if (library_) {
        std::printf("  %8.2f  %8.1f  %9.1f  %7s  %6.2f", n.time_us, gbs(nvlink_bytes, n.time_us),
                    gbs(logical_bytes, n.time_us), wrong_text(n).c_str(), n.time_us > 0 ? b.time_us / n.time_us : 0.0);
      }
      std::printf("\n");
      nlohmann::json row{{"tokens", tokens},
                         {"layout", layout_name(layout)},
                         {"phase", name},
                         {"nvlink_bytes_max_per_rank", nvlink_bytes},
                         {"logical_bytes", logical_bytes}};
      auto impl = [&](const Slot& s) -> nlohmann::json {
        if (s.state == 0) return nullptr;
        nlohmann::json value{{"time_us", s.time_us},
                             {"nvlink_gbs", gbs(nvlink_bytes, s.time_us)},
                             {"logical_gbs", gbs(logical_bytes, s.time_us)}};
        value["wrong"] = s.state == 2 ? nlohmann::json(s.wrong) : nlohmann::json(nullptr);
        return value;
      };
      row["braid"] = impl(b);
      row["nccl"] = impl(n);
      row["time_ratio_braid_over_nccl"] =
          b.state != 0 && n.state != 0 && n.time_us > 0 ? nlohmann::json(b.time_us / n.time_us) : nlohmann::json(nullptr);
      rows_.push_back(std::move(row));
    }
  }
  std::fflush(stdout);
}

void MoeBench::write_json() const {
  nlohmann::json config{{"mode", "moe"},
                        {"type", datatype_name(options_.type)},
                        {"dispatch_type", datatype_name(dispatch_type())},
                        {"dispatch_scales", fp8() ? nlohmann::json(kMoeScaleColumns) : nlohmann::json(nullptr)},
                        {"hidden", options_.moe_hidden},
                        {"top_k", options_.moe_top_k},
                        {"experts", options_.moe_experts},
                        {"alignment", options_.moe_alignment},
                        {"max_sms", options_.moe_max_sms},
                        {"layouts", [&] {
                           nlohmann::json names = nlohmann::json::array();
                           for (MoeBenchLayout layout : options_.moe_layouts) names.push_back(layout_name(layout));
                           return names;
                         }()},
                        {"tokens", options_.moe_tokens},
                        {"index_type", "int64"},
                        {"ranks", ranks_},
                        {"graph", options_.graph_calls},
                        {"iters", options_.iters},
                        {"warmup_iters", options_.warmup_iters},
                        {"repeats", options_.repeats},
                        {"check", options_.check},
                        {"gpus", gpus_},
                        {"time", time_description(options_)},
                        {"average", options_.average},
                        {"blocking", options_.blocking},
                        {"nvlink", "max over ranks of max(bytes sent to, received from other ranks) / time"},
                        {"logical", "tokens * top_k * (row bytes, scales included) / time"}};
  const char* commit = std::getenv("BRAID_COMMIT");
  config["settings"] = braid_settings();
  config["commit"] = commit != nullptr ? nlohmann::json(commit) : nlohmann::json(nullptr);
  config["nccl_version"] = library_ ? nlohmann::json(library_->version()) : nlohmann::json(nullptr);
  std::ofstream file(options_.json_path);
  file << nlohmann::json{{"tool", "braid-bench"}, {"config", config}, {"rows", rows_}}.dump(2) << "\n";
  if (!file) throw std::runtime_error("cannot write --json file " + options_.json_path);
}

}  // namespace braid::bench::moe
