// NCCL for --compare nccl, loaded with dlopen: braid-bench never links NCCL, so it starts on machines
// without it and the library under comparison is whichever the user names (--nccl-lib).
#pragma once

#include <memory>
#include <string>

#include "braid/braid.hpp"
#include "collective.hpp"

struct ncclComm;  // nccl.h's opaque communicator, without including nccl.h here

namespace braid::bench {

struct NcclApi;  // the resolved entry points (nccl.cpp)

class NcclLibrary {
 public:
  // dlopen(path), then, for a bare name that the loader does not find, the CUDA toolkit's lib folders.
  // Throws std::runtime_error naming the library and dlerror(), or the missing symbol.
  static std::shared_ptr<NcclLibrary> load(const std::string& path);
  ~NcclLibrary();

  int version_code() const;     // ncclGetVersion
  std::string version() const;  // "2.28.3"
  const std::string& path() const { return path_; }
  // How alltoall is called: "ncclAlltoAll", "ncclSend/ncclRecv" (per peer, in a group), or "" (neither exported).
  std::string all_to_all_method() const;
  // Whether ncclSend and ncclRecv are exported (NCCL 2.7+): --moe's alltoallv needs them.
  bool has_send_recv() const;
  const NcclApi& api() const { return *api_; }

 private:
  NcclLibrary() = default;
  void* handle_ = nullptr;
  std::string path_;
  std::unique_ptr<NcclApi> api_;
};

// One rank's NCCL communicator over the same ranks and GPUs as a braid communicator.
class NcclComm {
 public:
  // Collective over comm's ranks: rank 0 makes the unique id, shared with comm.host_allgather. The caller has
  // made comm.device() current.
  NcclComm(std::shared_ptr<NcclLibrary> library, Communicator& comm);
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  // Enqueues one NCCL call with the same arguments braid gets (see call_braid).
  void call(Collective coll, const void* send, void* recv, const Shape& shape, DataType type, ReduceOp op, int root,
            Stream stream);

  // `count` elements to and from every rank (ncclAlltoAll, or ncclSend/ncclRecv per peer in a group).
  void all_to_all(const void* send, void* recv, size_t count, DataType type, Stream stream) {
    call_all_to_all(send, recv, count, type, stream);
  }
  // MPI_Alltoallv's shape with host arrays of size() entries, counts and displacements in elements: one ncclSend
  // and one ncclRecv per peer with a nonzero count (itself included), in one group. Needs ncclSend/ncclRecv.
  void all_to_allv(const void* send, const size_t* send_counts, const size_t* send_displs, void* recv,
                   const size_t* recv_counts, const size_t* recv_displs, DataType type, Stream stream);

 private:
  // ncclAlltoAll where the library has it, else ncclSend/ncclRecv per peer in a group (count: per peer).
  void call_all_to_all(const void* send, void* recv, size_t count, DataType type, Stream stream);

  std::shared_ptr<NcclLibrary> library_;
  ncclComm* comm_ = nullptr;
  int ranks_ = 0;
};

}  // namespace braid::bench
