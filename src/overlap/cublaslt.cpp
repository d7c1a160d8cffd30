#include "overlap/cublaslt.hpp"

#include <dlfcn.h>

#include <mutex>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "core/cuda_check.hpp"
#include "core/device_guard.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "overlap/algorithm_trials.hpp"
#include "core/shared_library.hpp"
#include "kernels/matmul_sm90.hpp"

namespace braid::detail {
namespace {

constexpr const char* kDefaultLibrary = "libcublasLt.so.13";
// Where the nvidia-cublas wheels put it (CUDA 13's, then the older per-library layout).
constexpr const char* kPackageFolders[] = {"nvidia/cu13/lib", "nvidia/cublas/lib"};
constexpr size_t kWorkspaceBytes = size_t(32) << 20;
constexpr int kCandidates = 4;  // NOTE [GEMM algorithm choice]
constexpr size_t kSamples = 3;

// Whether `stream` is being captured (nothing is timed on it then).
bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  BRAID_CUDA(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

GemmRunner::Tuning tuning_setting() {
  const std::string value = Config::get().string("BRAID_GEMM_TUNING").value_or("on");
  if (value == "off") return GemmRunner::Tuning::kOff;
  return value == "cublaslt" ? GemmRunner::Tuning::kCublasLt : GemmRunner::Tuning::kWithHopperGemm;
}

// The GEMM as braid's Hopper kernel takes it (B transposed: [n, k]).
kernels::Sm90Matmul sm90_matmul(const Gemm& gemm) {
  kernels::Sm90Matmul m;
  m.type = gemm.type;
  m.rows = gemm.rows;
  m.k = gemm.k;
  m.n = gemm.n;
  m.a = gemm.a;
  m.b = gemm.b;
  m.c = gemm.c;
  m.d = gemm.d;
  m.alpha = gemm.alpha;
  m.beta = gemm.beta;
  m.multiprocessors = gemm.multiprocessors;
  return m;
}

CublasLtApi load_cublaslt() {
  const std::string name = Config::get().string("BRAID_CUBLASLT_LIBRARY").value_or(kDefaultLibrary);
  if (name.empty()) raise(ErrorCode::kInvalidArgument, "BRAID_CUBLASLT_LIBRARY is set but empty: name cuBLASLt's library");
  std::vector<std::string> candidates{name};
  if (name.find('/') == std::string::npos) {
    for (const char* folder : kPackageFolders) {
      for (const std::string& candidate : library_candidates(name, folder)) candidates.push_back(candidate);
    }
  }
  void* handle = nullptr;
  std::string path, tried;
  for (const std::string& candidate : candidates) {
    handle = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) {
      path = candidate;
      break;
    }
    const char* error = dlerror();
    tried += "\n  " + candidate + ": " + (error != nullptr ? error : "not loadable");
  }
  if (handle == nullptr) {
    raise(ErrorCode::kUnsupported, "cannot load cuBLASLt for the fused GEMM calls from '{}' (set BRAID_CUBLASLT_LIBRARY to "
          "its path); tried:{}", name, tried);
  }
  CublasLtApi api;
  auto required = [&](const char* symbol, auto& function) {
    if (!resolve_symbol(handle, symbol, function)) {
      raise(ErrorCode::kUnsupported, "cuBLASLt library {} lacks the required symbol {}", path, symbol);
    }
  };
  required("cublasLtCreate", api.create);
  required("cublasLtDestroy", api.destroy);
  required("cublasLtGetVersion", api.get_version);
  required("cublasLtMatmulDescCreate", api.matmul_desc_create);
  required("cublasLtMatmulDescDestroy", api.matmul_desc_destroy);
  required("cublasLtMatmulDescSetAttribute", api.matmul_desc_set_attribute);
  required("cublasLtMatrixLayoutCreate", api.matrix_layout_create);
  required("cublasLtMatrixLayoutDestroy", api.matrix_layout_destroy);
  required("cublasLtMatmulPreferenceCreate", api.preference_create);
  required("cublasLtMatmulPreferenceDestroy", api.preference_destroy);
  required("cublasLtMatmulPreferenceSetAttribute", api.preference_set_attribute);
  required("cublasLtMatmulAlgoGetHeuristic", api.algo_get_heuristic);
  required("cublasLtMatmul", api.matmul);
  resolve_symbol(handle, "cublasLtGetStatusString", api.get_status_string);
  BRAID_INFO("cuBLASLt {} loaded from {}", api.get_version(), path);
  return api;
}

[[noreturn]] void raise_cublas(const CublasLtApi& api, cublasStatus_t status, const char* call) {
  const char* text = api.get_status_string != nullptr ? api.get_status_string(status) : nullptr;
  raise(ErrorCode::kCudaError, "{} failed: {} ({})", call, text != nullptr ? text : "cuBLAS status",
        static_cast<int>(status));
}

#define BRAID_CUBLAS(api, call, ...)                                        \
  do {                                                                      \
    const cublasStatus_t braid_status_ = (api).call(__VA_ARGS__);           \
    if (braid_status_ != CUBLAS_STATUS_SUCCESS) raise_cublas((api), braid_status_, #call); \
  } while (0)

cudaDataType_t cuda_type(DataType type) { return type == DataType::kBFloat16 ? CUDA_R_16BF : CUDA_R_16F; }

// The largest power of two up to 256 that divides the address.
uint32_t alignment(const void* pointer) {
  const auto address = reinterpret_cast<uintptr_t>(pointer);
  uint32_t bytes = 256;
  while (bytes > 1 && address % bytes != 0) bytes /= 2;
  return bytes;
}

}  // namespace

const CublasLtApi& cublaslt() {
  // Loaded once; a failure is raised again to every caller.
  static std::once_flag once;
  static CublasLtApi api;
  static std::string failure;
  std::call_once(once, [] {
    try {
      api = load_cublaslt();
    } catch (const Error& error) {
      failure = error.what();
    }
  });
  if (!failure.empty()) raise(ErrorCode::kUnsupported, "{}", failure);
  return api;
}

// NOTE [row-major GEMMs through cuBLASLt]
// cuBLASLt is column-major; a row-major matrix is its transpose in column-major. So D = A x B (row-major) runs as
// D^T = B^T x A^T: cuBLASLt's first operand is B (column-major [n, k] with leading dimension n, or, for B stored
// transposed as [n, k] row-major, column-major [k, n] with leading dimension k, transposed by the op), its second
// is A (column-major [k, rows], leading dimension k), and C and D are column-major [n, rows] with leading dimension n.
// NOTE [GEMM algorithm choice]
// cuBLASLt's heuristic ranks its algorithms by a model of a GEMM alone; for the pieces the fused calls cut (half or a
// quarter of a GEMM's rows, beside the copies, some on fewer multiprocessors) another is often faster, and which one
// changes beside the copies. On one H200, bf16 (bench/probes/gemm_pieces.cu): the two 4096-row halves of 8192 x 8192 x
// 3584 took 626 us on the first candidate and 605 on the third (the whole GEMM 588); beside a device-to-device copy a
// half took 360 us on the first and 335 on the eighth. Timing candidates alone, before a call, picks by the wrong
// measure; so a plan times its candidates where they run. The candidates are cuBLASLt's first kCandidates algorithms,
// then braid's Hopper GEMM (kernels/matmul_sm90.hpp) where the GPU is a Hopper, B is transposed and the kernel takes
// the shape. A plan's first (candidates x kSamples) runs on streams not being captured cycle through them, each GEMM
// between two CUDA events; later runs read the events without waiting (those not complete yet stay for the next run)
// and take the first candidate meanwhile; the first run, captured or not, that finds every trial read keeps the
// candidate with the lowest median time for the runner's life. A run inside a capture before that takes the first
// candidate and times nothing. A candidate that cannot be launched (cuBLASLt refuses it, or braid's kernel's launch
// fails) is passed over. A trial's time starts at its event, so on a GPU idle waiting for the host it includes the
// host's launch of its GEMM (for braid's kernel, the encoding of its two tensor maps too). Ranks may settle on
// different candidates for one shape (each rank's product is its own), and a shape's runs before it settles differ
// likewise: their roundings may differ in the last bit. BRAID_GEMM_TUNING=cublaslt: cuBLASLt's candidates alone; off:
// cuBLASLt's first candidate always.
struct GemmRunner::Plan {
  const CublasLtApi& api;
  bool offers_hopper_gemm = false;  // the candidate after cuBLASLt's is braid's Hopper GEMM
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t b_layout = nullptr, a_layout = nullptr, cd_layout = nullptr;
  std::vector<cublasLtMatmulAlgo_t> candidates;  // cuBLASLt's order; the first alone where tuning is off
  AlgorithmTrials choice{1, 0};
  std::vector<Trial> trials;  // timed runs not yet read
  explicit Plan(const CublasLtApi& api) : api(api) {}
  ~Plan() {
    if (cd_layout != nullptr) api.matrix_layout_destroy(cd_layout);
    if (a_layout != nullptr) api.matrix_layout_destroy(a_layout);
    if (b_layout != nullptr) api.matrix_layout_destroy(b_layout);
    if (desc != nullptr) api.matmul_desc_destroy(desc);
  }
};

GemmRunner::GemmRunner(int device)
    : api_(cublaslt()),
      device_(device),
      tuning_(tuning_setting()) {
  DeviceGuard guard(device_);
  hopper_gemm_available_ = tuning_ == Tuning::kWithHopperGemm && kernels::sm90_matmul_available(device_);
  BRAID_CUBLAS(api_, create, &handle_);
  const cudaError_t allocated = cudaMalloc(&workspace_, kWorkspaceBytes);
  if (allocated != cudaSuccess) {
    api_.destroy(handle_);
    raise_cuda(allocated, "cudaMalloc(cuBLASLt workspace)", __FILE__, __LINE__);
  }
}

GemmRunner::~GemmRunner() {
  DeviceGuard guard(device_);
  for (auto& [key, plan] : plans_) {
    for (const Trial& trial : plan->trials) release(trial);
  }
  plans_.clear();
  for (const auto& [start, end] : idle_events_) {
    cudaEventDestroy(start);
    cudaEventDestroy(end);
  }
  cudaFree(workspace_);
  api_.destroy(handle_);
}

GemmRunner::Plan& GemmRunner::plan(const Key& key, const Gemm& gemm) {
  auto found = plans_.find(key);
  if (found != plans_.end()) return *found->second;
  const auto [type_value, rows, k, n, layout_value, has_c, align_a, align_b, align_c, align_d, multiprocessors] = key;
  const cudaDataType_t type = cuda_type(static_cast<DataType>(type_value));
  const bool transposed = static_cast<Layout>(layout_value) == Layout::kTransposed;
  auto plan = std::make_unique<Plan>(api_);
  BRAID_CUBLAS(api_, matmul_desc_create, &plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  const cublasOperation_t op_b = transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  BRAID_CUBLAS(api_, matmul_desc_set_attribute, plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_b, sizeof(op_b));
  if (multiprocessors > 0) {
    const int32_t target = multiprocessors;
    BRAID_CUBLAS(api_, matmul_desc_set_attribute, plan->desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &target,
                 sizeof(target));
  }
  if (transposed) {
    BRAID_CUBLAS(api_, matrix_layout_create, &plan->b_layout, type, k, n, static_cast<int64_t>(k));
  } else {
    BRAID_CUBLAS(api_, matrix_layout_create, &plan->b_layout, type, n, k, static_cast<int64_t>(n));
  }
  BRAID_CUBLAS(api_, matrix_layout_create, &plan->a_layout, type, k, rows, static_cast<int64_t>(k));
  BRAID_CUBLAS(api_, matrix_layout_create, &plan->cd_layout, type, n, rows, static_cast<int64_t>(n));

  cublasLtMatmulPreference_t preference = nullptr;
  BRAID_CUBLAS(api_, preference_create, &preference);
  struct PreferenceGuard {
    const CublasLtApi& api;
    cublasLtMatmulPreference_t preference;
    ~PreferenceGuard() { api.preference_destroy(preference); }
  } preference_guard{api_, preference};
  const uint64_t workspace = kWorkspaceBytes;
  BRAID_CUBLAS(api_, preference_set_attribute, preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
               sizeof(workspace));
  // cuBLASLt's first operand is B, its second A (NOTE [row-major GEMMs through cuBLASLt]).
  const uint32_t alignments[] = {align_b, align_a, align_c, align_d};
  const cublasLtMatmulPreferenceAttributes_t attributes[] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; ++i) {
    BRAID_CUBLAS(api_, preference_set_attribute, preference, attributes[i], &alignments[i], sizeof(uint32_t));
  }
  cublasLtMatmulHeuristicResult_t results[kCandidates]{};
  int found_count = 0;
  BRAID_CUBLAS(api_, algo_get_heuristic, handle_, plan->desc, plan->b_layout, plan->a_layout, plan->cd_layout,
               plan->cd_layout, preference, tuning_ != Tuning::kOff ? kCandidates : 1, results, &found_count);
  if (found_count == 0) {
    raise(ErrorCode::kUnsupported, "cuBLASLt has no algorithm for a {} GEMM of [{}, {}] x [{}, {}]{}",
          datatype_name(static_cast<DataType>(type_value)), rows, k, k, n, has_c ? " + C" : "");
  }
  for (int i = 0; i < found_count; ++i) plan->candidates.push_back(results[i].algo);
  plan->offers_hopper_gemm = hopper_gemm_available_ && transposed && kernels::sm90_matmul_supports(sm90_matmul(gemm));
  plan->choice = AlgorithmTrials(found_count + (plan->offers_hopper_gemm ? 1 : 0), kSamples);
  return *plans_.emplace(key, std::move(plan)).first->second;
}

cublasStatus_t GemmRunner::launch(const Plan& plan, int candidate, const Gemm& gemm, cudaStream_t stream) {
  if (static_cast<size_t>(candidate) == plan.candidates.size()) {  // braid's Hopper GEMM
    hopper_refusal_ = kernels::launch_sm90_matmul(sm90_matmul(gemm), stream);
    if (hopper_refusal_ == cudaSuccess) return CUBLAS_STATUS_SUCCESS;
    cudaGetLastError();  // a launch it refused leaves no error behind, as cuBLASLt's refusals leave none
    BRAID_DEBUG("braid's Hopper GEMM refused [{}, {}] x [{}, {}]: {}", gemm.rows, gemm.k, gemm.k, gemm.n,
                cudaGetErrorString(hopper_refusal_));
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  const void* c = gemm.c != nullptr ? gemm.c : gemm.d;
  const float beta = gemm.c != nullptr ? gemm.beta : 0.0f;
  return api_.matmul(handle_, plan.desc, &gemm.alpha, gemm.b, plan.b_layout, gemm.a, plan.a_layout, &beta, c,
                     plan.cd_layout, gemm.d, plan.cd_layout, &plan.candidates[candidate], workspace_,
                     kWorkspaceBytes, stream);
}

GemmRunner::Trial GemmRunner::take_trial(int candidate) {
  if (idle_events_.empty()) {
    cudaEvent_t start = nullptr, end = nullptr;
    BRAID_CUDA(cudaEventCreate(&start));
    const cudaError_t created = cudaEventCreate(&end);
    if (created != cudaSuccess) {
      cudaEventDestroy(start);
      raise_cuda(created, "cudaEventCreate", __FILE__, __LINE__);
    }
    idle_events_.push_back({start, end});
  }
  const auto [start, end] = idle_events_.back();
  idle_events_.pop_back();
  return Trial{candidate, start, end};
}

void GemmRunner::collect(const Key& key, Plan& plan) {
  // Reading an event is refused while another thread captures in global mode; this thread's reads are allowed.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  BRAID_CUDA(cudaThreadExchangeStreamCaptureMode(&mode));
  struct RestoreMode {
    cudaStreamCaptureMode mode;
    ~RestoreMode() { cudaThreadExchangeStreamCaptureMode(&mode); }
  } restore{mode};
  auto unread = plan.trials.begin();
  for (const Trial& trial : plan.trials) {
    const cudaError_t done = cudaEventQuery(trial.end);
    if (done == cudaErrorNotReady) {
      *unread++ = trial;
      continue;
    }
    if (done != cudaSuccess) raise_cuda(done, "cudaEventQuery(GEMM trial)", __FILE__, __LINE__);
    float ms = 0;
    BRAID_CUDA(cudaEventElapsedTime(&ms, trial.start, trial.end));
    plan.choice.finished(trial.candidate, ms * 1e-3f);
    release(trial);
  }
  plan.trials.erase(unread, plan.trials.end());
  if (!plan.choice.settle()) return;
  BRAID_DEBUG("GEMM [{}, {}] x [{}, {}]{} on {} multiprocessors: candidates' median us {}{}; keeps #{}",
              std::get<1>(key), std::get<2>(key), std::get<2>(key), std::get<3>(key), std::get<5>(key) ? " + C" : "",
              std::get<10>(key) == 0 ? std::string("all") : std::to_string(std::get<10>(key)),
              plan.choice.medians_us(), plan.offers_hopper_gemm ? " (the last is braid's Hopper GEMM)" : "",
              plan.choice.chosen());
}

void GemmRunner::run(const Gemm& gemm, cudaStream_t stream) {
  if (gemm.rows == 0 || gemm.n == 0) return;
  const void* c = gemm.c != nullptr ? gemm.c : gemm.d;
  const Key key{static_cast<int>(gemm.type), gemm.rows, gemm.k, gemm.n, static_cast<int>(gemm.b_layout),
                gemm.c != nullptr, alignment(gemm.a), alignment(gemm.b), alignment(c), alignment(gemm.d),
                gemm.multiprocessors};
  Plan& chosen = plan(key, gemm);
  if (!chosen.choice.settled()) {  // NOTE [GEMM algorithm choice]
    collect(key, chosen);
    const int candidate = capturing(stream) ? -1 : chosen.choice.next();
    if (candidate >= 0) {
      const Trial trial = take_trial(candidate);
      BRAID_CUDA(cudaEventRecord(trial.start, stream));
      const cublasStatus_t launched = launch(chosen, candidate, gemm, stream);
      if (launched == CUBLAS_STATUS_SUCCESS) {
        BRAID_CUDA(cudaEventRecord(trial.end, stream));
        chosen.trials.push_back(trial);
        chosen.choice.started(candidate);
        return;
      }
      release(trial);
      if (candidate == 0) raise_cublas(api_, launched, "matmul");
      chosen.choice.refused(candidate);  // this run takes the first
    }
  }
  const int candidate = chosen.choice.chosen();
  const cublasStatus_t launched = launch(chosen, candidate, gemm, stream);
  if (launched == CUBLAS_STATUS_SUCCESS) return;
  if (static_cast<size_t>(candidate) == chosen.candidates.size()) {
    raise_cuda(hopper_refusal_, "launch of braid's Hopper GEMM", __FILE__, __LINE__);
  }
  raise_cublas(api_, launched, "matmul");
}

}  // namespace braid::detail
