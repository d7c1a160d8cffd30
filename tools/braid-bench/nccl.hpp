// NCCL for --compare nccl: a thin layer over braid's NCCL backend (backends/nccl: the dlopen loader and one
// rank's NCCL communicator). braid-bench never links NCCL, so it starts on machines without it and the library
// under comparison is whichever the user names (--nccl-lib).
#pragma once

#include <memory>
#include <string>

#include "backends/nccl/nccl_backend.hpp"
#include "braid/braid.hpp"
#include "collective.hpp"

namespace braid::bench {

class NcclLibrary {
 public:
  // braid::detail::NcclLibrary::load(path); its error (every path tried with dlerror(), or the missing symbol)
  // rethrown as std::runtime_error prefixed "--compare nccl: ", with a hint at --nccl-lib.
  static std::shared_ptr<NcclLibrary> load(const std::string& path);

  std::string version() const { return library_->version(); }  // "2.28.9"
  const std::string& path() const { return library_->path(); }
  // How alltoall is called: "ncclAlltoAll", "ncclSend/ncclRecv" (per peer, in a group), or "" (neither exported).
  std::string all_to_all_method() const;
  // Whether ncclSend and ncclRecv are exported (NCCL 2.7+): --moe's alltoallv needs them.
  bool has_send_recv() const { return library_->has_send_recv(); }
  const std::shared_ptr<detail::NcclLibrary>& library() const { return library_; }

 private:
  explicit NcclLibrary(std::shared_ptr<detail::NcclLibrary> library) : library_(std::move(library)) {}
  std::shared_ptr<detail::NcclLibrary> library_;
};

// One rank's NCCL communicator over the same ranks and GPUs as a braid communicator (a detail::NcclBackend that
// registers nothing: NCCL runs as frameworks run it today).
class NcclComm {
 public:
  // Collective over comm's ranks: rank 0 makes the unique id, shared with comm.host_allgather. The caller has
  // made comm.device() current.
  NcclComm(const std::shared_ptr<NcclLibrary>& library, Communicator& comm);

  // Enqueues one NCCL call with the same arguments braid gets (see call_braid).
  void call(Collective coll, const void* send, void* recv, const Shape& shape, DataType type, ReduceOp op, int root,
            Stream stream);

  // `count` elements to and from every rank (ncclAlltoAll, or ncclSend/ncclRecv per peer in a group).
  void all_to_all(const void* send, void* recv, size_t count, DataType type, Stream stream) {
    backend_->all_to_all(send, recv, count, type, stream);
  }
  // MPI_Alltoallv's shape with host arrays of size() entries, counts and displacements in elements: one ncclSend
  // and one ncclRecv per peer with a nonzero count (itself included), in one group. Needs ncclSend/ncclRecv.
  void all_to_allv(const void* send, const size_t* send_counts, const size_t* send_displs, void* recv,
                   const size_t* recv_counts, const size_t* recv_displs, DataType type, Stream stream) {
    backend_->all_to_allv(send, send_counts, send_displs, recv, recv_counts, recv_displs, type, stream);
  }

 private:
  std::unique_ptr<detail::NcclBackend> backend_;
  int rank_ = 0, ranks_ = 1;
};

}  // namespace braid::bench
