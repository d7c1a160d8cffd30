// NCCL's C API, part 1: versions, unique ids, communicators, groups, errors. Argument errors return the codes NCCL
// returns for them (tests/test_shim_arguments.cpp compares the two).
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/cuda_check.hpp"
#include "core/device_guard.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "group.hpp"
#include "shim.hpp"
#include "shim_exports.hpp"
#include "unique_id.hpp"

// ncclResetDebugInit is deprecated in nccl.h, yet part of the API programs may still call.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

using braid::raise_invalid_argument;
using namespace braid::shim;

namespace {

int current_device(const char* function) {
  int device = -1;
  const cudaError_t result = cudaGetDevice(&device);
  if (result != cudaSuccess) {
    braid::raise(braid::ErrorCode::kCudaError, "{}: cudaGetDevice failed: {}", function, cudaGetErrorString(result));
  }
  return device;
}

void check_init_arguments(const char* function, ncclComm_t* newcomm, int nranks, int rank) {
  require_pointer(newcomm, function, "newcomm");
  if (nranks < 1) raise_invalid_argument(function, "nranks", "is {}; it must be at least 1", nranks);
  *newcomm = nullptr;  // as NCCL: NULL on every failure after the pointer's and nranks' checks
  if (rank < 0 || rank >= nranks) raise_invalid_argument(function, "myrank", "is {}, outside [0, {})", rank, nranks);
}

// ncclCommInitRank and friends: the communicator is made now (so *newcomm is valid at once, as NCCL's is), its
// init runs now or at the end of the caller's group.
ncclResult_t init_rank(const char* function, ncclComm_t* newcomm, int nranks, const ncclUniqueId& id, int rank,
                       const ncclConfig_t* config = nullptr) {
  ncclComm_t comm = nullptr;
  int device = -1;
  const ncclResult_t checked = guarded(function, [&] {
    check_init_arguments(function, newcomm, nranks, rank);
    check_config(function, config);
    device = current_device(function);
    comm = new ncclComm();
    *newcomm = comm;
  });
  if (checked != ncclSuccess) return group_failure(checked);  // NOTE [group failure]
  RealConfig real_config(config);  // copied now: the caller's config may be gone when a group ends
  const ncclResult_t result = submit_init(
      comm,
      [comm, id, nranks, rank, device, real_config]() mutable {
        initialise(*comm, id, nranks, rank, device, nullptr, std::move(real_config));
      },
      nonblocking_config(config));
  if (result != ncclSuccess && result != ncclInProgress) {  // a blocking init failed: as NCCL, no communicator
    const std::string failure = last_error();
    release(*comm, /*abort=*/true);
    delete comm;
    *newcomm = nullptr;
    set_last_error(failure);
  }
  return result;
}

// ncclCommDestroy and ncclCommAbort: NULL is fine (as NCCL); abort ends the waits of braid's kernels
// (Communicator::abort) and releases the real NCCL's side with ncclCommAbort.
ncclResult_t destroy(const char* function, ncclComm_t comm, bool abort) {
  if (comm == nullptr) return ncclSuccess;
  return guarded(function, [&] {
    if (comm->magic != ncclComm::kMagic) raise_invalid_argument(function, "comm", "is not a communicator of this library");
    release(*comm, abort);
    comm->magic = 0;
    delete comm;
  });
}

}  // namespace

extern "C" {

// Marks this library as braid's shim, so the NCCL loader never takes it for the real NCCL.
SHIM_EXPORT extern const int braid_nccl_shim_marker;
const int braid_nccl_shim_marker = 1;

SHIM_EXPORT ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;  // the API this library implements: nccl.h's
  return ncclSuccess;
}

SHIM_EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  SHIM_FORWARD_FROM_REAL(ncclGetUniqueId, uniqueId);
  return guarded("ncclGetUniqueId", [&] {
    require_pointer(uniqueId, "ncclGetUniqueId", "uniqueId");
    *uniqueId = make_unique_id();
  });
}

SHIM_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t* newcomm, int nranks, ncclUniqueId commId, int myrank) {
  return init_rank("ncclCommInitRank", newcomm, nranks, commId, myrank);
}

// The config goes to the real NCCL's communicator beside braid's (commName, CTA limits and NCCL's other tuning
// fields). A non-blocking config (blocking = 0) outside a group returns ncclInProgress and initialises on a thread of
// its own: ncclCommGetAsyncError says ncclInProgress until it is done, then its result; in a group, ncclGroupEnd
// finishes it.
SHIM_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int myrank,
                                                ncclConfig_t* config) {
  return init_rank("ncclCommInitRankConfig", comm, nranks, commId, myrank, config);
}

SHIM_EXPORT ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                                  ncclUniqueId* commIds, ncclConfig_t* config) {
  if (nId < 1 || commIds == nullptr) {
    set_last_error("ncclCommInitRankScalable: argument 'commIds' must hold at least one id");
    return group_failure(ncclInvalidArgument);  // NOTE [group failure]
  }
  return init_rank("ncclCommInitRankScalable", newcomm, nranks, commIds[0], myrank, config);  // one store serves them all
}

SHIM_EXPORT ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  const char* function = "ncclCommInitAll";
  std::vector<ncclComm_t> made;
  const ncclResult_t result = guarded(function, [&] {
    require_pointer(comms, function, "comms");
    if (ndev < 1) raise_invalid_argument(function, "ndev", "is {}; it must be at least 1", ndev);
    std::vector<int> devices(ndev);
    for (int i = 0; i < ndev; ++i) devices[i] = devlist != nullptr ? devlist[i] : i;
    const int visible = braid::require_cuda_devices(function);
    std::set<int> named;
    for (const int device : devices) {  // as NCCL: each entry in range, then not a repeat
      if (device < 0 || device >= visible) {
        raise_invalid_argument(function, "devlist", "names device {}; {} are visible", device, visible);
      }
      if (!named.insert(device).second) {
        braid::raise(braid::ErrorCode::kMismatch, "{}: argument 'devlist' names device {} twice", function, device);
      }
    }
    const ncclUniqueId id = make_unique_id();
    for (int i = 0; i < ndev; ++i) made.push_back(new ncclComm());
    // Each rank's init is collective: one thread per rank. The first rank's failure is returned as it was raised
    // (its code, its message).
    std::vector<std::exception_ptr> failures(ndev);
    std::vector<std::thread> threads;
    for (int i = 0; i < ndev; ++i) {
      threads.emplace_back([&, i] {
        try {
          initialise(*made[i], id, ndev, i, devices[i]);
        } catch (...) {
          failures[i] = std::current_exception();
        }
      });
    }
    for (std::thread& thread : threads) thread.join();
    for (const std::exception_ptr& failure : failures) {
      if (failure) std::rethrow_exception(failure);
    }
    std::copy(made.begin(), made.end(), comms);
  });
  if (result != ncclSuccess) {
    for (ncclComm_t comm : made) {
      release(*comm, /*abort=*/true);
      delete comm;
    }
  }
  return result;
}

// Collective over the parent: every rank's (color, key) through braid's store, the new ranks ordered by key then
// parent rank, the new rank 0's store in a fresh unique id; the real NCCL's communicator is split alongside.
SHIM_EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  SHIM_FORWARD_FOREIGN(comm, ncclCommSplit, comm, color, key, newcomm, config);
  const char* function = "ncclCommSplit";
  return group_failure(guarded(function, [&] {  // NOTE [group failure]
    ncclComm& parent = checked_comm(comm, function);
    require_pointer(newcomm, function, "newcomm");
    *newcomm = nullptr;
    if (color != NCCL_SPLIT_NOCOLOR) check_config(function, config);  // as NCCL: only where a child is made
    ncclComm_t child_real = nullptr;
    RealConfig real_config = child_config(parent, config);  // whole, as large as the caller's nccl.h made it
    if (parent.real != nullptr && parent.library->api().comm_split != nullptr) {
      ncclConfig_t* given = config != nullptr ? real_config.get() : nullptr;
      check_real(parent, parent.library->api().comm_split(parent.real, color, key, &child_real, given), "ncclCommSplit");
    }
    if (!parent.braid) {  // NCCL only: so is the child
      if (child_real == nullptr) return;
      auto* child = new ncclComm();
      child->library = parent.library;
      child->real = child_real;
      child->owns_real = true;
      child->device = parent.device;
      parent.library->api().comm_count(child_real, &child->size);
      parent.library->api().comm_user_rank(child_real, &child->rank);
      child->ready = true;
      *newcomm = child;
      return;
    }
    const std::vector<std::string> entries = parent.braid->host_allgather(fmt::format("{} {}", color, key));
    std::vector<std::pair<int, int>> members;  // (key, parent rank) of my color
    for (int r = 0; r < parent.size; ++r) {
      int their_color = 0, their_key = 0;
      std::sscanf(entries[r].c_str(), "%d %d", &their_color, &their_key);
      if (their_color == color && color != NCCL_SPLIT_NOCOLOR) members.emplace_back(their_key, r);
    }
    std::sort(members.begin(), members.end());
    int new_rank = -1;
    for (size_t i = 0; i < members.size(); ++i) {
      if (members[i].second == parent.rank) new_rank = static_cast<int>(i);
    }
    std::string mine;
    if (new_rank == 0) {
      const ncclUniqueId id = make_unique_id();
      mine.assign(id.internal, sizeof(id.internal));
    }
    const std::vector<std::string> ids = parent.braid->host_allgather(mine);
    if (new_rank < 0) {  // NCCL_SPLIT_NOCOLOR
      if (child_real != nullptr) parent.library->api().comm_destroy(child_real);
      return;
    }
    ncclUniqueId id{};
    std::memcpy(id.internal, ids[members[0].second].data(), sizeof(id.internal));
    auto* child = new ncclComm();
    try {
      initialise(*child, id, static_cast<int>(members.size()), new_rank, parent.device, child_real,
                 std::move(real_config));
    } catch (...) {
      release(*child, /*abort=*/true);
      delete child;
      throw;
    }
    *newcomm = child;
  }));
}

// Collective over the ranks that stay (the excluded ones do not call). On braid's CUDA path the survivors form a
// braid communicator through the parent's store (Communicator::shrink), with the real NCCL's shrunk communicator
// beside it where that NCCL has ncclCommShrink; NCCL_SHRINK_ABORT first ends the parent's in-flight work
// (Communicator::abort). Elsewhere only the real NCCL can agree without the excluded ranks: an NCCL-only child.
SHIM_EXPORT ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                                        ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) {
  SHIM_FORWARD_FOREIGN(comm, ncclCommShrink, comm, excludeRanksList, excludeRanksCount, newcomm, config, shrinkFlags);
  const char* function = "ncclCommShrink";
  return group_failure(guarded(function, [&] {  // NOTE [group failure]
    ncclComm& parent = checked_comm(comm, function);
    require_pointer(newcomm, function, "newcomm");
    *newcomm = nullptr;
    // NCCL's checks, before NCCL_SHRINK_ABORT touches the parent: a list of at least one rank, not this one.
    require_pointer(excludeRanksList, function, "excludeRanksList");
    if (excludeRanksCount <= 0) {
      raise_invalid_argument(function, "excludeRanksCount", "is {}; it must be at least 1", excludeRanksCount);
    }
    for (int i = 0; i < excludeRanksCount; ++i) {
      if (excludeRanksList[i] == parent.rank) {
        raise_invalid_argument(function, "excludeRanksList", "names this rank ({}); excluded ranks do not call "
                               "ncclCommShrink", parent.rank);
      }
    }
    check_config(function, config);
    using Shrink = ncclResult_t (*)(ncclComm_t, int*, int, ncclComm_t*, ncclConfig_t*, int);
    auto shrink = parent.library != nullptr ? reinterpret_cast<Shrink>(parent.library->symbol("ncclCommShrink")) : nullptr;
    if (!parent.braid_on_cuda) {
      require_real(parent, function);
      if (shrink == nullptr) braid::raise(braid::ErrorCode::kUnsupported, "{}: the real NCCL has no ncclCommShrink", function);
    }
    if (parent.braid_on_cuda && (shrinkFlags & NCCL_SHRINK_ABORT) != 0) parent.braid->abort();
    RealConfig real_config = child_config(parent, config);
    ncclComm_t child_real = nullptr;
    if (parent.real != nullptr && shrink != nullptr) {
      ncclConfig_t* given = config != nullptr ? real_config.get() : nullptr;
      check_real(parent, shrink(parent.real, excludeRanksList, excludeRanksCount, &child_real, given, shrinkFlags),
                 function);
    }
    auto* child = new ncclComm();
    child->library = parent.library;
    child->real = child_real;
    child->owns_real = child_real != nullptr;
    child->device = parent.device;
    child->config = std::move(real_config);
    if (parent.braid_on_cuda) {
      try {
        const std::vector<int> excluded(excludeRanksList, excludeRanksList + excludeRanksCount);
        braid::DeviceGuard guard(parent.device);
        child->braid.emplace(parent.braid->shrink(excluded));
        child->braid_on_cuda = true;
        child->store = parent.store;  // the rendezvous store the child's ranks found each other through
        child->rank = child->braid->rank();
        child->size = child->braid->size();
      } catch (...) {
        release(*child, /*abort=*/true);
        delete child;
        throw;
      }
    } else {
      parent.library->api().comm_count(child_real, &child->size);
      parent.library->api().comm_user_rank(child_real, &child->rank);
    }
    child->ready = true;
    *newcomm = child;
  }));
}

SHIM_EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  SHIM_FORWARD_FOREIGN(comm, ncclCommFinalize, comm);
  if (comm == nullptr) return ncclSuccess;  // as NCCL
  ncclComm* shim = nullptr;
  const ncclResult_t checked = guarded("ncclCommFinalize", [&] {
    shim = &checked_comm(comm, "ncclCommFinalize");
    if (shim->finalize_called) raise_invalid_argument("ncclCommFinalize", "comm", "was finalized already");
    shim->finalize_called = true;
  });
  if (checked != ncclSuccess) return checked;
  // Flushes the real NCCL's side (braid's calls need no flush: their completion is the stream's).
  auto finalize = [shim] {
    if (shim->owns_real && shim->real != nullptr && shim->library->api().comm_finalize != nullptr) {
      check_real(*shim, shim->library->api().comm_finalize(shim->real), "ncclCommFinalize");
    }
  };
  if (shim->nonblocking) return run_in_background(*shim, "ncclCommFinalize", finalize);
  return guarded("ncclCommFinalize", finalize);
}

SHIM_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  SHIM_FORWARD_FOREIGN(comm, ncclCommDestroy, comm);
  return destroy("ncclCommDestroy", comm, /*abort=*/false);
}

SHIM_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
  SHIM_FORWARD_FOREIGN(comm, ncclCommAbort, comm);
  return destroy("ncclCommAbort", comm, /*abort=*/true);
}

SHIM_EXPORT ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  SHIM_FORWARD_FOREIGN(comm, ncclCommRevoke, comm, revokeFlags);
  return guarded("ncclCommRevoke", [&] {
    ncclComm& shim = checked_comm(comm, "ncclCommRevoke");
    // braid's path: every rank's calls end (Communicator::revoke); NCCL's: its in-flight operations stop.
    if (shim.braid && std::string(shim.braid->backend()) == "cuda") shim.braid->revoke();
    using Revoke = ncclResult_t (*)(ncclComm_t, int);
    auto revoke = shim.library != nullptr ? reinterpret_cast<Revoke>(shim.library->symbol("ncclCommRevoke")) : nullptr;
    if (shim.real != nullptr && revoke != nullptr) check_real(shim, revoke(shim.real, revokeFlags), "ncclCommRevoke");
  });
}

SHIM_EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  SHIM_FORWARD_FOREIGN(comm, ncclCommCount, comm, count);
  return guarded("ncclCommCount", [&] {
    const ncclComm& shim = checked_comm(comm, "ncclCommCount");
    require_pointer(count, "ncclCommCount", "count");
    *count = shim.size;
  });
}

SHIM_EXPORT ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  SHIM_FORWARD_FOREIGN(comm, ncclCommCuDevice, comm, device);
  return guarded("ncclCommCuDevice", [&] {
    const ncclComm& shim = checked_comm(comm, "ncclCommCuDevice");
    require_pointer(device, "ncclCommCuDevice", "device");
    *device = shim.device;
  });
}

SHIM_EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  SHIM_FORWARD_FOREIGN(comm, ncclCommUserRank, comm, rank);
  return guarded("ncclCommUserRank", [&] {
    const ncclComm& shim = checked_comm(comm, "ncclCommUserRank");
    require_pointer(rank, "ncclCommUserRank", "rank");
    *rank = shim.rank;
  });
}

// What a kernel of braid recorded (a peer that never arrived, data refused) or the real NCCL reports. Called by
// watchdog threads while other threads run collectives: both checks only read host-visible words.
SHIM_EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  SHIM_FORWARD_FOREIGN(comm, ncclCommGetAsyncError, comm, asyncError);
  return guarded("ncclCommGetAsyncError", [&] {
    require_pointer(asyncError, "ncclCommGetAsyncError", "asyncError");
    if (comm != nullptr && comm->magic == ncclComm::kMagic) {  // a non-blocking init or finalize: its state first
      const ncclResult_t state = comm->async_state;
      if (state != ncclSuccess) {
        if (state != ncclInProgress) set_last_error(comm->async_error);
        *asyncError = state;
        return;
      }
    }
    ncclComm& shim = checked_comm(comm, "ncclCommGetAsyncError");
    *asyncError = ncclSuccess;
    if (shim.braid) {
      try {
        shim.braid->check();
      } catch (const braid::Error& error) {
        set_last_error(error.what());
        *asyncError = braid::detail::to_nccl_result(error.code());
        return;
      }
    }
    if (shim.owns_real && shim.real != nullptr) {
      ncclResult_t real = ncclSuccess;
      check_real(shim, shim.library->api().comm_get_async_error(shim.real, &real), "ncclCommGetAsyncError");
      *asyncError = real;
    }
  });
}

SHIM_EXPORT ncclResult_t ncclGroupStart() {
  SHIM_FORWARD_FROM_REAL(ncclGroupStart);
  return group_start();
}

SHIM_EXPORT ncclResult_t ncclGroupEnd() {
  SHIM_FORWARD_FROM_REAL(ncclGroupEnd);
  return group_end();
}

// NCCL: with a NULL simInfo exactly ncclGroupEnd; else the inits run and the calls are dropped (no estimate).
SHIM_EXPORT ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo) { return group_end(simInfo); }

SHIM_EXPORT const char* ncclGetErrorString(ncclResult_t result) {
  // NCCL's texts, where NCCL points at its own log pointing at braid's: the failed call's message is
  // ncclGetLastError's, and braid logs it at warn level (BRAID_LOG_LEVEL).
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (details: ncclGetLastError, or braid's log at BRAID_LOG_LEVEL=warn)";
    case ncclSystemError: return "unhandled system error (details: ncclGetLastError, or braid's log at BRAID_LOG_LEVEL=warn)";
    case ncclInternalError: return "internal error - please report this issue to the braid developers";
    case ncclInvalidArgument: return "invalid argument (details: ncclGetLastError, or braid's log at BRAID_LOG_LEVEL=warn)";
    case ncclInvalidUsage: return "invalid usage (details: ncclGetLastError, or braid's log at BRAID_LOG_LEVEL=warn)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

SHIM_EXPORT const char* ncclGetLastError(ncclComm_t comm) {
  SHIM_FORWARD_FOREIGN(comm, ncclGetLastError, comm);  // as NCCL: the calling thread's last error
  return last_error().c_str();
}

SHIM_EXPORT void ncclResetDebugInit() {}

}  // extern "C"

SHIM_ALIAS(ncclGetVersion)
SHIM_ALIAS(ncclGetUniqueId)
SHIM_ALIAS(ncclCommInitRank)
SHIM_ALIAS(ncclCommInitRankConfig)
SHIM_ALIAS(ncclCommInitRankScalable)
SHIM_ALIAS(ncclCommInitAll)
SHIM_ALIAS(ncclCommSplit)
SHIM_ALIAS(ncclCommShrink)
SHIM_ALIAS(ncclCommFinalize)
SHIM_ALIAS(ncclCommDestroy)
SHIM_ALIAS(ncclCommAbort)
SHIM_ALIAS(ncclCommRevoke)
SHIM_ALIAS(ncclCommCount)
SHIM_ALIAS(ncclCommCuDevice)
SHIM_ALIAS(ncclCommUserRank)
SHIM_ALIAS(ncclCommGetAsyncError)
SHIM_ALIAS(ncclGroupStart)
SHIM_ALIAS(ncclGroupEnd)
SHIM_ALIAS(ncclGroupSimulateEnd)
SHIM_ALIAS(ncclGetErrorString)
SHIM_ALIAS(ncclGetLastError)
SHIM_ALIAS(ncclResetDebugInit)
