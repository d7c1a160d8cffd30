#include "memory/vmm.hpp"

#include "core/cuda_check.hpp"
#include "core/log.hpp"

namespace braid::detail {

CUmemAllocationProp posix_fd_allocation_properties(int device) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

size_t allocation_granularity(const CUmemAllocationProp& prop) {
  size_t value = 0;
  BRAID_CU(cuMemGetAllocationGranularity, &value, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
  return value;
}

void map_for_device(CUdeviceptr address, size_t bytes, CUmemGenericAllocationHandle handle, int device) {
  BRAID_CU(cuMemMap, address, bytes, 0, handle, 0);
  CUmemAccessDesc access = {};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  BRAID_CU(cuMemSetAccess, address, bytes, &access, 1);
}

CUdeviceptr reserve_and_map(size_t bytes, size_t alignment, CUmemGenericAllocationHandle handle, int device) {
  CUdeviceptr address = 0;
  BRAID_CU(cuMemAddressReserve, &address, bytes, alignment, 0, 0);
  try {
    map_for_device(address, bytes, handle, device);
  } catch (...) {
    driver().cuMemUnmap(address, bytes);  // harmless when the map itself failed
    driver().cuMemAddressFree(address, bytes);
    throw;
  }
  return address;
}

void release_quietly(CUresult result, const char* call) {
  if (result != CUDA_SUCCESS) BRAID_WARN("{} failed with CUresult {} while releasing device memory", call, static_cast<int>(result));
}

}  // namespace braid::detail
