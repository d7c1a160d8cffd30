#include "nccl.hpp"

#include <dlfcn.h>
#include <nccl.h>  // types and enums only: every function is resolved with dlsym

#include <cstring>
#include <exception>
#include <stdexcept>
#include <vector>

namespace braid::bench {

struct NcclApi {
  decltype(&::ncclGetVersion) get_version = nullptr;
  decltype(&::ncclGetErrorString) get_error_string = nullptr;
  decltype(&::ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&::ncclCommInitRank) comm_init_rank = nullptr;
  decltype(&::ncclCommDestroy) comm_destroy = nullptr;
  decltype(&::ncclAllReduce) all_reduce = nullptr;
  decltype(&::ncclReduce) reduce = nullptr;
  decltype(&::ncclReduceScatter) reduce_scatter = nullptr;
  decltype(&::ncclAllGather) all_gather = nullptr;
  decltype(&::ncclBroadcast) broadcast = nullptr;
  decltype(&::ncclGroupStart) group_start = nullptr;
  decltype(&::ncclGroupEnd) group_end = nullptr;
  // Optional (null when the library lacks them), typed here rather than with decltype so that an older nccl.h
  // without ncclAlltoAll still compiles: alltoall runs ncclAlltoAll where the library exports it (NCCL 2.28+),
  // else one ncclSend and one ncclRecv per peer inside a group (what nccl-tests' alltoall does).
  using AllToAll = ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
  using Send = ncclResult_t (*)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  using Recv = ncclResult_t (*)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  AllToAll all_to_all = nullptr;
  Send send = nullptr;
  Recv recv = nullptr;
};

namespace {

template <typename F>
void resolve(void* handle, const std::string& path, const char* name, F& function) {
  dlerror();
  void* symbol = dlsym(handle, name);
  if (symbol == nullptr) throw std::runtime_error("--compare nccl: " + path + " has no symbol " + name);
  function = reinterpret_cast<F>(symbol);
}

// The same for an entry point the library may lack: left null.
template <typename F>
void resolve_optional(void* handle, const char* name, F& function) {
  dlerror();
  function = reinterpret_cast<F>(dlsym(handle, name));
  dlerror();
}

void check(const NcclApi& api, ncclResult_t result, const char* what) {
  if (result == ncclSuccess) return;  // blocking communicators: no ncclInProgress
  throw std::runtime_error(std::string("NCCL: ") + what + " failed: " + api.get_error_string(result));
}

// braid's DataType and ReduceOp follow NCCL's numbering, but map by name so a change on either side shows.
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
  }
  throw std::invalid_argument("NCCL: unknown datatype");
}

ncclRedOp_t to_nccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kProd: return ncclProd;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kAvg: return ncclAvg;
  }
  throw std::invalid_argument("NCCL: unknown reduction");
}

}  // namespace

std::shared_ptr<NcclLibrary> NcclLibrary::load(const std::string& path) {
  std::vector<std::string> tries{path};
  if (path.find('/') == std::string::npos) {  // a bare name: also where the CUDA toolkit keeps it
    tries.push_back("/usr/local/cuda/lib/" + path);
    tries.push_back("/usr/local/cuda/lib64/" + path);
  }
  std::string errors;
  std::shared_ptr<NcclLibrary> library(new NcclLibrary());
  for (const std::string& candidate : tries) {
    library->handle_ = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library->handle_ != nullptr) {
      library->path_ = candidate;
      break;
    }
    const char* error = dlerror();
    errors += "\n  " + (error != nullptr ? std::string(error) : candidate + ": not loadable");
  }
  if (library->handle_ == nullptr) {
    throw std::runtime_error("--compare nccl: cannot load " + path + " (set --nccl-lib PATH):" + errors);
  }
  library->api_ = std::make_unique<NcclApi>();
  NcclApi& api = *library->api_;
  void* handle = library->handle_;
  const std::string& where = library->path_;
  resolve(handle, where, "ncclGetVersion", api.get_version);
  resolve(handle, where, "ncclGetErrorString", api.get_error_string);
  resolve(handle, where, "ncclGetUniqueId", api.get_unique_id);
  resolve(handle, where, "ncclCommInitRank", api.comm_init_rank);
  resolve(handle, where, "ncclCommDestroy", api.comm_destroy);
  resolve(handle, where, "ncclAllReduce", api.all_reduce);
  resolve(handle, where, "ncclReduce", api.reduce);
  resolve(handle, where, "ncclReduceScatter", api.reduce_scatter);
  resolve(handle, where, "ncclAllGather", api.all_gather);
  resolve(handle, where, "ncclBroadcast", api.broadcast);
  resolve(handle, where, "ncclGroupStart", api.group_start);
  resolve(handle, where, "ncclGroupEnd", api.group_end);
  resolve_optional(handle, "ncclAlltoAll", api.all_to_all);
  resolve_optional(handle, "ncclSend", api.send);
  resolve_optional(handle, "ncclRecv", api.recv);
  return library;
}

NcclLibrary::~NcclLibrary() {
  // Never dlclose: NCCL's own threads and atexit handlers may still point into the library.
}

int NcclLibrary::version_code() const {
  int code = 0;
  check(*api_, api_->get_version(&code), "ncclGetVersion");
  return code;
}

std::string NcclLibrary::version() const {
  const int code = version_code();
  // NCCL_VERSION(X,Y,Z): X*1000+Y*100+Z before 2.9, X*10000+Y*100+Z since.
  const int major = code >= 10000 ? code / 10000 : code / 1000;
  const int minor = code >= 10000 ? (code % 10000) / 100 : (code % 1000) / 100;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(code % 100);
}

std::string NcclLibrary::all_to_all_method() const {
  if (api_->all_to_all != nullptr) return "ncclAlltoAll";
  if (api_->send != nullptr && api_->recv != nullptr) return "ncclSend/ncclRecv";
  return "";
}

bool NcclLibrary::has_send_recv() const { return api_->send != nullptr && api_->recv != nullptr; }

NcclComm::NcclComm(std::shared_ptr<NcclLibrary> library, Communicator& comm) : library_(std::move(library)) {
  const NcclApi& api = library_->api();
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (comm.rank() == 0) check(api, api.get_unique_id(&id), "ncclGetUniqueId");
  std::vector<std::string> ids =
      comm.host_allgather(comm.rank() == 0 ? std::string(reinterpret_cast<const char*>(&id), sizeof(id)) : "");
  if (ids[0].size() != sizeof(id)) throw std::runtime_error("NCCL: rank 0's unique id did not arrive whole");
  std::memcpy(&id, ids[0].data(), sizeof(id));
  // Ranks as threads each call ncclCommInitRank at once, which NCCL allows without a group.
  ncclComm_t handle = nullptr;
  check(api, api.comm_init_rank(&handle, comm.size(), id, comm.rank()), "ncclCommInitRank");
  comm_ = handle;
  ranks_ = comm.size();
}

NcclComm::~NcclComm() {
  // Unwinding from a failure, peers may never join a teardown: leave the communicator to the exiting process.
  if (comm_ != nullptr && std::uncaught_exceptions() == 0) library_->api().comm_destroy(comm_);
}

void NcclComm::call(Collective coll, const void* send, void* recv, const Shape& shape, DataType type, ReduceOp op,
                    int root, Stream stream) {
  const NcclApi& api = library_->api();
  const ncclDataType_t t = to_nccl(type);
  cudaStream_t s = stream;
  switch (coll) {
    case Collective::kAllReduce:
      check(api, api.all_reduce(send, recv, shape.count, t, to_nccl(op), comm_, s), "ncclAllReduce");
      return;
    case Collective::kReduce:
      check(api, api.reduce(send, recv, shape.count, t, to_nccl(op), root, comm_, s), "ncclReduce");
      return;
    case Collective::kReduceScatter:
      check(api, api.reduce_scatter(send, recv, shape.recv_count, t, to_nccl(op), comm_, s), "ncclReduceScatter");
      return;
    case Collective::kAllGather:
      check(api, api.all_gather(send, recv, shape.send_count, t, comm_, s), "ncclAllGather");
      return;
    case Collective::kBroadcast:
      check(api, api.broadcast(send, recv, shape.count, t, root, comm_, s), "ncclBroadcast");
      return;
    case Collective::kAllToAll:
      call_all_to_all(send, recv, shape.count, type, s);
      return;
  }
}

void NcclComm::call_all_to_all(const void* send, void* recv, size_t count, DataType type, Stream stream) {
  const NcclApi& api = library_->api();
  const ncclDataType_t t = to_nccl(type);
  cudaStream_t s = stream;
  if (api.all_to_all != nullptr) {
    check(api, api.all_to_all(send, recv, count, t, comm_, s), "ncclAlltoAll");
    return;
  }
  if (api.send == nullptr || api.recv == nullptr) {
    throw std::runtime_error("--compare nccl: " + library_->path() +
                             " has neither ncclAlltoAll nor ncclSend/ncclRecv: no NCCL alltoall to compare with");
  }
  // nccl-tests' alltoall before ncclAlltoAll existed: every pair's send and receive in one group.
  const size_t block = count * datatype_size(type);
  check(api, api.group_start(), "ncclGroupStart");
  ncclResult_t result = ncclSuccess;
  const char* failed = nullptr;
  for (int peer = 0; peer < ranks_ && result == ncclSuccess; ++peer) {
    const size_t offset = static_cast<size_t>(peer) * block;
    result = api.send(static_cast<const char*>(send) + offset, count, t, peer, comm_, s);
    failed = "ncclSend";
    if (result != ncclSuccess) break;
    result = api.recv(static_cast<char*>(recv) + offset, count, t, peer, comm_, s);
    failed = "ncclRecv";
  }
  // The group is closed whatever happened inside it (NCCL reports the first error again at ncclGroupEnd).
  const ncclResult_t ended = api.group_end();
  check(api, result, failed);
  check(api, ended, "ncclGroupEnd");
}

void NcclComm::all_to_allv(const void* send, const size_t* send_counts, const size_t* send_displs, void* recv,
                           const size_t* recv_counts, const size_t* recv_displs, DataType type, Stream stream) {
  const NcclApi& api = library_->api();
  if (api.send == nullptr || api.recv == nullptr) {
    throw std::runtime_error("--compare nccl: " + library_->path() + " has no ncclSend/ncclRecv: no NCCL alltoallv");
  }
  const ncclDataType_t t = to_nccl(type);
  const size_t element = datatype_size(type);
  cudaStream_t s = stream;
  check(api, api.group_start(), "ncclGroupStart");
  ncclResult_t result = ncclSuccess;
  const char* failed = nullptr;
  for (int peer = 0; peer < ranks_ && result == ncclSuccess; ++peer) {
    if (send_counts[peer] > 0) {
      result = api.send(static_cast<const char*>(send) + send_displs[peer] * element, send_counts[peer], t, peer, comm_, s);
      failed = "ncclSend";
      if (result != ncclSuccess) break;
    }
    if (recv_counts[peer] > 0) {
      result = api.recv(static_cast<char*>(recv) + recv_displs[peer] * element, recv_counts[peer], t, peer, comm_, s);
      failed = "ncclRecv";
    }
  }
  const ncclResult_t ended = api.group_end();
  if (result != ncclSuccess) check(api, result, failed);
  check(api, ended, "ncclGroupEnd");
}

}  // namespace braid::bench
