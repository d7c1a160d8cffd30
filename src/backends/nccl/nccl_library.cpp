#include "backends/nccl/nccl_library.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "core/config.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/shared_library.hpp"

namespace braid::detail {
namespace {

constexpr const char* kDefaultLibrary = "libnccl.so.2";
constexpr const char* kNcclPackageFolder = "nvidia/nccl/lib";  // where the nvidia-nccl-cu* wheels put NCCL

// NCCL reads NCCL_NVLS_ENABLE at communicator init; set once, before any NCCL of this process is loaded by braid.
void keep_nvlink_multicast_off() {
  static std::once_flag once;
  std::call_once(once, [] { setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0); });
}

}  // namespace

std::shared_ptr<NcclLibrary> NcclLibrary::load(const std::string& path) {
  keep_nvlink_multicast_off();
  const bool from_config = path.empty();
  const std::string name =
      from_config ? Config::get().string("BRAID_NCCL_LIBRARY").value_or(kDefaultLibrary) : path;
  if (name.empty()) raise(ErrorCode::kInvalidArgument, "BRAID_NCCL_LIBRARY is set but empty: name NCCL's library");

  std::shared_ptr<NcclLibrary> library(new NcclLibrary());
  std::string tried;
  // With the shim in this process, NCCL's own calls to its exported names must not bind to the shim's.
  const bool shim_loaded = dlsym(RTLD_DEFAULT, kNcclShimMarkerSymbol) != nullptr;
  const int flags = RTLD_NOW | RTLD_LOCAL | (shim_loaded ? RTLD_DEEPBIND : 0);
  auto attempt = [&](const std::string& candidate) {
    void* handle = dlopen(candidate.c_str(), flags);
    if (handle != nullptr && dlsym(handle, kNcclShimMarkerSymbol) != nullptr) {
      dlclose(handle);
      tried += "\n  " + candidate + ": is braid's NCCL shim, not NCCL";
      return false;
    }
    if (handle != nullptr) {
      library->handle_ = handle;
      library->path_ = candidate;
      return true;
    }
    const char* error = dlerror();
    const std::string text = error != nullptr ? error : "not loadable";
    tried += "\n  " + (text.find(candidate) == std::string::npos ? candidate + ": " + text : text);
    return false;
  };
  bool loaded = attempt(name);
  const bool bare = name.find('/') == std::string::npos;
  if (!loaded && bare) {
    for (const std::string& candidate : library_candidates(name, kNcclPackageFolder)) {
      if ((loaded = attempt(candidate))) break;
    }
  }
  if (!loaded) {
    std::string searched;
    if (bare) {
      searched = fmt::format("\n  (also looked for {} in LD_LIBRARY_PATH, {} and {})", name, fmt::join(cuda_library_folders(), ", "),
                             "python3's site-packages (nvidia/nccl/lib)");
    }
    raise(ErrorCode::kUnsupported, "cannot load NCCL from '{}'{}; tried:{}{}", name,
          from_config ? " (set BRAID_NCCL_LIBRARY to its path)" : "", tried, searched);
  }

  NcclApi& api = library->api_;
  void* handle = library->handle_;
  auto required = [&](const char* symbol, auto& function) {
    if (!resolve_symbol(handle, symbol, function)) {
      raise(ErrorCode::kUnsupported, "NCCL library {} lacks the required symbol {}", library->path_, symbol);
    }
  };
  required("ncclGetVersion", api.get_version);
  required("ncclGetUniqueId", api.get_unique_id);
  resolve_symbol(handle, "ncclCommInitRank", api.comm_init_rank);
  resolve_symbol(handle, "ncclCommInitRankConfig", api.comm_init_rank_config);
  if (api.comm_init_rank == nullptr && api.comm_init_rank_config == nullptr) {
    raise(ErrorCode::kUnsupported, "NCCL library {} lacks the required symbol ncclCommInitRank (nor has it "
          "ncclCommInitRankConfig)", library->path_);
  }
  required("ncclCommDestroy", api.comm_destroy);
  required("ncclCommAbort", api.comm_abort);
  required("ncclCommGetAsyncError", api.comm_get_async_error);
  required("ncclGetErrorString", api.get_error_string);
  required("ncclGroupStart", api.group_start);
  required("ncclGroupEnd", api.group_end);
  required("ncclAllReduce", api.all_reduce);
  required("ncclReduce", api.reduce);
  required("ncclReduceScatter", api.reduce_scatter);
  required("ncclAllGather", api.all_gather);
  required("ncclBroadcast", api.broadcast);
  resolve_symbol(handle, "ncclSend", api.send);
  resolve_symbol(handle, "ncclRecv", api.recv);
  resolve_symbol(handle, "ncclAlltoAll", api.all_to_all);
  resolve_symbol(handle, "ncclCommRegister", api.comm_register);
  resolve_symbol(handle, "ncclCommDeregister", api.comm_deregister);
  resolve_symbol(handle, "ncclGetLastError", api.get_last_error);
  resolve_symbol(handle, "ncclCommFinalize", api.comm_finalize);
  resolve_symbol(handle, "ncclCommSplit", api.comm_split);
  resolve_symbol(handle, "ncclCommCount", api.comm_count);
  resolve_symbol(handle, "ncclCommCuDevice", api.comm_cu_device);
  resolve_symbol(handle, "ncclCommUserRank", api.comm_user_rank);
  resolve_symbol(handle, "ncclMemAlloc", api.mem_alloc);
  resolve_symbol(handle, "ncclMemFree", api.mem_free);
  resolve_symbol(handle, "ncclCommWindowRegister", api.window_register);
  resolve_symbol(handle, "ncclCommWindowDeregister", api.window_deregister);
  resolve_symbol(handle, "ncclRedOpCreatePreMulSum", api.red_op_create_pre_mul_sum);
  resolve_symbol(handle, "ncclRedOpDestroy", api.red_op_destroy);
  resolve_symbol(handle, "ncclGather", api.gather);
  resolve_symbol(handle, "ncclScatter", api.scatter);

  int code = 0;
  library->check(api.get_version(&code), "ncclGetVersion", nullptr, current_rank_text());
  library->version_code_ = code;
  BRAID_DEBUG("loaded NCCL {} from {} (alltoall: {}, send/recv: {}, registration: {})", library->version(),
              library->path_, library->has_all_to_all() ? "yes" : "no", library->has_send_recv() ? "yes" : "no",
              library->has_register() ? "yes" : "no");
  return library;
}

NcclLibrary::~NcclLibrary() = default;  // handle_ stays open for the rest of the process

void* NcclLibrary::symbol(const char* name) const { return dlsym(handle_, name); }

std::string NcclLibrary::version() const { return nccl_version_text(version_code_); }

bool NcclLibrary::has_register() const {
  return api_.comm_register != nullptr && api_.comm_deregister != nullptr && version_code_ >= NCCL_VERSION(2, 19, 0);
}

std::string NcclLibrary::failure_message(ncclResult_t result, const char* call, ncclComm_t comm,
                                         const std::string& rank) const {
  const char* text = api_.get_error_string != nullptr ? api_.get_error_string(result) : nullptr;
  const char* last = api_.get_last_error != nullptr ? api_.get_last_error(comm) : nullptr;
  std::string message = fmt::format("{} failed: {}", call, text != nullptr ? text : nccl_result_name(result));
  if (last != nullptr && *last != '\0') message += fmt::format(" ({})", last);
  return message + " on rank " + rank;
}

void NcclLibrary::raise_error(ncclResult_t result, const char* call, ncclComm_t comm, const std::string& rank) const {
  throw Error(nccl_error_code(result), failure_message(result, call, comm, rank));
}

std::string nccl_version_text(int code) {
  const bool new_scheme = code >= 10000;  // NCCL_VERSION: X*1000+Y*100+Z up to 2.8, X*10000+Y*100+Z since 2.9
  const int major = new_scheme ? code / 10000 : code / 1000;
  const int minor = new_scheme ? (code % 10000) / 100 : (code % 1000) / 100;
  return fmt::format("{}.{}.{}", major, minor, code % 100);
}

// braid's DataType and ReduceOp follow NCCL's numbering, but map by name so that a change on either side shows.
ncclDataType_t to_nccl(DataType type) {
  switch (type) {
    case DataType::kInt8: return ncclInt8;
    case DataType::kUint8: return ncclUint8;
    case DataType::kInt32: return ncclInt32;
    case DataType::kUint32: return ncclUint32;
    case DataType::kInt64: return ncclInt64;
    case DataType::kUint64: return ncclUint64;
    case DataType::kFloat16: return ncclFloat16;
    case DataType::kFloat32: return ncclFloat32;
    case DataType::kFloat64: return ncclFloat64;
    case DataType::kBFloat16: return ncclBfloat16;
    case DataType::kFloat8E4M3: return ncclFloat8e4m3;
    case DataType::kFloat8E5M2: return ncclFloat8e5m2;
  }
  raise_invalid_argument("NCCL backend", "type", "is not a braid DataType (value {})", static_cast<int>(type));
}

ncclRedOp_t to_nccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kProd: return ncclProd;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kAvg: return ncclAvg;
  }
  raise_invalid_argument("NCCL backend", "op", "is not a braid ReduceOp (value {})", static_cast<int>(op));
}

ErrorCode nccl_error_code(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return ErrorCode::kSuccess;
    case ncclUnhandledCudaError: return ErrorCode::kCudaError;
    case ncclSystemError: return ErrorCode::kSystemError;
    case ncclInternalError: return ErrorCode::kInternal;
    case ncclInvalidArgument: return ErrorCode::kInvalidArgument;
    case ncclInvalidUsage: return ErrorCode::kInvalidArgument;
    case ncclRemoteError: return ErrorCode::kRemoteError;
    case ncclInProgress: return ErrorCode::kInternal;  // braid's communicators block: never expected
    default: return ErrorCode::kInternal;
  }
}

ncclResult_t to_nccl_result(ErrorCode code) {
  switch (code) {
    case ErrorCode::kSuccess: return ncclSuccess;
    case ErrorCode::kInvalidArgument: return ncclInvalidArgument;
    case ErrorCode::kMismatch:
    case ErrorCode::kUnsupported: return ncclInvalidUsage;
    case ErrorCode::kNoDevice:
    case ErrorCode::kCudaError:
    case ErrorCode::kDriverError: return ncclUnhandledCudaError;
    case ErrorCode::kSystemError:
    case ErrorCode::kPeerUnreachable: return ncclSystemError;
    case ErrorCode::kTimeout:
    case ErrorCode::kRemoteError:
    case ErrorCode::kRevoked: return ncclRemoteError;
    case ErrorCode::kAborted: return ncclInvalidUsage;  // a call on a communicator this rank aborted
    case ErrorCode::kInternal: return ncclInternalError;
  }
  return ncclInternalError;
}

bool from_nccl(ncclDataType_t type, DataType* out) {
  for (int t = 0; t < kDataTypeCount; ++t) {
    if (to_nccl(static_cast<DataType>(t)) == type) {
      *out = static_cast<DataType>(t);
      return true;
    }
  }
  return false;
}

bool from_nccl(ncclRedOp_t op, ReduceOp* out) {
  for (int o = 0; o < kReduceOpCount; ++o) {
    if (to_nccl(static_cast<ReduceOp>(o)) == op) {
      *out = static_cast<ReduceOp>(o);
      return true;
    }
  }
  return false;
}

const char* nccl_result_name(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "ncclSuccess";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
    case ncclRemoteError: return "ncclRemoteError";
    case ncclInProgress: return "ncclInProgress";
    default: return "unknown ncclResult_t";
  }
}

}  // namespace braid::detail
