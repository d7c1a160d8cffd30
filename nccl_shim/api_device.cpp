// NCCL's device API entry points (nccl_device/core.h): device communicators for users' kernels are the real NCCL's,
// made on the real NCCL's communicator beside braid's. PyTorch imports these two, so the shim must export them.
// Declared here with untyped pointers rather than by including nccl_device/core.h, which needs the CUDA compiler;
// every argument is a pointer, so the ABI is the same.
#include <nccl.h>

#include "core/error.hpp"
#include "shim.hpp"
#include "shim_exports.hpp"

using namespace braid::shim;

namespace {

// The real NCCL's entry point `name` as a `Function`, or kUnsupported.
template <typename Function>
Function real_entry(const ncclComm& comm, const char* name) {
  void* entry = require_real(comm, name).symbol(name);
  if (entry == nullptr) braid::raise(braid::ErrorCode::kUnsupported, "the real NCCL has no {}", name);
  return reinterpret_cast<Function>(entry);
}

}  // namespace

extern "C" {

SHIM_EXPORT ncclResult_t ncclDevCommCreate(ncclComm_t comm, const void* requirements, void* outDevComm) {
  SHIM_FORWARD_FOREIGN(comm, ncclDevCommCreate, comm, requirements, outDevComm);
  return guarded("ncclDevCommCreate", [&] {
    const ncclComm& shim = checked_comm(comm, "ncclDevCommCreate");
    using Create = ncclResult_t (*)(ncclComm_t, const void*, void*);
    auto create = real_entry<Create>(shim, "ncclDevCommCreate");
    check_real(shim, create(shim.real, requirements, outDevComm), "ncclDevCommCreate");
  });
}

SHIM_EXPORT ncclResult_t ncclDevCommDestroy(ncclComm_t comm, const void* devComm) {
  SHIM_FORWARD_FOREIGN(comm, ncclDevCommDestroy, comm, devComm);
  return guarded("ncclDevCommDestroy", [&] {
    const ncclComm& shim = checked_comm(comm, "ncclDevCommDestroy");
    using Destroy = ncclResult_t (*)(ncclComm_t, const void*);
    auto destroy = real_entry<Destroy>(shim, "ncclDevCommDestroy");
    check_real(shim, destroy(shim.real, devComm), "ncclDevCommDestroy");
  });
}

}  // extern "C"

SHIM_ALIAS(ncclDevCommCreate)
SHIM_ALIAS(ncclDevCommDestroy)
