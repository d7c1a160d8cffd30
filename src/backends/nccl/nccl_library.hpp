// NCCL, loaded at run time with dlopen: braid never links it, so every binary starts on a machine without it and
// the library used is whichever the user names (BRAID_NCCL_LIBRARY). nccl.h gives only the types: every function
// is resolved with dlsym into NcclApi. Also the one place where braid's datatypes, operators and error codes map
// to NCCL's and back.
#pragma once

#include <nccl.h>  // types and declarations only: nothing here links NCCL

#include <memory>
#include <string>

#include "braid/error.hpp"
#include "braid/types.hpp"

namespace braid::detail {

// NCCL's entry points, typed with nccl.h's own declarations. Optional ones are null where the library lacks them.
struct NcclApi {
  // Required.
  decltype(&::ncclGetVersion) get_version = nullptr;
  decltype(&::ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&::ncclCommInitRank) comm_init_rank = nullptr;               // one of these two is required
  decltype(&::ncclCommInitRankConfig) comm_init_rank_config = nullptr;  // (ncclCommInitRank preferred)
  decltype(&::ncclCommDestroy) comm_destroy = nullptr;
  decltype(&::ncclCommAbort) comm_abort = nullptr;
  decltype(&::ncclCommGetAsyncError) comm_get_async_error = nullptr;
  decltype(&::ncclGetErrorString) get_error_string = nullptr;
  decltype(&::ncclGroupStart) group_start = nullptr;
  decltype(&::ncclGroupEnd) group_end = nullptr;
  decltype(&::ncclAllReduce) all_reduce = nullptr;
  decltype(&::ncclReduce) reduce = nullptr;
  decltype(&::ncclReduceScatter) reduce_scatter = nullptr;
  decltype(&::ncclAllGather) all_gather = nullptr;
  decltype(&::ncclBroadcast) broadcast = nullptr;
  // Optional.
  decltype(&::ncclSend) send = nullptr;  // NCCL 2.7+
  decltype(&::ncclRecv) recv = nullptr;
  // Typed by hand rather than with decltype so that an nccl.h older than ncclAlltoAll (2.28) still compiles.
  using AllToAll = ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
  AllToAll all_to_all = nullptr;
  decltype(&::ncclCommRegister) comm_register = nullptr;  // NCCL 2.19+
  decltype(&::ncclCommDeregister) comm_deregister = nullptr;
  decltype(&::ncclGetLastError) get_last_error = nullptr;  // NCCL 2.13+
  // Optional, for the NCCL shim (nccl_shim/), which forwards what braid does not serve.
  decltype(&::ncclCommFinalize) comm_finalize = nullptr;
  decltype(&::ncclCommSplit) comm_split = nullptr;
  decltype(&::ncclCommCount) comm_count = nullptr;
  decltype(&::ncclCommCuDevice) comm_cu_device = nullptr;
  decltype(&::ncclCommUserRank) comm_user_rank = nullptr;
  decltype(&::ncclMemAlloc) mem_alloc = nullptr;
  decltype(&::ncclMemFree) mem_free = nullptr;
  decltype(&::ncclCommWindowRegister) window_register = nullptr;
  decltype(&::ncclCommWindowDeregister) window_deregister = nullptr;
  decltype(&::ncclRedOpCreatePreMulSum) red_op_create_pre_mul_sum = nullptr;
  decltype(&::ncclRedOpDestroy) red_op_destroy = nullptr;
  decltype(&::ncclGather) gather = nullptr;
  decltype(&::ncclScatter) scatter = nullptr;
};

// Exported by braid's NCCL shim (a libnccl.so.2 on top of braid): NcclLibrary::load refuses a library that has it,
// so the shim never loads itself (or another copy of itself) as "the real NCCL".
inline constexpr const char* kNcclShimMarkerSymbol = "braid_nccl_shim_marker";

class NcclLibrary {
 public:
  // Loads NCCL and resolves its entry points. path empty: BRAID_NCCL_LIBRARY (default libnccl.so.2). A bare name
  // the loader does not find is also looked for in the CUDA toolkit's lib folders and in python3's site-packages
  // (nvidia/nccl/lib, where the nvidia-nccl wheels put it). Throws kUnsupported naming every path tried with its
  // dlerror(), or the missing required symbol. Also sets NCCL_NVLS_ENABLE=0 where the environment does not set
  // it: NCCL would otherwise create NVLink multicast objects, which braid never does unless asked (BRAID_ENABLE_MULTICAST).
  // A bare name is first looked for as the dynamic loader would, then in every LD_LIBRARY_PATH folder, then in
  // the folders above; a library exporting kNcclShimMarkerSymbol is passed over. Where the shim is loaded in this
  // process, NCCL is opened with RTLD_DEEPBIND, so NCCL's calls to its own exported functions stay inside it
  // rather than binding to the shim's.
  static std::shared_ptr<NcclLibrary> load(const std::string& path = {});
  ~NcclLibrary();  // never dlclose: NCCL's threads and atexit handlers may still point into the library
  NcclLibrary(const NcclLibrary&) = delete;
  NcclLibrary& operator=(const NcclLibrary&) = delete;

  int version_code() const { return version_code_; }  // NCCL_VERSION_CODE of the loaded library, e.g. 22809
  std::string version() const;                          // "2.28.9"
  const std::string& path() const { return path_; }     // the path dlopen took
  const NcclApi& api() const { return api_; }
  // Any other entry point by name (dlsym); null where the library lacks it.
  void* symbol(const char* name) const;

  bool has_all_to_all() const { return api_.all_to_all != nullptr; }
  bool has_send_recv() const { return api_.send != nullptr && api_.recv != nullptr; }
  // ncclCommRegister and ncclCommDeregister exported, and NCCL 2.19 or later.
  bool has_register() const;

  // "ncclAllReduce failed: <ncclGetErrorString> (<ncclGetLastError>) on rank R": the message of a failed call.
  // comm may be null. rank: as shown in the message.
  std::string failure_message(ncclResult_t result, const char* call, ncclComm_t comm, const std::string& rank) const;
  // Throws braid::Error (the result's mapped code) with failure_message.
  [[noreturn]] void raise_error(ncclResult_t result, const char* call, ncclComm_t comm, const std::string& rank) const;
  // raise_error() unless result is ncclSuccess.
  void check(ncclResult_t result, const char* call, ncclComm_t comm, const std::string& rank) const {
    if (result != ncclSuccess) raise_error(result, call, comm, rank);
  }

 private:
  NcclLibrary() = default;
  void* handle_ = nullptr;
  std::string path_;
  int version_code_ = 0;
  NcclApi api_;
};

// A version code as ncclGetVersion gives it (NCCL_VERSION's numbering, which changed at 2.9) in words:
// 22809 -> "2.28.9", 2708 -> "2.7.8".
std::string nccl_version_text(int version_code);

// The mapping tables. Values outside braid's enums throw kInvalidArgument naming the argument.
ncclDataType_t to_nccl(DataType type);
ncclRedOp_t to_nccl(ReduceOp op);  // kAvg -> ncclAvg
// ncclInvalidArgument/ncclInvalidUsage -> kInvalidArgument, ncclUnhandledCudaError -> kCudaError,
// ncclSystemError -> kSystemError, ncclRemoteError -> kRemoteError, ncclInternalError -> kInternal,
// ncclSuccess -> kSuccess; ncclInProgress (never expected: braid's communicators block) and unknown -> kInternal.
ErrorCode nccl_error_code(ncclResult_t result);
const char* nccl_result_name(ncclResult_t result);  // "ncclInvalidUsage"; "unknown ncclResult_t" outside the enum
// The other way, for the NCCL shim: braid's errors as the ncclResult_t a program written for NCCL expects.
// kInvalidArgument -> ncclInvalidArgument; kMismatch, kUnsupported -> ncclInvalidUsage; kCudaError, kDriverError,
// kNoDevice -> ncclUnhandledCudaError; kSystemError, kPeerUnreachable -> ncclSystemError; kTimeout, kRemoteError ->
// ncclRemoteError (a peer did not arrive or went away); kRevoked -> ncclRemoteError; kAborted -> ncclInvalidUsage
// (a call on an aborted communicator); kInternal -> ncclInternalError.
ncclResult_t to_nccl_result(ErrorCode code);
// NCCL's datatypes and operators as braid's: false where braid has no such datatype (braid has each of NCCL's,
// the two fp8 ones included, so only a value out of range) or operator (PreMulSum, operators made by
// ncclRedOpCreatePreMulSum, out of range).
bool from_nccl(ncclDataType_t type, DataType* out);
bool from_nccl(ncclRedOp_t op, ReduceOp* out);

}  // namespace braid::detail
