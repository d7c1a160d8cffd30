// A kernel that keeps its GPU busy for a while: what the probes of calls made beside a running kernel launch.
#pragma once

#include <cuda_runtime.h>

// Spins one thread on the global timer for `nanoseconds`.
__global__ void spin(unsigned long long nanoseconds) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < nanoseconds);
}
