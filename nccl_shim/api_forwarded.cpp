// NCCL's C API, part 5: the functions of NCCL releases newer than the nccl.h the shim is built against (nccl.h
// of 2.30 and 2.32, and the host half of the device API, nccl_device/), so that a program built for them (PyTorch
// binds every function its libtorch imports) never meets an unresolved symbol. What each does with a shim
// communicator:
//   - per-call config collectives (ncclAllReduceConfig, ...): braid's collective, the config's hints ignored;
//   - suspend/resume, memory statistics, properties, the one-sided signal API, device-API teams and barrier
//     requirements: the real NCCL's function on the shim's paired real communicator (braid's own buffers stay
//     allocated while NCCL's are suspended);
//   - windows the shim made (ncclCommWindowRegister): the real NCCL's function on the paired real window;
//     ncclWinGetUserPtr answers itself;
//   - growing a communicator (ncclCommGrow, ncclCommGetUniqueId): ncclInvalidUsage, as NCCL answers for a
//     communicator that cannot grow;
//   - functions without a communicator (parameters, encryption, requirement builders): the real NCCL's.
// A real NCCL communicator or window passed in goes to the real NCCL unchanged. Where the real NCCL is absent or
// lacks the function, the call fails with ncclInvalidUsage (int-returning functions: -1; teams: an empty team)
// and the last error names the function.
//
// The new types are not in the nccl.h the shim is built against, so every function is defined under a name of
// the shim's own, bound to NCCL's symbol name with an asm label; the types are spelled by their ABI: opaque
// pointers for structs passed by pointer, int for enums, and NcclTeam for ncclTeam_t (passed and returned by value).
#include <nccl.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_set>

#include "core/device_guard.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "shim.hpp"
#include "shim_exports.hpp"
#include "shim_windows.hpp"

using namespace braid::shim;

namespace {

struct NcclTeam {  // ncclTeam_t: {nRanks, rank, stride}
  int n_ranks, rank, stride;
};

// The real NCCL's `name`, or kInvalidUsage naming what is missing.
template <typename Function>
Function real_function(const char* name) {
  void* entry = real_entry(name);
  if (entry == nullptr) {
    const std::string why = real_nccl() == nullptr ? real_nccl_problem() : "it has no such function";
    braid::raise(braid::ErrorCode::kUnsupported, "{}: served by the real NCCL only, and {}", name, why);
  }
  return reinterpret_cast<Function>(entry);
}

// The communicator the real NCCL knows for `comm`: itself for a real NCCL communicator, the paired real
// communicator for a shim one (kInvalidUsage where there is none).
ncclComm_t real_comm(ncclComm_t comm, const char* name) {
  if (!is_shim_comm(comm)) return comm;
  const ncclComm& shim = checked_comm(comm, name);
  if (shim.real == nullptr) {
    braid::raise(braid::ErrorCode::kUnsupported, "{}: the communicator has no real NCCL communicator beside braid's ({})",
                 name, real_nccl_problem());
  }
  return shim.real;
}

// Runs the real NCCL's `name` through `call(function)` and returns its result; braid's errors become NCCL's codes.
template <typename Function, typename Call>
ncclResult_t forward(const char* name, Call&& call) {
  ncclResult_t result = ncclSuccess;
  const ncclResult_t checked = guarded(name, [&] { result = call(real_function<Function>(name)); });
  return checked != ncclSuccess ? checked : result;
}

// The same for a function that does not return ncclResult_t: `failed` where it cannot be forwarded.
template <typename Function, typename Result, typename Call>
Result forward_value(const char* name, Result failed, Call&& call) {
  Result result = failed;
  guarded(name, [&] { result = call(real_function<Function>(name)); });
  return result;
}

// A per-call config collective: on a shim communicator, braid's collective (`plain`: the call without the config,
// whose hints are NCCL's own); on a real NCCL communicator, the real NCCL's `name`, config included.
template <typename... Parameters, typename... Arguments>
ncclResult_t config_collective(const char* name, ncclComm_t comm, const void* config,
                               ncclResult_t (*plain)(Parameters...), Arguments... arguments) {
  if (is_shim_comm(comm)) return plain(arguments...);
  using F = ncclResult_t (*)(Parameters..., const void*);
  return forward<F>(name, [&](F f) { return f(arguments..., config); });
}

ncclResult_t refuse(const char* name, const char* why) {
  return guarded(name, [&] { braid::raise(braid::ErrorCode::kUnsupported, "{}: {}", name, why); });
}

}  // namespace

// Defines NCCL's function `name` (its pname alias too) as shim_name, returning `result`.
#define SHIM_NEWER(result, name, parameters)                                                   \
  extern "C" SHIM_EXPORT result shim_##name parameters __asm__(#name);                         \
  extern "C" SHIM_EXPORT result shim_p##name parameters __asm__("p" #name)                     \
      __attribute__((alias(#name)));                                                           \
  result shim_##name parameters

// ---- Per-call config collectives: braid's collective on a shim communicator (the config's hints are NCCL's) ----

SHIM_NEWER(ncclResult_t, ncclAllReduceConfig,
           (const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
            cudaStream_t stream, const void* config)) {
  return config_collective("ncclAllReduceConfig", comm, config, ncclAllReduce, send, recv, count, type, op, comm, stream);
}

SHIM_NEWER(ncclResult_t, ncclReduceConfig,
           (const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op, int root, ncclComm_t comm,
            cudaStream_t stream, const void* config)) {
  return config_collective("ncclReduceConfig", comm, config, ncclReduce, send, recv, count, type, op, root, comm, stream);
}

SHIM_NEWER(ncclResult_t, ncclReduceScatterConfig,
           (const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
            cudaStream_t stream, const void* config)) {
  return config_collective("ncclReduceScatterConfig", comm, config, ncclReduceScatter, send, recv, count, type, op, comm,
                           stream);
}

SHIM_NEWER(ncclResult_t, ncclAllGatherConfig,
           (const void* send, void* recv, size_t count, ncclDataType_t type, ncclComm_t comm, cudaStream_t stream,
            const void* config)) {
  return config_collective("ncclAllGatherConfig", comm, config, ncclAllGather, send, recv, count, type, comm, stream);
}

SHIM_NEWER(ncclResult_t, ncclAlltoAllConfig,
           (const void* send, void* recv, size_t count, ncclDataType_t type, ncclComm_t comm, cudaStream_t stream,
            const void* config)) {
  return config_collective("ncclAlltoAllConfig", comm, config, ncclAlltoAll, send, recv, count, type, comm, stream);
}

SHIM_NEWER(ncclResult_t, ncclBroadcastConfig,
           (const void* send, void* recv, size_t count, ncclDataType_t type, int root, ncclComm_t comm,
            cudaStream_t stream, const void* config)) {
  return config_collective("ncclBroadcastConfig", comm, config, ncclBroadcast, send, recv, count, type, root, comm, stream);
}

SHIM_NEWER(ncclResult_t, ncclGatherConfig,
           (const void* send, void* recv, size_t count, ncclDataType_t type, int root, ncclComm_t comm,
            cudaStream_t stream, const void* config)) {
  return config_collective("ncclGatherConfig", comm, config, ncclGather, send, recv, count, type, root, comm, stream);
}

SHIM_NEWER(ncclResult_t, ncclScatterConfig,
           (const void* send, void* recv, size_t count, ncclDataType_t type, int root, ncclComm_t comm,
            cudaStream_t stream, const void* config)) {
  return config_collective("ncclScatterConfig", comm, config, ncclScatter, send, recv, count, type, root, comm, stream);
}

// ---- Communicators: suspend and resume, statistics, properties, growing ----

SHIM_NEWER(ncclResult_t, ncclCommSuspend, (ncclComm_t comm, int flags)) {
  using F = ncclResult_t (*)(ncclComm_t, int);
  return forward<F>("ncclCommSuspend", [&](F f) { return f(real_comm(comm, "ncclCommSuspend"), flags); });
}

SHIM_NEWER(ncclResult_t, ncclCommResume, (ncclComm_t comm)) {
  using F = ncclResult_t (*)(ncclComm_t);
  return forward<F>("ncclCommResume", [&](F f) { return f(real_comm(comm, "ncclCommResume")); });
}

SHIM_NEWER(ncclResult_t, ncclCommMemStats, (ncclComm_t comm, int stat, uint64_t* value)) {
  using F = ncclResult_t (*)(ncclComm_t, int, uint64_t*);
  return forward<F>("ncclCommMemStats", [&](F f) { return f(real_comm(comm, "ncclCommMemStats"), stat, value); });
}

SHIM_NEWER(ncclResult_t, ncclCommQueryProperties, (ncclComm_t comm, void* properties)) {
  using F = ncclResult_t (*)(ncclComm_t, void*);
  return forward<F>("ncclCommQueryProperties",
                    [&](F f) { return f(real_comm(comm, "ncclCommQueryProperties"), properties); });
}

SHIM_NEWER(ncclResult_t, ncclCommGetUniqueId, (ncclComm_t comm, ncclUniqueId* unique_id)) {
  using F = ncclResult_t (*)(ncclComm_t, ncclUniqueId*);
  if (is_shim_comm(comm)) return refuse("ncclCommGetUniqueId", "a braid communicator cannot grow; make a new one instead");
  return forward<F>("ncclCommGetUniqueId", [&](F f) { return f(comm, unique_id); });
}

SHIM_NEWER(ncclResult_t, ncclCommGrow,
           (ncclComm_t comm, int ranks, const ncclUniqueId* unique_id, int rank, ncclComm_t* new_comm,
            ncclConfig_t* config)) {
  using F = ncclResult_t (*)(ncclComm_t, int, const ncclUniqueId*, int, ncclComm_t*, ncclConfig_t*);
  if (is_shim_comm(comm)) return refuse("ncclCommGrow", "a braid communicator cannot grow; make a new one instead");
  return forward<F>("ncclCommGrow", [&](F f) { return f(comm, ranks, unique_id, rank, new_comm, config); });
}

// ---- Windows ----

SHIM_NEWER(ncclResult_t, ncclWinGetUserPtr, (ncclComm_t comm, ncclWindow_t window, void** user_pointer)) {
  using F = ncclResult_t (*)(ncclComm_t, ncclWindow_t, void**);
  if (const ShimWindow* shim = shim_window(window)) {
    return guarded("ncclWinGetUserPtr", [&] {
      require_pointer(user_pointer, "ncclWinGetUserPtr", "outUserPtr");
      *user_pointer = shim->user;
    });
  }
  return forward<F>("ncclWinGetUserPtr", [&](F f) { return f(real_comm(comm, "ncclWinGetUserPtr"), window, user_pointer); });
}

SHIM_NEWER(ncclResult_t, ncclGetPeerDevicePointer, (ncclWindow_t window, size_t offset, int peer, void** pointer)) {
  using F = ncclResult_t (*)(ncclWindow_t, size_t, int, void**);
  return forward<F>("ncclGetPeerDevicePointer",
                    [&](F f) { return f(real_window(window, "ncclGetPeerDevicePointer"), offset, peer, pointer); });
}

SHIM_NEWER(ncclResult_t, ncclGetLsaDevicePointer, (ncclWindow_t window, size_t offset, int lsa_rank, void** pointer)) {
  using F = ncclResult_t (*)(ncclWindow_t, size_t, int, void**);
  return forward<F>("ncclGetLsaDevicePointer",
                    [&](F f) { return f(real_window(window, "ncclGetLsaDevicePointer"), offset, lsa_rank, pointer); });
}

SHIM_NEWER(ncclResult_t, ncclGetLsaMultimemDevicePointer, (ncclWindow_t window, size_t offset, void** pointer)) {
  using F = ncclResult_t (*)(ncclWindow_t, size_t, void**);
  return forward<F>("ncclGetLsaMultimemDevicePointer",
                    [&](F f) { return f(real_window(window, "ncclGetLsaMultimemDevicePointer"), offset, pointer); });
}

SHIM_NEWER(ncclResult_t, ncclGetMultimemDevicePointer,
           (ncclWindow_t window, size_t offset, void* multimem, void** pointer)) {
  using F = ncclResult_t (*)(ncclWindow_t, size_t, void*, void**);
  return forward<F>("ncclGetMultimemDevicePointer", [&](F f) {
    return f(real_window(window, "ncclGetMultimemDevicePointer"), offset, multimem, pointer);
  });
}

SHIM_NEWER(ncclResult_t, ncclGetPeerDeviceLeInfo,
           (ncclWindow_t window, size_t offset, int peer, void* le_id, size_t* le_offset)) {
  using F = ncclResult_t (*)(ncclWindow_t, size_t, int, void*, size_t*);
  return forward<F>("ncclGetPeerDeviceLeInfo", [&](F f) {
    return f(real_window(window, "ncclGetPeerDeviceLeInfo"), offset, peer, le_id, le_offset);
  });
}

SHIM_NEWER(ncclResult_t, ncclGetMultimemDeviceLeInfo, (ncclWindow_t window, size_t offset, void* le_id, size_t* le_offset)) {
  using F = ncclResult_t (*)(ncclWindow_t, size_t, void*, size_t*);
  return forward<F>("ncclGetMultimemDeviceLeInfo", [&](F f) {
    return f(real_window(window, "ncclGetMultimemDeviceLeInfo"), offset, le_id, le_offset);
  });
}

SHIM_NEWER(ncclResult_t, ncclGetCftDeviceLeInfo,
           (ncclWindow_t window, size_t offset, int peer, NcclTeam team, void* le_id, size_t* le_offset)) {
  using F = ncclResult_t (*)(ncclWindow_t, size_t, int, NcclTeam, void*, size_t*);
  return forward<F>("ncclGetCftDeviceLeInfo", [&](F f) {
    return f(real_window(window, "ncclGetCftDeviceLeInfo"), offset, peer, team, le_id, le_offset);
  });
}

// ---- The one-sided signal API: the real NCCL's, on the paired communicator and window ----

SHIM_NEWER(ncclResult_t, ncclPutSignal,
           (const void* local, size_t count, ncclDataType_t type, int peer, ncclWindow_t peer_window,
            size_t peer_offset, int signal, int context, unsigned int flags, ncclComm_t comm, cudaStream_t stream)) {
  using F = ncclResult_t (*)(const void*, size_t, ncclDataType_t, int, ncclWindow_t, size_t, int, int, unsigned int,
                             ncclComm_t, cudaStream_t);
  return forward<F>("ncclPutSignal", [&](F f) {
    return f(local, count, type, peer, real_window(peer_window, "ncclPutSignal"), peer_offset, signal, context, flags,
             real_comm(comm, "ncclPutSignal"), stream);
  });
}

SHIM_NEWER(ncclResult_t, ncclSignal,
           (int peer, int signal, int context, unsigned int flags, ncclComm_t comm, cudaStream_t stream)) {
  using F = ncclResult_t (*)(int, int, int, unsigned int, ncclComm_t, cudaStream_t);
  return forward<F>("ncclSignal",
                    [&](F f) { return f(peer, signal, context, flags, real_comm(comm, "ncclSignal"), stream); });
}

SHIM_NEWER(ncclResult_t, ncclWaitSignal, (int descriptors, void* signal_descriptors, ncclComm_t comm, cudaStream_t stream)) {
  using F = ncclResult_t (*)(int, void*, ncclComm_t, cudaStream_t);
  return forward<F>("ncclWaitSignal",
                    [&](F f) { return f(descriptors, signal_descriptors, real_comm(comm, "ncclWaitSignal"), stream); });
}

// ---- The device API's host half: teams and resource requirements ----

SHIM_NEWER(NcclTeam, ncclTeamWorld, (ncclComm_t comm)) {
  using F = NcclTeam (*)(ncclComm_t);
  return forward_value<F>("ncclTeamWorld", NcclTeam{}, [&](F f) { return f(real_comm(comm, "ncclTeamWorld")); });
}

SHIM_NEWER(NcclTeam, ncclTeamLsa, (ncclComm_t comm)) {
  using F = NcclTeam (*)(ncclComm_t);
  return forward_value<F>("ncclTeamLsa", NcclTeam{}, [&](F f) { return f(real_comm(comm, "ncclTeamLsa")); });
}

SHIM_NEWER(NcclTeam, ncclTeamRail, (ncclComm_t comm)) {
  using F = NcclTeam (*)(ncclComm_t);
  return forward_value<F>("ncclTeamRail", NcclTeam{}, [&](F f) { return f(real_comm(comm, "ncclTeamRail")); });
}

SHIM_NEWER(NcclTeam, ncclTeamCft, (ncclComm_t comm, int mode)) {
  using F = NcclTeam (*)(ncclComm_t, int);
  return forward_value<F>("ncclTeamCft", NcclTeam{}, [&](F f) { return f(real_comm(comm, "ncclTeamCft"), mode); });
}

SHIM_NEWER(NcclTeam, ncclTeamCftMultimem, (ncclComm_t comm)) {
  using F = NcclTeam (*)(ncclComm_t);
  return forward_value<F>("ncclTeamCftMultimem", NcclTeam{},
                          [&](F f) { return f(real_comm(comm, "ncclTeamCftMultimem")); });
}

SHIM_NEWER(int, ncclTeamRankToWorld, (ncclComm_t comm, NcclTeam team, int rank)) {
  using F = int (*)(ncclComm_t, NcclTeam, int);
  return forward_value<F>("ncclTeamRankToWorld", -1,
                          [&](F f) { return f(real_comm(comm, "ncclTeamRankToWorld"), team, rank); });
}

SHIM_NEWER(int, ncclTeamRankToLsa, (ncclComm_t comm, NcclTeam team, int rank)) {
  using F = int (*)(ncclComm_t, NcclTeam, int);
  return forward_value<F>("ncclTeamRankToLsa", -1,
                          [&](F f) { return f(real_comm(comm, "ncclTeamRankToLsa"), team, rank); });
}

SHIM_NEWER(ncclResult_t, ncclGinBarrierCreateRequirement,
           (ncclComm_t comm, NcclTeam team, int barriers, void* handle, void* requirement)) {
  using F = ncclResult_t (*)(ncclComm_t, NcclTeam, int, void*, void*);
  return forward<F>("ncclGinBarrierCreateRequirement", [&](F f) {
    return f(real_comm(comm, "ncclGinBarrierCreateRequirement"), team, barriers, handle, requirement);
  });
}

SHIM_NEWER(ncclResult_t, ncclLsaBarrierCreateRequirement, (NcclTeam team, int barriers, void* handle, void* requirement)) {
  using F = ncclResult_t (*)(NcclTeam, int, void*, void*);
  return forward<F>("ncclLsaBarrierCreateRequirement", [&](F f) { return f(team, barriers, handle, requirement); });
}

SHIM_NEWER(ncclResult_t, ncclGinOutboxCreateRequirement, (int blocks, int size_log2, void* handle, void* requirement)) {
  using F = ncclResult_t (*)(int, int, void*, void*);
  return forward<F>("ncclGinOutboxCreateRequirement", [&](F f) { return f(blocks, size_log2, handle, requirement); });
}

SHIM_NEWER(ncclResult_t, ncclGinInboxA2ACreateRequirement,
           (NcclTeam peers, int blocks, int size_log2, void* handle, void* requirement)) {
  using F = ncclResult_t (*)(NcclTeam, int, int, void*, void*);
  return forward<F>("ncclGinInboxA2ACreateRequirement",
                    [&](F f) { return f(peers, blocks, size_log2, handle, requirement); });
}

SHIM_NEWER(ncclResult_t, ncclLLA2ACreateRequirement, (int blocks, int slots, void* handle, void* requirement)) {
  using F = ncclResult_t (*)(int, int, void*, void*);
  return forward<F>("ncclLLA2ACreateRequirement", [&](F f) { return f(blocks, slots, handle, requirement); });
}

SHIM_NEWER(int, ncclLLA2ACalcSlots, (int elements, int element_size)) {
  using F = int (*)(int, int);
  return forward_value<F>("ncclLLA2ACalcSlots", -1, [&](F f) { return f(elements, element_size); });
}

// ---- Parameters, encryption, debug ----

SHIM_NEWER(ncclResult_t, ncclSetEncryption, (const void* config)) {
  using F = ncclResult_t (*)(const void*);
  return forward<F>("ncclSetEncryption", [&](F f) { return f(config); });
}

SHIM_NEWER(ncclResult_t, ncclParamBind, (void** handle, const char* key)) {
  using F = ncclResult_t (*)(void**, const char*);
  return forward<F>("ncclParamBind", [&](F f) { return f(handle, key); });
}

#define SHIM_PARAM_GETTER(name, type)                                               \
  SHIM_NEWER(ncclResult_t, name, (void* handle, type* out)) {                       \
    using F = ncclResult_t (*)(void*, type*);                                       \
    return forward<F>(#name, [&](F f) { return f(handle, out); });                  \
  }
SHIM_PARAM_GETTER(ncclParamGetI8, int8_t)
SHIM_PARAM_GETTER(ncclParamGetI16, int16_t)
SHIM_PARAM_GETTER(ncclParamGetI32, int32_t)
SHIM_PARAM_GETTER(ncclParamGetI64, int64_t)
SHIM_PARAM_GETTER(ncclParamGetU8, uint8_t)
SHIM_PARAM_GETTER(ncclParamGetU16, uint16_t)
SHIM_PARAM_GETTER(ncclParamGetU32, uint32_t)
SHIM_PARAM_GETTER(ncclParamGetU64, uint64_t)
SHIM_PARAM_GETTER(ncclParamGetStr, const char*)

SHIM_NEWER(ncclResult_t, ncclParamGet, (void* handle, void* out, int max_length, int* length)) {
  using F = ncclResult_t (*)(void*, void*, int, int*);
  return forward<F>("ncclParamGet", [&](F f) { return f(handle, out, max_length, length); });
}

SHIM_NEWER(ncclResult_t, ncclParamGetParameter, (const char* key, const char** value, int* value_length)) {
  using F = ncclResult_t (*)(const char*, const char**, int*);
  return forward<F>("ncclParamGetParameter", [&](F f) { return f(key, value, value_length); });
}

SHIM_NEWER(ncclResult_t, ncclParamGetAllParameterKeys, (const char*** table, int* table_length)) {
  using F = ncclResult_t (*)(const char***, int*);
  return forward<F>("ncclParamGetAllParameterKeys", [&](F f) { return f(table, table_length); });
}

SHIM_NEWER(void, ncclParamDumpAll, (void)) {
  using F = void (*)();
  forward_value<F>("ncclParamDumpAll", 0, [&](F f) {
    f();
    return 0;
  });
}

SHIM_NEWER(void, ncclResetDebugInitInternal, (void)) {
  using F = void (*)();
  forward_value<F>("ncclResetDebugInitInternal", 0, [&](F f) {
    f();
    return 0;
  });
}
