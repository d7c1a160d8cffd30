// Probe: do the calls that map and unmap another process's GPU memory wait while this process's GPU runs a
// kernel that has not ended? A helper thread that maps a peer's exposed range (memory/exposure_importer.cpp)
// must not wait for its own GPU: that GPU may run a collective that waits for the very peer that waits for the
// helper's answer.
//
// Two processes (forked before any CUDA call): the exporter makes 64 MiB of cudaMalloc memory and 64 MiB of VMM
// memory with POSIX-fd handles on GPU 1 and hands over their IPC handle, its pid and the fd's number; the importer,
// on GPU 0, launches a kernel that spins for `spin_ms` on a stream of its own, and 100 ms later makes one call and
// times it on the host clock. A call that takes most of the rest of the spin waited for the GPU.
// Usage: busy_gpu_imports [spin_ms]
//
// Build: nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 bench/probes/busy_gpu_imports.cu -lcuda -o build/probes/busy_gpu_imports
#include <cuda.h>
#include <cuda_runtime.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <thread>

#include "probe_check.cuh"
#include "probe_spin.cuh"

namespace {

struct Handover {
  cudaIpcMemHandle_t ipc;
  int pid;
  int fd;
  size_t vmm_bytes;
};

void write_all(int fd, const void* data, size_t bytes) {
  if (write(fd, data, bytes) != static_cast<ssize_t>(bytes)) std::exit(2);
}
void read_all(int fd, void* data, size_t bytes) {
  if (read(fd, data, bytes) != static_cast<ssize_t>(bytes)) std::exit(2);
}

int exporter(int to_importer, int from_importer, size_t bytes) {
  CHECK(cudaSetDevice(1));
  Handover handover{};
  void* memory = nullptr;
  CHECK(cudaMalloc(&memory, bytes));
  CHECK(cudaIpcGetMemHandle(&handover.ipc, memory));
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 1;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t granularity = 0;
  CU_CHECK(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  handover.vmm_bytes = (bytes + granularity - 1) / granularity * granularity;
  CUmemGenericAllocationHandle handle;
  CU_CHECK(cuMemCreate(&handle, handover.vmm_bytes, &prop, 0));
  CU_CHECK(cuMemExportToShareableHandle(&handover.fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  handover.pid = getpid();
  write_all(to_importer, &handover, sizeof(handover));
  char done = 0;
  read_all(from_importer, &done, 1);  // the importer is finished with both
  return 0;
}

int importer(int from_exporter, int to_exporter, int spin_ms) {
  Handover handover{};
  read_all(from_exporter, &handover, sizeof(handover));
  CHECK(cudaSetDevice(0));
  cudaStream_t spinner, other;
  CHECK(cudaStreamCreateWithFlags(&spinner, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  spin<<<1, 1, 0, spinner>>>(1000);  // loaded before the first timed case
  CHECK(cudaStreamSynchronize(spinner));
  void* opened = nullptr;
  int fd = -1;
  CUmemGenericAllocationHandle imported = 0;
  CUdeviceptr mapped = 0;
  char pageable[16] = {1};
  void* target = nullptr;
  CHECK(cudaMalloc(&target, 16));

  struct Case {
    const char* name;
    std::function<void()> call;
  };
  const Case cases[] = {
      {"cudaIpcOpenMemHandle (another process's cudaMalloc)",
       [&] { CHECK(cudaIpcOpenMemHandle(&opened, handover.ipc, cudaIpcMemLazyEnablePeerAccess)); }},
      {"cudaIpcCloseMemHandle", [&] { CHECK(cudaIpcCloseMemHandle(opened)); }},
      {"pidfd_getfd + cuMemImportFromShareableHandle",
       [&] {
         const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, handover.pid, 0));
         fd = static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, handover.fd, 0));
         close(pidfd);
         if (fd < 0) std::exit(3);
         CU_CHECK(cuMemImportFromShareableHandle(&imported, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                                 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
       }},
      {"cuMemAddressReserve + cuMemMap + cuMemSetAccess",
       [&] {
         CU_CHECK(cuMemAddressReserve(&mapped, handover.vmm_bytes, 0, 0, 0));
         CU_CHECK(cuMemMap(mapped, handover.vmm_bytes, 0, imported, 0));
         CUmemAccessDesc access{};
         access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
         access.location.id = 0;
         access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
         CU_CHECK(cuMemSetAccess(mapped, handover.vmm_bytes, &access, 1));
       }},
      {"cuMemUnmap + cuMemAddressFree + cuMemRelease",
       [&] {
         CU_CHECK(cuMemUnmap(mapped, handover.vmm_bytes));
         CU_CHECK(cuMemAddressFree(mapped, handover.vmm_bytes));
         CU_CHECK(cuMemRelease(imported));
         close(fd);
       }},
      {"cudaMemcpyAsync 16 B pageable host -> device on an idle stream + sync",
       [&] {
         CHECK(cudaMemcpyAsync(target, pageable, sizeof(pageable), cudaMemcpyHostToDevice, other));
         CHECK(cudaStreamSynchronize(other));
       }},
  };
  for (const Case& c : cases) {
    spin<<<1, 1, 0, spinner>>>(static_cast<unsigned long long>(spin_ms) * 1000000ull);
    CHECK(cudaGetLastError());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const auto start = std::chrono::steady_clock::now();
    c.call();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    CHECK(cudaStreamSynchronize(spinner));
    std::printf("%-72s %9.2f ms  %s\n", c.name, ms, ms > spin_ms / 2.0 ? "WAITED for the busy GPU" : "did not wait");
  }
  const char done = 1;
  write_all(to_exporter, &done, 1);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const int spin_ms = argc > 1 ? std::atoi(argv[1]) : 2000;
  const size_t bytes = size_t(64) << 20;
  int down[2], up[2];  // exporter -> importer, importer -> exporter
  if (pipe(down) != 0 || pipe(up) != 0) return 2;
  const pid_t child = fork();  // before any CUDA call
  if (child == 0) return exporter(down[1], up[0], bytes);
  const int code = importer(down[0], up[1], spin_ms);
  int status = 0;
  waitpid(child, &status, 0);
  return code != 0 ? code : (WIFEXITED(status) ? WEXITSTATUS(status) : 1);
}
