// Probe: which host calls made for GPU 0 wait while GPU 1 runs a kernel that has not ended? With ranks as
// threads of one process, a rank whose host call waits for another GPU to go idle deadlocks against a peer
// spinning in a barrier for it (until BRAID_TIMEOUT_S ends the spin), so braid must not make such a call between
// two ranks' meeting points. Measured outside braid, with the calls braid and its tests make.
//
// One process, peer access on both ways (as braid turns it on). For each call: a kernel on GPU 1 spins for
// `spin_ms` on a non-blocking stream, and some cases queue more work for GPU 1 behind it (a copy, a kernel: from
// a thread of their own, as rank 1 would); 100 ms later another thread (rank 0) makes the call for GPU 0 and
// times it on the host clock; a call that takes most of the rest of the spin waited for GPU 1. The spin then
// ends before the next case.
// Usage: busy_peer_calls [spin_ms] [legacy]   (legacy: GPU 1 spins on its legacy default stream instead)
//
// Build: nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 bench/probes/busy_peer_calls.cu -lcuda -o build/probes/busy_peer_calls
#include <cuda.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>

#include <unistd.h>

#include "probe_check.cuh"
#include "probe_spin.cuh"

__global__ void touch(int* data) { data[threadIdx.x] += 1; }

// Loads from another GPU's memory by SMs (braid's one-sided all-to-all on same-process cudaMalloc memory).
__global__ void pull(int* destination, const int* source, size_t count) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) destination[i] = source[i];
}

// Launched once each, by the lazy-loading cases: with CUDA_MODULE_LOADING=LAZY (the default) a kernel's first
// launch in a context loads it there.
__global__ void first_launch_on_gpu1(int* data) { data[threadIdx.x] += 2; }
__global__ void first_launch_on_gpu0(int* data) { data[threadIdx.x] += 3; }

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// VMM memory on `device` with a POSIX-fd handle, as braid's export_handle sees a VmmBuffer.
struct Vmm {
  CUmemGenericAllocationHandle handle = 0;
  CUdeviceptr address = 0;
  size_t bytes = 0;
  int fd = -1;
};

CUmemAllocationProp prop_for(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

void map_for(CUdeviceptr* address, size_t bytes, CUmemGenericAllocationHandle handle, int device) {
  CU_CHECK(cuMemAddressReserve(address, bytes, 0, 0, 0));
  CU_CHECK(cuMemMap(*address, bytes, 0, handle, 0));
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CU_CHECK(cuMemSetAccess(*address, bytes, &access, 1));
}

Vmm make_vmm(int device, size_t bytes) {
  Vmm v;
  const CUmemAllocationProp prop = prop_for(device);
  size_t granularity = 0;
  CU_CHECK(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  v.bytes = (bytes + granularity - 1) / granularity * granularity;
  CU_CHECK(cuMemCreate(&v.handle, v.bytes, &prop, 0));
  map_for(&v.address, v.bytes, v.handle, device);
  CU_CHECK(cuMemExportToShareableHandle(&v.fd, v.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  const int spin_ms = argc > 1 ? std::atoi(argv[1]) : 3000;
  const bool legacy = argc > 2 && std::string(argv[2]) == "legacy";
  const size_t bytes = size_t(64) << 20;
  CU_CHECK(cuInit(0));
  for (int g = 0; g < 2; ++g) {
    CHECK(cudaSetDevice(g));
    CHECK(cudaDeviceEnablePeerAccess(1 - g, 0));
  }
  CHECK(cudaSetDevice(1));
  cudaStream_t spinner = cudaStreamLegacy;
  if (!legacy) CHECK(cudaStreamCreateWithFlags(&spinner, cudaStreamNonBlocking));
  void* on_gpu1 = nullptr;
  CHECK(cudaMalloc(&on_gpu1, bytes));
  CHECK(cudaMemset(on_gpu1, 1, bytes));
  const Vmm vmm_gpu1 = make_vmm(1, bytes);
  CHECK(cudaDeviceSynchronize());

  CHECK(cudaSetDevice(0));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  void* on_gpu0 = nullptr;
  CHECK(cudaMalloc(&on_gpu0, bytes));
  void* host = nullptr;
  CHECK(cudaMallocHost(&host, bytes));
  void* scratch = nullptr;
  Vmm imported;
  cudaStream_t created = nullptr;
  cudaEvent_t event = nullptr;

  // GPU 0's memory as GPU 1 sees it: cudaMalloc (peer access) and VMM imported and mapped for GPU 1.
  const Vmm vmm_gpu0 = make_vmm(0, bytes);
  CUdeviceptr vmm_gpu0_on_gpu1 = 0;
  {
    CHECK(cudaSetDevice(1));
    CUmemGenericAllocationHandle handle;
    CU_CHECK(cuMemImportFromShareableHandle(&handle, reinterpret_cast<void*>(static_cast<uintptr_t>(vmm_gpu0.fd)),
                                            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    map_for(&vmm_gpu0_on_gpu1, vmm_gpu0.bytes, handle, 1);
    CHECK(cudaSetDevice(0));
  }
  const size_t pulled = size_t(1) << 20;
  auto pull_cuda_malloc = [&] { CHECK(cudaMemcpyAsync(on_gpu1, on_gpu0, pulled, cudaMemcpyDefault, spinner)); };
  auto pull_vmm = [&] {
    CHECK(cudaMemcpyAsync(on_gpu1, reinterpret_cast<void*>(vmm_gpu0_on_gpu1), pulled, cudaMemcpyDefault, spinner));
  };
  auto loads_cuda_malloc = [&] {
    pull<<<8, 256, 0, spinner>>>(static_cast<int*>(on_gpu1), static_cast<const int*>(on_gpu0), pulled / 4);
    CHECK(cudaGetLastError());
  };

  struct Case {
    const char* name;
    std::function<void()> call;
    std::function<void()> behind = nullptr;  // queued for GPU 1 behind its spin first
  };
  const Case cases[] = {
      {"cudaMalloc 64 MiB", [&] { CHECK(cudaMalloc(&scratch, bytes)); }},
      {"cudaFree 64 MiB", [&] { CHECK(cudaFree(scratch)); }},
      {"cudaMalloc 4 B", [&] { CHECK(cudaMalloc(&scratch, 4)); }},
      {"cudaFree 4 B", [&] { CHECK(cudaFree(scratch)); }},
      {"cudaMemset (legacy stream)", [&] { CHECK(cudaMemset(on_gpu0, 0xA5, bytes)); }},
      {"cudaDeviceSynchronize (GPU 0)", [&] { CHECK(cudaDeviceSynchronize()); }},
      {"cudaStreamCreateWithFlags", [&] { CHECK(cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking)); }},
      {"cudaStreamDestroy", [&] { CHECK(cudaStreamDestroy(created)); }},
      {"cudaEventCreate + record + wait", [&] {
         CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
         CHECK(cudaEventRecord(event, stream));
         CHECK(cudaStreamWaitEvent(stream, event, 0));
         CHECK(cudaEventDestroy(event));
       }},
      {"kernel on GPU 0 + stream sync", [&] {
         touch<<<1, 32, 0, stream>>>(static_cast<int*>(on_gpu0));
         CHECK(cudaGetLastError());
         CHECK(cudaStreamSynchronize(stream));
       }},
      {"cudaMemcpyAsync GPU 1 -> 0 (stream) + sync", [&] {
         CHECK(cudaMemcpyAsync(on_gpu0, on_gpu1, bytes, cudaMemcpyDefault, stream));
         CHECK(cudaStreamSynchronize(stream));
       }},
      {"cudaMemcpy GPU 1 -> 0 (legacy)", [&] { CHECK(cudaMemcpy(on_gpu0, on_gpu1, bytes, cudaMemcpyDefault)); }},
      {"cudaMemcpy GPU 1 -> host (legacy)", [&] { CHECK(cudaMemcpy(host, on_gpu1, 256, cudaMemcpyDefault)); }},
      {"cudaMemcpy host -> GPU 0 (legacy)", [&] { CHECK(cudaMemcpy(on_gpu0, host, 4096, cudaMemcpyHostToDevice)); }},
      {"cudaPointerGetAttributes (GPU 1 memory)", [&] {
         cudaPointerAttributes attributes;
         CHECK(cudaPointerGetAttributes(&attributes, on_gpu1));
       }},
      {"cudaIpcGetMemHandle (GPU 0 memory)", [&] {
         cudaIpcMemHandle_t handle;
         CHECK(cudaIpcGetMemHandle(&handle, on_gpu0));
       }},
      {"cudaDeviceEnablePeerAccess (again)", [&] {
         if (cudaDeviceEnablePeerAccess(1, 0) == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
       }},
      {"VMM on GPU 0: create, map, export", [&] {
         Vmm v = make_vmm(0, bytes);
         imported.handle = v.handle;  // released by the next case
         imported.address = v.address;
         imported.bytes = v.bytes;
         close(v.fd);
       }},
      {"VMM on GPU 0: unmap, free, release", [&] {
         CU_CHECK(cuMemUnmap(imported.address, imported.bytes));
         CU_CHECK(cuMemAddressFree(imported.address, imported.bytes));
         CU_CHECK(cuMemRelease(imported.handle));
       }},
      {"import GPU 1's VMM fd, map for GPU 0", [&] {
         CU_CHECK(cuMemImportFromShareableHandle(&imported.handle, reinterpret_cast<void*>(static_cast<uintptr_t>(vmm_gpu1.fd)),
                                                 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
         imported.bytes = vmm_gpu1.bytes;
         map_for(&imported.address, imported.bytes, imported.handle, 0);
       }},
      {"copy from the mapping (stream) + sync", [&] {
         CHECK(cudaMemcpyAsync(on_gpu0, reinterpret_cast<void*>(imported.address), bytes, cudaMemcpyDefault, stream));
         CHECK(cudaStreamSynchronize(stream));
       }},
      {"unmap GPU 1's VMM from GPU 0", [&] {
         CU_CHECK(cuMemUnmap(imported.address, imported.bytes));
         CU_CHECK(cuMemAddressFree(imported.address, imported.bytes));
         CU_CHECK(cuMemRelease(imported.handle));
       }},
      {"cudaMallocHost 1 MiB", [&] { CHECK(cudaMallocHost(&scratch, 1 << 20)); }},
      {"cudaFreeHost 1 MiB", [&] { CHECK(cudaFreeHost(scratch)); }},
      {"cudaHostRegister 1 MiB", [&] {
         scratch = std::aligned_alloc(4096, 1 << 20);
         CHECK(cudaHostRegister(scratch, 1 << 20, cudaHostRegisterDefault));
       }},
      {"cudaHostUnregister 1 MiB", [&] {
         CHECK(cudaHostUnregister(scratch));
         std::free(scratch);
       }},
      // GPU 1 has more queued behind its spin.
      {"cudaDeviceSynchronize; 1 pulls 0's cudaMalloc", [&] { CHECK(cudaDeviceSynchronize()); }, pull_cuda_malloc},
      {"cudaMemset (legacy); 1 pulls 0's cudaMalloc", [&] { CHECK(cudaMemset(on_gpu0, 0xA5, 4096)); }, pull_cuda_malloc},
      {"kernel + stream sync; 1 pulls 0's cudaMalloc", [&] {
         touch<<<1, 32, 0, stream>>>(static_cast<int*>(on_gpu0));
         CHECK(cudaGetLastError());
         CHECK(cudaStreamSynchronize(stream));
       }, pull_cuda_malloc},
      {"cudaMemcpy 0 -> host; 1 pulls 0's cudaMalloc", [&] { CHECK(cudaMemcpy(host, on_gpu0, 256, cudaMemcpyDefault)); },
       pull_cuda_malloc},
      {"cudaDeviceSynchronize; 1 pulls 0's VMM", [&] { CHECK(cudaDeviceSynchronize()); }, pull_vmm},
      {"cudaDeviceSynchronize; 1 loads 0's cudaMalloc", [&] { CHECK(cudaDeviceSynchronize()); }, loads_cuda_malloc},
      {"loaded kernel + sync; 1 loads a new kernel", [&] {
         touch<<<1, 32, 0, stream>>>(static_cast<int*>(on_gpu0));
         CHECK(cudaGetLastError());
         CHECK(cudaStreamSynchronize(stream));
       }, [&] {
         first_launch_on_gpu1<<<1, 32, 0, spinner>>>(static_cast<int*>(on_gpu1));
         CHECK(cudaGetLastError());
       }},
      {"new kernel + sync; 1 loads a new kernel", [&] {
         first_launch_on_gpu0<<<1, 32, 0, stream>>>(static_cast<int*>(on_gpu0));
         CHECK(cudaGetLastError());
         CHECK(cudaStreamSynchronize(stream));
       }, [&] {
         first_launch_on_gpu1<<<1, 32, 0, spinner>>>(static_cast<int*>(on_gpu1) + 64);
         CHECK(cudaGetLastError());
       }},
  };

  std::printf("# busy_peer_calls: GPU 1 spins %d ms on %s; each call for GPU 0 starts 100 ms in\n", spin_ms,
              legacy ? "its legacy default stream" : "a non-blocking stream");
  std::printf("%-46s %10s %10s  %s\n", "call (for GPU 0); queued for GPU 1", "seconds", "behind s", "verdict");
  int waited = 0;
  for (const Case& c : cases) {
    CHECK(cudaSetDevice(1));
    spin<<<1, 1, 0, spinner>>>(static_cast<unsigned long long>(spin_ms) * 1000000ull);
    CHECK(cudaGetLastError());
    double behind_took = 0;
    std::thread rank1;
    if (c.behind) {
      rank1 = std::thread([&] {
        CHECK(cudaSetDevice(1));
        const auto start = std::chrono::steady_clock::now();
        c.behind();
        behind_took = seconds_since(start);
      });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    // Another host thread makes the call, as another rank would.
    double took = 0;
    std::thread rank0([&] {
      CHECK(cudaSetDevice(0));
      const auto start = std::chrono::steady_clock::now();
      c.call();
      took = seconds_since(start);
    });
    rank0.join();
    if (rank1.joinable()) rank1.join();
    const bool waits = took > 0.5 * (spin_ms / 1000.0 - 0.1);
    waited += waits;
    std::printf("%-46s %10.4f %10.4f  %s\n", c.name, took, behind_took, waits ? "WAITS FOR GPU 1" : "ok");
    std::fflush(stdout);
    CHECK(cudaSetDevice(1));
    CHECK(cudaStreamSynchronize(spinner));
  }
  std::printf("# %d of %zu calls waited for the busy GPU 1\n", waited, sizeof(cases) / sizeof(cases[0]));
  return 0;
}
