// Programmatic dependent launch across a kernel of the caller's (braid.hpp, "Ordering"): braid's kernels are
// programmatic dependent launches that let the next kernel on the stream start early. A user kernel U launched
// with programmatic stream serialization right after a braid call X1, that never calls
// cudaGridDependencySynchronize() and ends long before X1, must still leave the next braid call X2 after X1: X2's
// kernels wait at their start for the kernel before them (U), and U counts as complete only once X1 has (the
// chain is transitive). On every rank, 5 times for each buffer kind and size:
//   [rank i % world: a 50 ms spin] X1 = all_reduce(a -> b), U, X2 = all_reduce(b -> c), N
// U and N record %globaltimer; N is an ordinary launch. With fresh random int32 inputs (never 0) and b and c
// poisoned first, c must be exactly world * sum over ranks of a: X2 reads X1's output, so an X2 that started
// before X1 finished reads poison or a partial sum. The late rank keeps X1 waiting on the others for about 50 ms,
// and there N - U (the time from U to the end of X2) must show that U ran while X1 waited, or the test proved
// nothing; with one rank there is no late rank, and only the result is checked.
//
// U and N come from PTX compiled at run time (cudaLibraryLoadData), so this file needs no CUDA compiler.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "braid/braid.hpp"
#include "collective_reference.hpp"  // DeviceBuffer, StreamHandle, mix64, shared_seed, kPoison, cuda_check
#include "spin_kernel.hpp"
#include "test_helpers.hpp"  // input_key, random_bits
#include "world.hpp"

namespace braid::testing {
namespace {

// record_time(uint64_t* out): *out = %globaltimer. No griddepcontrol.wait (cudaGridDependencySynchronize).
constexpr char kRecordTimePtx[] = R"(
.version 7.0
.target sm_70
.address_size 64

.visible .entry record_time(.param .u64 out)
{
  .reg .b64 %rd<4>;
  ld.param.u64 %rd1, [out];
  cvta.to.global.u64 %rd2, %rd1;
  mov.u64 %rd3, %globaltimer;
  st.global.u64 [%rd2], %rd3;
  ret;
}
)";

class TimeRecorder {
 public:
  TimeRecorder() {
    cuda_check(cudaLibraryLoadData(&library_, kRecordTimePtx, nullptr, nullptr, 0, nullptr, nullptr, 0),
               "cudaLibraryLoadData (record_time PTX)");
    cuda_check(cudaLibraryGetKernel(&kernel_, library_, "record_time"), "cudaLibraryGetKernel (record_time)");
  }
  ~TimeRecorder() { cudaLibraryUnload(library_); }
  TimeRecorder(const TimeRecorder&) = delete;
  TimeRecorder& operator=(const TimeRecorder&) = delete;

  // One thread stores %globaltimer at `out`; `dependent`: launched with programmatic stream serialization.
  void launch(uint64_t* out, bool dependent, cudaStream_t stream) const {
    cudaLaunchAttribute attribute{};
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(1);
    config.blockDim = dim3(1);
    config.stream = stream;
    config.attrs = dependent ? &attribute : nullptr;
    config.numAttrs = dependent ? 1 : 0;
    void* args[] = {&out};
    cuda_check(cudaLaunchKernelExC(&config, reinterpret_cast<const void*>(kernel_), args), "record_time launch");
  }

 private:
  cudaLibrary_t library_ = nullptr;
  cudaKernel_t kernel_ = nullptr;
};

// Element i of `rank`'s input: in [1, 2^20], so world * world of them fit an int32.
int32_t input_value(uint64_t seed, int rank, size_t i) {
  return static_cast<int32_t>(1 + random_bits(input_key(seed, rank), i) % (uint64_t(1) << 20));
}

constexpr uint32_t kLateNs = 50'000'000;  // the late rank's spin before X1
constexpr int kRepeats = 5;

TEST(DependentLaunch, UserKernelWithoutGridSyncKeepsTheNextCallAfterTheCallBefore) {
  for_each_rank([](const RankContext& context) {
    Communicator comm = Communicator::init(context.rendezvous, test_options());
    make_current(comm);
    const int rank = comm.rank(), world = comm.size();
    const TimeRecorder recorder;
    StreamHandle stream_handle;
    const cudaStream_t stream = stream_handle.get();
    DeviceBuffer times(2 * sizeof(uint64_t));
    uint64_t* time_u = static_cast<uint64_t*>(times.get());
    uint64_t* time_n = time_u + 1;
    // An LL-sized call and one that runs the bulk kernels; buffers of cudaMalloc (staged) and symmetric memory
    // (zero copy, X2 reading the peers' b in place).
    for (const size_t count : {size_t(1000), size_t(2) << 20}) {
      const size_t bytes = count * sizeof(int32_t);
      DeviceBuffer device_a(bytes), device_b(bytes), device_c(bytes);
      SymmetricMemory symmetric = comm.alloc(3 * bytes);
      for (const bool in_symmetric : {false, true}) {
        char* base = static_cast<char*>(symmetric.local());
        void* a = in_symmetric ? base : device_a.get();
        void* b = in_symmetric ? base + bytes : device_b.get();
        void* c = in_symmetric ? base + 2 * bytes : device_c.get();
        const std::string what = std::to_string(count) + " int32 in " + (in_symmetric ? "symmetric memory" : "cudaMalloc memory");
        int late_runs = 0, overlapped = 0;
        for (int repeat = 0; repeat < kRepeats; ++repeat) {
          const uint64_t seed = shared_seed(comm);
          const int late = repeat % world;
          std::vector<int32_t> input(count), expected(count), got(count);
          for (size_t i = 0; i < count; ++i) {
            int32_t sum = 0;
            for (int r = 0; r < world; ++r) sum += input_value(seed, r, i);
            input[i] = input_value(seed, rank, i);
            expected[i] = sum * world;
          }
          cuda_check(cudaMemcpyAsync(a, input.data(), bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync (a)");
          cuda_check(cudaMemsetAsync(b, kPoison, bytes, stream), "cudaMemsetAsync (b)");
          cuda_check(cudaMemsetAsync(c, kPoison, bytes, stream), "cudaMemsetAsync (c)");
          cuda_check(cudaMemsetAsync(times.get(), 0, times.bytes(), stream), "cudaMemsetAsync (times)");
          cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (inputs)");
          comm.barrier();  // every rank's b poisoned before any X1 starts
          if (world > 1 && rank == late) cuda_check(spin_on_stream(stream, kLateNs), "spin_on_stream");
          comm.all_reduce(a, b, count, DataType::kInt32, ReduceOp::kSum, stream);
          recorder.launch(time_u, true, stream);
          comm.all_reduce(b, c, count, DataType::kInt32, ReduceOp::kSum, stream);
          recorder.launch(time_n, false, stream);
          cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (X1, U, X2, N)");
          comm.check();
          cuda_check(cudaMemcpy(got.data(), c, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy (c)");
          uint64_t recorded[2] = {0, 0};
          cuda_check(cudaMemcpy(recorded, times.get(), sizeof recorded, cudaMemcpyDeviceToHost), "cudaMemcpy (times)");
          size_t wrong = 0, first = 0;
          for (size_t i = count; i-- > 0;) {
            if (got[i] != expected[i]) {
              ++wrong;
              first = i;
            }
          }
          EXPECT_EQ(wrong, 0u) << "rank " << rank << ", " << what << ", repeat " << repeat << " (rank " << late
                               << " late): " << wrong << " element(s) of X2's output wrong, first [" << first
                               << "]: expected " << expected[first] << ", got " << got[first]
                               << " (X2 read X1's output before X1 finished)";
          EXPECT_NE(recorded[0], 0u) << "rank " << rank << ": U did not run";
          const double gap_ms = (static_cast<double>(recorded[1]) - static_cast<double>(recorded[0])) * 1e-6;
          if (world > 1 && rank != late) {
            ++late_runs;
            if (gap_ms >= kLateNs * 1e-6 / 2) ++overlapped;
          }
          if (rank == 0) {
            std::printf("[dependent launch] %s, repeat %d, rank %d late: U to the end of X2 %.3f ms\n", what.c_str(),
                        repeat, world > 1 ? late : -1, gap_ms);
          }
        }
        if (late_runs > 0) {
          EXPECT_GT(overlapped, 0) << "rank " << rank << ", " << what << ": in none of " << late_runs
                                   << " runs with a late peer did U run while X1 waited for it (U to the end of X2 "
                                      "under "
                                   << kLateNs * 1e-6 / 2 << " ms): U never overlapped X1, so the test proved nothing";
        }
      }
      comm.barrier();  // no rank frees its buffers while a peer's call may still read them
    }
  });
}

}  // namespace
}  // namespace braid::testing
