// Kernel preload (core/kernel_modules.hpp): communicator init loads every braid kernel into its GPU's context, so
// no later launch waits for a lazy load while the GPU is busy.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "braid/braid.hpp"
#include "collective_reference.hpp"
#include "core/kernel_modules.hpp"
#include "fresh_kernel.hpp"
#include "spin_kernel.hpp"
#include "world.hpp"

namespace braid::testing {
namespace {

bool preload_is_off() {
  const char* value = std::getenv("BRAID_PRELOAD_KERNELS");
  return value != nullptr && std::string(value) == "off";
}

// The longest a hold lasts when nobody releases it: a launch that waited for the held GPU takes about this long.
constexpr uint64_t kHoldNs = 3'000'000'000ull;
// A launch that returns within this did not wait for the hold.
constexpr double kPromptS = 0.5;

// Runs `launch` on the host while a kernel on another stream of the current GPU holds it busy; returns how long
// the host call took. The hold is released after the call returns, and the GPU synchronised.
template <typename Launch>
double seconds_while_gpu_busy(volatile int* released, Launch launch) {
  const StreamHandle holder;
  *released = 0;
  cuda_check(hold_until_released(holder.get(), released, kHoldNs), "hold");
  const auto start = std::chrono::steady_clock::now();
  launch();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  *released = 1;
  cuda_check(cudaDeviceSynchronize(), "synchronize");
  return seconds;
}

TEST(KernelPreload, InitLoadsEveryFunctionOfEveryModule) {
  if (preload_is_off()) GTEST_SKIP() << "BRAID_PRELOAD_KERNELS=off";
  with_communicator([](Communicator& comm) {
    const detail::KernelLoadCount count = detail::count_loaded_kernels();
    EXPECT_EQ(count.modules + count.skipped, detail::registered_kernel_modules());
    EXPECT_GE(count.modules, 20u) << "libbraid has a module per .cu file";
    EXPECT_GT(count.functions, 100u);
    EXPECT_EQ(count.loaded, count.functions) << "functions left for a lazy load after init";
    if (comm.rank() == 0) {
      std::printf("[rank 0] %zu modules (%zu for other GPUs skipped), %zu functions, %zu loaded\n", count.modules,
                  count.skipped, count.functions, count.loaded);
    }
  });
}

// Under lazy loading the first launch of a module's kernel loads the module, which waits for the busy GPU (the
// fresh test kernel, alone in its module, shows whether it does here: where it does, it waits the whole hold);
// a braid collective's first launch must not, since init loaded its kernels.
TEST(KernelPreload, FirstCollectiveLaunchDoesNotWaitForABusyGpu) {
  with_communicator([](Communicator& comm) {
    // Run alone (--gtest_filter=KernelPreload.*), nothing launched this all-reduce's kernel before: it is loaded
    // by the preload or, with BRAID_PRELOAD_KERNELS=off, by the launch timed here.
    constexpr size_t kCount = 1000;
    const std::vector<uint8_t> input(kCount, static_cast<uint8_t>(comm.rank() + 1));
    const DeviceBuffer send(kCount), recv(kCount), scratch(32 * sizeof(int));
    int* host_flag = nullptr;
    cuda_check(cudaHostAlloc(reinterpret_cast<void**>(&host_flag), sizeof(int), cudaHostAllocMapped), "cudaHostAlloc");
    const std::unique_ptr<int, cudaError_t (*)(void*)> flag_owner(host_flag, cudaFreeHost);
    volatile int* const released = host_flag;
    cuda_check(cudaMemcpy(send.get(), input.data(), kCount, cudaMemcpyHostToDevice), "copy in");
    cuda_check(cudaMemset(recv.get(), 0xA5, kCount), "poison");
    const StreamHandle stream;
    // The hold kernel itself is loaded before it is timed against.
    *released = 1;
    cuda_check(hold_until_released(stream.get(), released, kHoldNs), "hold");
    cuda_check(cudaStreamSynchronize(stream.get()), "synchronize");

    const double collective_s = seconds_while_gpu_busy(released, [&] {
      comm.all_reduce(send.get(), recv.get(), kCount, DataType::kUint8, ReduceOp::kMax, stream.get());
    });
    std::vector<uint8_t> result(kCount, 0);
    cuda_check(cudaMemcpy(result.data(), recv.get(), kCount, cudaMemcpyDeviceToHost), "copy out");
    for (size_t i = 0; i < kCount; ++i) {
      ASSERT_EQ(result[i], comm.size()) << "rank " << comm.rank() << " element " << i;
    }
    const double fresh_s = seconds_while_gpu_busy(released, [&] {
      cuda_check(launch_fresh_kernel(stream.get(), static_cast<int*>(scratch.get())), "fresh");
    });
    std::printf("[rank %d] while the GPU is held: braid's first all-reduce launch %.3f s; a fresh kernel's first launch "
                "%.3f s (preload %s)\n", comm.rank(), collective_s, fresh_s, preload_is_off() ? "off" : "on");

    if (fresh_s < kPromptS) {
      GTEST_SKIP() << "a fresh kernel's first launch did not wait for the busy GPU here (eager loading, or a driver "
                      "that loads without waiting): nothing to show";
    }
    EXPECT_LT(collective_s, kPromptS) << "rank " << comm.rank() << ": braid's launch waited for the busy GPU";
  });
}

}  // namespace
}  // namespace braid::testing
