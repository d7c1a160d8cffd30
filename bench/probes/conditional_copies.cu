// Whether an eager call could move its data with the copy engines where only the GPU learns that every peer's
// buffer is where the host guessed: a CUDA graph whose first kernel picks (cudaGraphSetConditional) between an IF
// node's body of copy-engine copies into peer memory and an else body of an SM copy kernel. GPU 0 into a VMM
// allocation on GPU 1 (as braid's imported mappings are): a plain copy, the graph taking either body, the host's
// time per launch, instantiation, and whether a launched graph's copy can be pointed elsewhere without a new
// instantiation. Each body's result is checked.
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 conditional_copies.cu -lcuda -o conditional_copies
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "probe_vmm.cuh"

namespace {

constexpr size_t kBytes = size_t(256) << 20;
constexpr int kWarmup = 3, kTimed = 10;

__global__ void fill(uint4* data, size_t count, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
    data[i] = make_uint4(uint32_t(i) ^ seed, uint32_t(i >> 32) + seed, seed, ~uint32_t(i));
  }
}

__global__ void count_mismatches(const uint4* data, size_t count, uint32_t seed, unsigned long long* wrong) {
  unsigned long long local = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = data[i];
    local += v.x != (uint32_t(i) ^ seed) || v.y != uint32_t(i >> 32) + seed || v.z != seed || v.w != ~uint32_t(i);
  }
  if (local != 0) atomicAdd(wrong, local);
}

// Sets the graph's condition from a word the host wrote (in a real call: whether every peer's words matched).
__global__ void decide(cudaGraphConditionalHandle handle, const int* choice) { cudaGraphSetConditional(handle, *choice); }

__global__ void store_copy(uint4* dst, const uint4* src, size_t count) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
    dst[i] = src[i];
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median GPU ms of `launch` on `stream` and median host us of one launch call.
template <typename Launch>
std::pair<double, double> time_it(cudaStream_t stream, Launch launch) {
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  std::vector<double> gpu, host;
  for (int i = 0; i < kWarmup + kTimed; ++i) {
    CHECK(cudaEventRecord(start, stream));
    const auto t0 = std::chrono::steady_clock::now();
    launch();
    const auto t1 = std::chrono::steady_clock::now();
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (i >= kWarmup) {
      gpu.push_back(ms);
      host.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
  }
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  return {median(gpu), median(host)};
}

unsigned long long check(const void* dst, uint32_t seed, unsigned long long* wrong, cudaStream_t stream) {
  CHECK(cudaMemsetAsync(wrong, 0, sizeof(*wrong), stream));
  count_mismatches<<<264, 512, 0, stream>>>(static_cast<const uint4*>(dst), kBytes / 16, seed, wrong);
  unsigned long long host = 0;
  CHECK(cudaMemcpyAsync(&host, wrong, sizeof(host), cudaMemcpyDeviceToHost, stream));
  CHECK(cudaStreamSynchronize(stream));
  return host;
}


// Adds to `graph` a kernel that sets a condition from `choice`, then an IF node of `bodies` (1: the body runs where
// the condition is nonzero; 2: and the second where it is zero) after it. Returns the bodies (CUDA's array).
cudaGraph_t* add_decided_if(cudaGraph_t graph, const int* choice, unsigned bodies) {
  cudaGraphConditionalHandle handle;
  CHECK(cudaGraphConditionalHandleCreate(&handle, graph, 0, 0));
  cudaGraphNode_t decide_node;
  void* args[] = {&handle, &choice};
  cudaKernelNodeParams p{};
  p.func = reinterpret_cast<void*>(decide);
  p.gridDim = dim3(1);
  p.blockDim = dim3(1);
  p.kernelParams = args;
  CHECK(cudaGraphAddKernelNode(&decide_node, graph, nullptr, 0, &p));
  cudaGraphNodeParams cond{};
  cond.type = cudaGraphNodeTypeConditional;
  cond.conditional.handle = handle;
  cond.conditional.type = cudaGraphCondTypeIf;
  cond.conditional.size = bodies;
  cudaGraphNode_t cond_node;
  CHECK(cudaGraphAddNode(&cond_node, graph, &decide_node, nullptr, 1, &cond));
  return cond.conditional.phGraph_out;
}

// A graph of `pieces` parallel copies of the whole buffer, inside an IF body (decided by `choice`) or not.
void time_copy_graph(int pieces, bool conditional, void* dst, const void* src, const int* choice,
                     unsigned long long* wrong, uint32_t seed, cudaStream_t stream) {
  cudaGraph_t graph;
  CHECK(cudaGraphCreate(&graph, 0));
  cudaGraph_t body = conditional ? add_decided_if(graph, choice, 1)[0] : graph;
  const size_t piece = kBytes / pieces;
  for (int h = 0; h < pieces; ++h) {
    cudaGraphNode_t node;
    CHECK(cudaGraphAddMemcpyNode1D(&node, body, nullptr, 0, static_cast<char*>(dst) + h * piece,
                                   static_cast<const char*>(src) + h * piece, piece, cudaMemcpyDefault));
  }
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CHECK(cudaMemsetAsync(dst, 0, kBytes, stream));
  auto [ms, host] = time_it(stream, [&] { CHECK(cudaGraphLaunch(exec, stream)); });
  std::printf("graph of %d copies%s: %.1f us, %.1f GB/s, wrong %llu\n", pieces, conditional ? " in an IF body" : "",
              ms * 1e3, kBytes / 1e9 / (ms * 1e-3), check(dst, seed, wrong, stream));
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
}

}  // namespace

int main() {
  int devices = 0;
  CHECK(cudaGetDeviceCount(&devices));
  if (devices < 2) {
    std::printf("conditional_copies: needs 2 GPUs, found %d\n", devices);
    return 77;
  }
  CHECK(cudaSetDevice(1));
  CHECK(cudaFree(nullptr));
  CHECK(cudaSetDevice(0));
  CHECK(cudaDeviceEnablePeerAccess(1, 0));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  void* src = nullptr;
  CHECK(cudaMalloc(&src, kBytes));
  void* dst = vmm_alloc(1, kBytes);
  void* dst2 = vmm_alloc(1, kBytes);
  int* choice = nullptr;
  unsigned long long* wrong = nullptr;
  CHECK(cudaMalloc(&choice, sizeof(int)));
  CHECK(cudaMalloc(&wrong, sizeof(*wrong)));
  const uint32_t seed = 0x5eed1234u;
  fill<<<264, 512, 0, stream>>>(static_cast<uint4*>(src), kBytes / 16, seed);
  CHECK(cudaStreamSynchronize(stream));
  const double gb = kBytes / 1e9;

  auto [plain_ms, plain_host] = time_it(stream, [&] { CHECK(cudaMemcpyAsync(dst, src, kBytes, cudaMemcpyDefault, stream)); });
  std::printf("plain cudaMemcpyAsync 256 MiB: %.1f us, %.1f GB/s, host %.1f us, wrong %llu\n", plain_ms * 1e3,
              gb / (plain_ms * 1e-3), plain_host, check(dst, seed, wrong, stream));

  {
    const int one = 1;
    CHECK(cudaMemcpy(choice, &one, sizeof(int), cudaMemcpyHostToDevice));
    for (int pieces : {1, 2, 4}) {
      for (bool conditional : {false, true}) time_copy_graph(pieces, conditional, dst, src, choice, wrong, seed, stream);
    }
  }
  // decide -> IF { two copies of half each } ELSE { SM copy kernel }
  cudaGraph_t graph;
  CHECK(cudaGraphCreate(&graph, 0));
  cudaGraph_t* bodies = add_decided_if(graph, choice, 2);
  cudaGraph_t copies = bodies[0], kernel_body = bodies[1];
  cudaGraphNode_t copy_nodes[2];
  const size_t half = kBytes / 2;
  for (int h = 0; h < 2; ++h) {
    cudaError_t e = cudaGraphAddMemcpyNode1D(&copy_nodes[h], copies, nullptr, 0, static_cast<char*>(dst) + h * half,
                                             static_cast<char*>(src) + h * half, half, cudaMemcpyDefault);
    if (e != cudaSuccess) {
      std::printf("memcpy node in the IF body: %s\n", cudaGetErrorString(e));
      return 1;
    }
  }
  {
    uint4* d = static_cast<uint4*>(dst);
    const uint4* s = static_cast<const uint4*>(src);
    size_t count = kBytes / 16;
    void* args[] = {&d, &s, &count};
    cudaKernelNodeParams p{};
    p.func = reinterpret_cast<void*>(store_copy);
    p.gridDim = dim3(264);
    p.blockDim = dim3(512);
    p.kernelParams = args;
    cudaGraphNode_t node;
    CHECK(cudaGraphAddKernelNode(&node, kernel_body, nullptr, 0, &p));
  }
  cudaGraphExec_t exec;
  auto t0 = std::chrono::steady_clock::now();
  cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
  auto t1 = std::chrono::steady_clock::now();
  std::printf("instantiate: %s in %.1f us\n", cudaGetErrorString(instantiated),
              std::chrono::duration<double, std::micro>(t1 - t0).count());
  if (instantiated != cudaSuccess) return 1;
  t0 = std::chrono::steady_clock::now();
  CHECK(cudaGraphUpload(exec, stream));
  t1 = std::chrono::steady_clock::now();
  std::printf("upload: %.1f us\n", std::chrono::duration<double, std::micro>(t1 - t0).count());

  for (int pick : {1, 0, 1, 0}) {
    CHECK(cudaMemcpy(choice, &pick, sizeof(int), cudaMemcpyHostToDevice));
    CHECK(cudaMemsetAsync(dst, 0, kBytes, stream));
    auto [ms, host] = time_it(stream, [&] { CHECK(cudaGraphLaunch(exec, stream)); });
    std::printf("graph, %s body: %.1f us, %.1f GB/s, host %.1f us per launch, wrong %llu\n",
                pick ? "copy-engine" : "SM kernel", ms * 1e3, gb / (ms * 1e-3), host, check(dst, seed, wrong, stream));
  }

  // Pointing the launched graph's copies at another destination without instantiating again.
  int pick = 1;
  CHECK(cudaMemcpy(choice, &pick, sizeof(int), cudaMemcpyHostToDevice));
  t0 = std::chrono::steady_clock::now();
  cudaError_t retarget = cudaSuccess;
  for (int h = 0; h < 2 && retarget == cudaSuccess; ++h) {
    retarget = cudaGraphExecMemcpyNodeSetParams1D(exec, copy_nodes[h], static_cast<char*>(dst2) + h * half,
                                                  static_cast<char*>(src) + h * half, half, cudaMemcpyDefault);
  }
  t1 = std::chrono::steady_clock::now();
  std::printf("retarget the IF body's copies: %s in %.1f us\n", cudaGetErrorString(retarget),
              std::chrono::duration<double, std::micro>(t1 - t0).count());
  if (retarget == cudaSuccess) {
    CHECK(cudaMemsetAsync(dst2, 0, kBytes, stream));
    auto [ms, host] = time_it(stream, [&] { CHECK(cudaGraphLaunch(exec, stream)); });
    std::printf("graph after retarget: %.1f us, %.1f GB/s, host %.1f us, wrong %llu\n", ms * 1e3, gb / (ms * 1e-3),
                host, check(dst2, seed, wrong, stream));
  } else {
    cudaGetLastError();
  }
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  return 0;
}
