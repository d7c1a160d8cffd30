// CUDA driver entry points, fetched through the runtime (cudaGetDriverEntryPointByVersion), so that
// libbraid.so never links against libcuda and loads on machines without a driver.
#pragma once

#include <cuda.h>

namespace braid {

// Every driver call braid makes goes through this table.
struct DriverApi {
  decltype(&::cuGetErrorName) cuGetErrorName;
  decltype(&::cuCtxGetCurrent) cuCtxGetCurrent;
  decltype(&::cuCtxSetCurrent) cuCtxSetCurrent;
  decltype(&::cuDeviceGet) cuDeviceGet;
  decltype(&::cuDeviceGetAttribute) cuDeviceGetAttribute;
  decltype(&::cuMemGetAllocationGranularity) cuMemGetAllocationGranularity;
  decltype(&::cuMemCreate) cuMemCreate;
  decltype(&::cuMemRelease) cuMemRelease;
  decltype(&::cuMemExportToShareableHandle) cuMemExportToShareableHandle;
  decltype(&::cuMemImportFromShareableHandle) cuMemImportFromShareableHandle;
  decltype(&::cuMemAddressReserve) cuMemAddressReserve;
  decltype(&::cuMemAddressFree) cuMemAddressFree;
  decltype(&::cuMemMap) cuMemMap;
  decltype(&::cuMemUnmap) cuMemUnmap;
  decltype(&::cuMemSetAccess) cuMemSetAccess;
  decltype(&::cuMemGetAddressRange) cuMemGetAddressRange;
  decltype(&::cuMemRetainAllocationHandle) cuMemRetainAllocationHandle;
  decltype(&::cuMemGetAllocationPropertiesFromHandle) cuMemGetAllocationPropertiesFromHandle;
  decltype(&::cuPointerGetAttribute) cuPointerGetAttribute;
  // The TMA's tensor maps (CUDA 12.0+) for braid's Hopper GEMM (kernels/matmul_sm90.hpp); nullptr where missing.
  decltype(&::cuTensorMapEncodeTiled) cuTensorMapEncodeTiled;
  // Kernel preload (core/kernel_modules.hpp; CUDA 12.4+); nullptr where the driver lacks them.
  decltype(&::cuFuncGetModule) cuFuncGetModule;
  decltype(&::cuModuleGetFunctionCount) cuModuleGetFunctionCount;
  decltype(&::cuModuleEnumerateFunctions) cuModuleEnumerateFunctions;
  decltype(&::cuFuncIsLoaded) cuFuncIsLoaded;
  decltype(&::cuFuncLoad) cuFuncLoad;
  // NVLink multicast (CUDA 12.1+), reached only through memory/multicast.hpp behind BRAID_ENABLE_MULTICAST;
  // nullptr where the driver lacks them.
  decltype(&::cuMulticastGetGranularity) cuMulticastGetGranularity;
  decltype(&::cuMulticastCreate) cuMulticastCreate;
  decltype(&::cuMulticastAddDevice) cuMulticastAddDevice;
  decltype(&::cuMulticastBindAddr) cuMulticastBindAddr;
  decltype(&::cuMulticastUnbind) cuMulticastUnbind;
};

// The table, fetched on first use. Throws Error(kNoDevice) when there is no driver.
const DriverApi& driver();

// Tests replace the table with a fake (nullptr restores the real one).
void set_driver_for_testing(const DriverApi* fake);

}  // namespace braid
