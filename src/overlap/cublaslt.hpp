// cuBLASLt, loaded at run time with dlopen (libbraid never links it; BRAID_CUBLASLT_LIBRARY names it), and the
// row-major GEMMs the fused calls run through it. cublasLt.h gives only the types.
#pragma once

#include <cublasLt.h>  // types and declarations only: nothing here links cuBLASLt
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "braid/fused_matmul.hpp"
#include "braid/types.hpp"

namespace braid::detail {

// cuBLASLt's entry points, typed with cublasLt.h's declarations.
struct CublasLtApi {
  decltype(&::cublasLtCreate) create = nullptr;
  decltype(&::cublasLtDestroy) destroy = nullptr;
  decltype(&::cublasLtGetVersion) get_version = nullptr;
  decltype(&::cublasLtMatmulDescCreate) matmul_desc_create = nullptr;
  decltype(&::cublasLtMatmulDescDestroy) matmul_desc_destroy = nullptr;
  decltype(&::cublasLtMatmulDescSetAttribute) matmul_desc_set_attribute = nullptr;
  decltype(&::cublasLtMatrixLayoutCreate) matrix_layout_create = nullptr;
  decltype(&::cublasLtMatrixLayoutDestroy) matrix_layout_destroy = nullptr;
  decltype(&::cublasLtMatmulPreferenceCreate) preference_create = nullptr;
  decltype(&::cublasLtMatmulPreferenceDestroy) preference_destroy = nullptr;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) preference_set_attribute = nullptr;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) algo_get_heuristic = nullptr;
  decltype(&::cublasLtMatmul) matmul = nullptr;
  decltype(&::cublasLtGetStatusString) get_status_string = nullptr;  // optional
};

// The process's cuBLASLt, loaded on first use and kept until exit. kUnsupported naming every path tried where
// none loads or one lacks a required entry point.
const CublasLtApi& cublaslt();

// D[rows, n] = alpha * A[rows, k] x B + beta * C (C: null for none), every matrix dense and row-major, B [k, n]
// stored as `b_layout` says; float32 accumulation and scalars.
struct Gemm {
  DataType type;
  size_t rows, k, n;
  Layout b_layout;
  const void* a;
  const void* b;
  const void* c;
  void* d;
  float alpha = 1.0f;
  float beta = 0.0f;
  int multiprocessors = 0;  // the multiprocessors the GEMM may take (cuBLASLt's SM count target); 0: all
};

// A cuBLASLt handle, its workspace and the plans of the shapes seen (each with the candidate it runs, one of cuBLASLt's
// algorithms or braid's Hopper GEMM: NOTE [GEMM algorithm choice]), on one GPU. One thread at a time; the GEMMs it
// enqueues share the workspace, so they must run on one stream.
class GemmRunner {
 public:
  explicit GemmRunner(int device);
  ~GemmRunner();
  GemmRunner(const GemmRunner&) = delete;
  GemmRunner& operator=(const GemmRunner&) = delete;

  void run(const Gemm& gemm, cudaStream_t stream);
  // Whether braid's Hopper GEMM is among the candidates here (the device runs it and BRAID_GEMM_TUNING is on).
  bool offers_hopper_gemm() const { return hopper_gemm_available_; }

  // BRAID_GEMM_TUNING: kOff (cuBLASLt's first), kCublasLt (trials among cuBLASLt's), kWithHopperGemm (braid's
  // Hopper GEMM among the candidates too).
  enum class Tuning { kOff, kCublasLt, kWithHopperGemm };

 private:
  // type, rows, k, n, layout, has C, the alignment (bytes, up to 256) of A, B, C and D, and the multiprocessors.
  using Key = std::tuple<int, size_t, size_t, size_t, int, bool, uint32_t, uint32_t, uint32_t, uint32_t, int>;
  struct Plan;
  // One timed run of a candidate: events recorded around its GEMM, read once the second has completed.
  struct Trial {
    int candidate;
    cudaEvent_t start, end;
  };
  Plan& plan(const Key& key, const Gemm& gemm);
  cublasStatus_t launch(const Plan& plan, int candidate, const Gemm& gemm, cudaStream_t stream);
  // Reads the plan's completed trials into its samples, settling the plan once every candidate has enough.
  void collect(const Key& key, Plan& plan);
  Trial take_trial(int candidate);  // events from the pool
  void release(const Trial& trial) { idle_events_.push_back({trial.start, trial.end}); }

  const CublasLtApi& api_;
  int device_;
  const Tuning tuning_;
  bool hopper_gemm_available_ = false;  // braid's Hopper GEMM runs on this device (kernels/matmul_sm90.hpp)
  cudaError_t hopper_refusal_ = cudaSuccess;  // why its last launch failed
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::map<Key, std::unique_ptr<Plan>> plans_;
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> idle_events_;
};

}  // namespace braid::detail
