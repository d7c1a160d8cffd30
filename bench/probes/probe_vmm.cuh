// A VMM allocation for the probes: the kind of memory braid's symmetric allocator makes (cuMemCreate, mapped
// once in this process), readable and writable by GPUs 0 and 1.
#pragma once

#include "probe_check.cuh"

// A VMM allocation on `device`, mapped in this process and readable and writable by both GPUs.
inline void* vmm_alloc(int device, size_t bytes) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  size_t granularity = 0;
  CU_CHECK(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  const size_t size = (bytes + granularity - 1) / granularity * granularity;
  CUmemGenericAllocationHandle handle;
  CU_CHECK(cuMemCreate(&handle, size, &prop, 0));
  CUdeviceptr pointer = 0;
  CU_CHECK(cuMemAddressReserve(&pointer, size, granularity, 0, 0));
  CU_CHECK(cuMemMap(pointer, size, 0, handle, 0));
  CUmemAccessDesc access[2] = {};
  for (int g = 0; g < 2; ++g) {
    access[g].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access[g].location.id = g;
    access[g].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  CU_CHECK(cuMemSetAccess(pointer, size, access, 2));
  return reinterpret_cast<void*>(pointer);
}
