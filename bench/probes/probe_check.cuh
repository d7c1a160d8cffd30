// What the probes share: CHECK (runtime calls) and CU_CHECK (driver calls), which end the probe with the
// failing call, file and line, elapsed_ms (event timing), and a GPU's streams and events of a timed schedule
// (ScheduleStreams, make_untimed_events).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CHECK(call)                                                                                 \
  do {                                                                                              \
    cudaError_t err_ = (call);                                                                      \
    if (err_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
      std::exit(1);                                                                                 \
    }                                                                                               \
  } while (0)

#define CU_CHECK(call)                                                                               \
  do {                                                                                               \
    CUresult result_ = (call);                                                                       \
    if (result_ != CUDA_SUCCESS) {                                                                   \
      std::fprintf(stderr, "%s:%d %s: CUresult %d\n", __FILE__, __LINE__, #call, static_cast<int>(result_)); \
      std::exit(1);                                                                                  \
    }                                                                                                \
  } while (0)

// Milliseconds between two events recorded on `device`, once the second has completed.
inline float elapsed_ms(int device, cudaEvent_t start, cudaEvent_t stop) {
  CHECK(cudaSetDevice(device));
  CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, start, stop));
  return ms;
}

// Events that only order work (no timing), made on the current device.
inline void make_untimed_events(cudaEvent_t* events, int count) {
  for (int i = 0; i < count; ++i) CHECK(cudaEventCreateWithFlags(&events[i], cudaEventDisableTiming));
}

// A GPU's streams for a schedule of copies and kernels (s0 its main one), the events that time it (start, stop,
// on s0), and those that fork the side streams from s0 and join them back.
struct ScheduleStreams {
  cudaStream_t s0, s1, s2;
  cudaEvent_t start, stop, fork, join;
  // Makes them on the current device.
  void make() {
    for (cudaStream_t* s : {&s0, &s1, &s2}) CHECK(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking));
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    make_untimed_events(&fork, 1);
    make_untimed_events(&join, 1);
  }
};
