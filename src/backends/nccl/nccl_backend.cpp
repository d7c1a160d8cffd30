#include "backends/nccl/nccl_backend.hpp"

#include <chrono>
#include <cstring>
#include <exception>
#include <optional>
#include <utility>
#include <vector>

#include "braid/types.hpp"
#include "core/config.hpp"
#include "core/cuda_check.hpp"
#include "core/device_guard.hpp"
#include "core/error.hpp"
#include "core/log.hpp"

namespace braid::detail {

NcclRegisterMode nccl_register_mode(const Config& config) {
  const std::string value = config.string("BRAID_NCCL_REGISTER").value_or("try");
  if (value == "yes") return NcclRegisterMode::kYes;
  if (value == "no") return NcclRegisterMode::kNo;
  return NcclRegisterMode::kTry;  // the table admits only try|yes|no
}

NcclRegisterMode nccl_register_mode() { return nccl_register_mode(Config::get()); }

const char* nccl_register_mode_name(NcclRegisterMode mode) {
  switch (mode) {
    case NcclRegisterMode::kTry: return "try";
    case NcclRegisterMode::kYes: return "yes";
    case NcclRegisterMode::kNo: return "no";
  }
  return "?";
}

std::string NcclBackend::make_unique_id(NcclLibrary& library) {
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  library.check(library.api().get_unique_id(&id), "ncclGetUniqueId", nullptr, current_rank_text());
  return std::string(reinterpret_cast<const char*>(&id), sizeof(id));
}

NcclBackend::NcclBackend(std::shared_ptr<NcclLibrary> library, int rank, int size, int device,
                         const std::string& unique_id, NcclRegisterMode register_mode, double timeout_s)
    : library_(std::move(library)),
      rank_(rank),
      size_(size),
      device_(device),
      register_mode_(register_mode),
      rank_text_(std::to_string(rank)),
      uncaught_at_init_(std::uncaught_exceptions()) {
  constexpr const char* kWhere = "NcclBackend";
  if (library_ == nullptr) raise_invalid_argument(kWhere, "library", "is null");
  if (size < 1) raise_invalid_argument(kWhere, "size", "must be at least 1 (got {})", size);
  if (rank < 0 || rank >= size) raise_invalid_argument(kWhere, "rank", "must be in [0, {}) (got {})", size, rank);
  if (!(timeout_s > 0)) raise_invalid_argument(kWhere, "timeout_s", "must be positive (got {})", timeout_s);
  if (device < 0) raise_invalid_argument(kWhere, "device", "must be a CUDA device ordinal (got {})", device);
  ncclUniqueId id;
  if (unique_id.size() != sizeof(id)) {
    raise_invalid_argument(kWhere, "unique_id", "has {} bytes; ncclGetUniqueId makes {} (NcclBackend::make_unique_id)",
                           unique_id.size(), sizeof(id));
  }
  std::memcpy(&id, unique_id.data(), sizeof(id));

  const NcclApi& api = library_->api();
  ncclComm_t comm = nullptr;
  {
    DeviceGuard guard(device_);
    // Ranks as threads of one process each call this at once, which NCCL allows without a group.
    if (api.comm_init_rank != nullptr) {
      check_call(api.comm_init_rank(&comm, size_, id, rank_), "ncclCommInitRank");
    } else {
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 1;
      check_call(api.comm_init_rank_config(&comm, size_, id, rank_, &config), "ncclCommInitRankConfig");
    }
  }
  comm_ = comm;
  // The watchdog's expiry aborts from its own thread; aborted_ tells the destructor that comm_ is gone.
  watchdog_ = std::make_unique<NcclWatchdog>(device_, timeout_s, "NCCL rank " + rank_text_, [this](const std::string&) {
    abort_communicator();
  });
  BRAID_INFO("NCCL {} ({}): rank {} of {} on GPU {}, buffer registration {}", library_->version(), library_->path(),
             rank_, size_, device_, nccl_register_mode_name(register_mode_));
}

NcclBackend::~NcclBackend() {
  watchdog_.reset();  // joins its thread: an abort under way completes first
  if (comm_ == nullptr || aborted_.load()) return;
  try {
    std::unordered_map<uint64_t, Registration> left;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      left.swap(registrations_);
    }
    // Unwinding from a failure, peers may never join a teardown, and after an asynchronous error the
    // communicator cannot finish one: abort, which is local and frees the registrations with the communicator.
    bool abort = std::uncaught_exceptions() > uncaught_at_init_;
    {
      std::lock_guard<std::mutex> lock(async_failure_mutex_);
      abort = abort || async_failure_.has_value();
    }
    DeviceGuard guard(device_);
    const NcclApi& api = library_->api();
    if (abort) {
      const ncclResult_t result = api.comm_abort(comm_);
      if (result != ncclSuccess) {
        BRAID_WARN("{}", library_->failure_message(result, "ncclCommAbort", nullptr, rank_text_));
      }
    } else {
      for (auto& [key, registration] : left) {
        if (registration.state == Registration::State::kRegistered) deregister(registration.handle, key);
      }
      const ncclResult_t result = api.comm_destroy(comm_);
      if (result != ncclSuccess) {
        BRAID_WARN("{}", library_->failure_message(result, "ncclCommDestroy", nullptr, rank_text_));
      }
    }
  } catch (...) {
    // Never throws (a log line that cannot be written is not worth terminating for).
  }
  comm_ = nullptr;
}

void NcclBackend::check_call(ncclResult_t result, const char* call) const {
  // A call the abort ran under failed because of it, and its communicator is gone: the abort is the failure.
  if (result != ncclSuccess && result != ncclInProgress && aborting_.load()) raise_aborted();
  library_->check(result, call, comm_, rank_text_);
}

void NcclBackend::raise_if_expired() const {
  if (watchdog_->expired()) throw Error(ErrorCode::kTimeout, watchdog_->message());
}

void NcclBackend::raise_aborted() const {
  raise_if_expired();
  raise(ErrorCode::kAborted, "NCCL rank {} aborted the communicator (Communicator::abort); destroy it", rank_text_);
}

NcclBackend::CallLock NcclBackend::enter_call() {
  CallLock call(calls_);
  if (aborting_.load()) raise_aborted();
  return call;
}

NcclBackend::WatchedCall NcclBackend::watch(const char* operation, Stream stream) {
  return WatchedCall{enter_call(), NcclWatchdog::Scope(*watchdog_, operation, stream)};
}

void NcclBackend::all_reduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op, Stream stream) {
  const auto watched = watch("ncclAllReduce", stream);
  check_call(library_->api().all_reduce(send, recv, count, to_nccl(type), to_nccl(op), comm_, stream), "ncclAllReduce");
}

void NcclBackend::reduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op, int root,
                         Stream stream) {
  const auto watched = watch("ncclReduce", stream);
  check_call(library_->api().reduce(send, recv, count, to_nccl(type), to_nccl(op), root, comm_, stream), "ncclReduce");
}

void NcclBackend::reduce_scatter(const void* send, void* recv, size_t recv_count, DataType type, ReduceOp op,
                                 Stream stream) {
  const auto watched = watch("ncclReduceScatter", stream);
  check_call(library_->api().reduce_scatter(send, recv, recv_count, to_nccl(type), to_nccl(op), comm_, stream),
             "ncclReduceScatter");
}

void NcclBackend::all_gather(const void* send, void* recv, size_t send_count, DataType type, Stream stream) {
  const auto watched = watch("ncclAllGather", stream);
  check_call(library_->api().all_gather(send, recv, send_count, to_nccl(type), comm_, stream), "ncclAllGather");
}

void NcclBackend::broadcast(const void* send, void* recv, size_t count, DataType type, int root, Stream stream) {
  const auto watched = watch("ncclBroadcast", stream);
  check_call(library_->api().broadcast(send, recv, count, to_nccl(type), root, comm_, stream), "ncclBroadcast");
}

namespace {

// A copy of `bytes` at `source` made on `stream` from its memory pool, and freed on `stream` after the work enqueued
// while it lives (memory nodes where `stream` is being captured).
class StreamOrderedCopy {
 public:
  StreamOrderedCopy(const void* source, size_t bytes, Stream stream) : stream_(stream) {
    BRAID_CUDA(cudaMallocAsync(&copy_, bytes, stream));
    const cudaError_t copied = cudaMemcpyAsync(copy_, source, bytes, cudaMemcpyDeviceToDevice, stream);
    if (copied != cudaSuccess) {
      cudaFreeAsync(copy_, stream);
      BRAID_CUDA(copied);
    }
  }
  StreamOrderedCopy(const StreamOrderedCopy&) = delete;
  StreamOrderedCopy& operator=(const StreamOrderedCopy&) = delete;
  ~StreamOrderedCopy() { cudaFreeAsync(copy_, stream_); }
  const void* get() const { return copy_; }

 private:
  Stream stream_;
  void* copy_ = nullptr;
};

}  // namespace

// NOTE [in-place all-to-all on NCCL]
// NCCL's all-to-all in place sends each block and receives the peer's block into the same bytes in one group, and
// the two race: NCCL 2.28.9 returns ncclSuccess with a wrong result on 2 ranks from a count of 1. braid promises
// in place (every block replaced by the one its rank sent here), so the input is first copied on the stream and
// NCCL reads the copy.
void NcclBackend::all_to_all(const void* send, void* recv, size_t count, DataType type, Stream stream) {
  if (!library_->has_all_to_all() && !library_->has_send_recv()) {  // before anything is enqueued
    raise(ErrorCode::kUnsupported, "all_to_all: NCCL {} ({}) exports neither ncclAlltoAll nor ncclSend/ncclRecv",
          library_->version(), library_->path());
  }
  const auto watched = watch("all_to_all (ncclAlltoAll or grouped ncclSend/ncclRecv)", stream);
  std::optional<StreamOrderedCopy> input;
  if (send == recv) {
    input.emplace(send, count * static_cast<size_t>(size_) * datatype_size(type), stream);
    send = input->get();
  }
  if (library_->has_all_to_all()) {
    check_call(library_->api().all_to_all(send, recv, count, to_nccl(type), comm_, stream), "ncclAlltoAll");
    return;
  }
  // What nccl-tests' alltoall did before ncclAlltoAll existed: every pair's send and receive in one group.
  const std::vector<size_t> counts(size_, count);
  send_recv_group(send, counts.data(), nullptr, recv, counts.data(), nullptr, type, stream);
}

void NcclBackend::all_to_allv(const void* send, const size_t* send_counts, const size_t* send_displs, void* recv,
                              const size_t* recv_counts, const size_t* recv_displs, DataType type, Stream stream) {
  const auto watched = watch("all_to_allv (grouped ncclSend/ncclRecv)", stream);
  if (!library_->has_send_recv()) {
    raise(ErrorCode::kUnsupported, "all_to_allv: NCCL {} ({}) exports no ncclSend/ncclRecv (NCCL 2.7+)",
          library_->version(), library_->path());
  }
  send_recv_group(send, send_counts, send_displs, recv, recv_counts, recv_displs, type, stream);
}

void NcclBackend::send_recv(const PointToPoint* ops, size_t count, Stream stream) {
  const auto watched = watch("send_recv (grouped ncclSend/ncclRecv)", stream);
  if (!library_->has_send_recv()) {
    raise(ErrorCode::kUnsupported, "send_recv: NCCL {} ({}) exports no ncclSend/ncclRecv (NCCL 2.7+)",
          library_->version(), library_->path());
  }
  const NcclApi& api = library_->api();
  check_call(api.group_start(), "ncclGroupStart");
  ncclResult_t result = ncclSuccess;
  const char* failed = nullptr;
  for (size_t i = 0; i < count && result == ncclSuccess; ++i) {
    const PointToPoint& op = ops[i];
    if (op.kind == PointToPoint::kSend) {
      result = api.send(op.buffer, op.count, to_nccl(op.type), op.peer, comm_, stream);
      failed = "ncclSend";
    } else {
      result = api.recv(op.buffer, op.count, to_nccl(op.type), op.peer, comm_, stream);
      failed = "ncclRecv";
    }
  }
  // The group is closed whatever happened inside it (NCCL reports the first error again at ncclGroupEnd).
  const ncclResult_t ended = api.group_end();
  if (result != ncclSuccess) check_call(result, failed);
  check_call(ended, "ncclGroupEnd");
}

void NcclBackend::send_recv_group(const void* send, const size_t* send_counts, const size_t* send_displs, void* recv,
                                  const size_t* recv_counts, const size_t* recv_displs, DataType type,
                                  Stream stream) {
  const NcclApi& api = library_->api();
  const ncclDataType_t nccl_type = to_nccl(type);
  const size_t element = datatype_size(type);
  // Null displacements: each peer's block right after the previous one's, in rank order.
  auto offsets = [&](const size_t* counts, const size_t* displs) {
    std::vector<size_t> result(size_);
    size_t next = 0;
    for (int peer = 0; peer < size_; ++peer) {
      result[peer] = displs != nullptr ? displs[peer] : next;
      next += counts[peer];
    }
    return result;
  };
  const std::vector<size_t> send_offsets = offsets(send_counts, send_displs);
  const std::vector<size_t> recv_offsets = offsets(recv_counts, recv_displs);

  check_call(api.group_start(), "ncclGroupStart");
  ncclResult_t result = ncclSuccess;
  const char* failed = nullptr;
  for (int peer = 0; peer < size_ && result == ncclSuccess; ++peer) {
    if (send_counts[peer] > 0) {
      result = api.send(static_cast<const char*>(send) + send_offsets[peer] * element, send_counts[peer], nccl_type,
                        peer, comm_, stream);
      failed = "ncclSend";
      if (result != ncclSuccess) break;
    }
    if (recv_counts[peer] > 0) {
      result = api.recv(static_cast<char*>(recv) + recv_offsets[peer] * element, recv_counts[peer], nccl_type, peer,
                        comm_, stream);
      failed = "ncclRecv";
    }
  }
  // The group is closed whatever happened inside it (NCCL reports the first error again at ncclGroupEnd).
  const ncclResult_t ended = api.group_end();
  if (result != ncclSuccess) check_call(result, failed);
  check_call(ended, "ncclGroupEnd");
}

bool NcclBackend::ensure_registered(uint64_t key, void* base, size_t bytes) {
  if (register_mode_ == NcclRegisterMode::kNo) return false;
  if (aborting_.load()) raise_aborted();
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    auto found = registrations_.find(key);
    if (found == registrations_.end()) break;
    if (found->second.state == Registration::State::kPending) {  // another thread is registering it
      settled_.wait(lock);
      continue;
    }
    return found->second.state == Registration::State::kRegistered;  // the cache: no NCCL call
  }

  if (!library_->has_register()) {
    if (register_mode_ == NcclRegisterMode::kYes) {
      raise(ErrorCode::kUnsupported,
            "BRAID_NCCL_REGISTER=yes, but NCCL {} ({}) cannot register buffers (ncclCommRegister and "
            "ncclCommDeregister, NCCL 2.19 or later) on rank {}",
            library_->version(), library_->path(), rank_);
    }
    registrations_[key].state = Registration::State::kUnregistered;
    if (!std::exchange(warned_, true)) {
      BRAID_INFO("NCCL {} ({}) cannot register buffers (ncclCommRegister, NCCL 2.19+): collectives on registered "
                 "buffers run unregistered (BRAID_NCCL_REGISTER=try)",
                 library_->version(), library_->path());
    }
    return false;
  }

  // Registered outside the lock: the entry stays pending meanwhile, so other callers for this key wait for it and
  // callers for other keys go on.
  registrations_[key] = Registration{};
  lock.unlock();
  CallLock call;
  try {
    call = enter_call();
  } catch (...) {  // an abort since the check above: nothing registered, nothing remembered
    lock.lock();
    registrations_.erase(key);
    settled_.notify_all();
    throw;
  }
  void* handle = nullptr;
  ncclResult_t result = ncclInternalError;
  std::string failure;
  try {
    DeviceGuard guard(device_);
    result = library_->api().comm_register(comm_, base, bytes, &handle);
    ++register_calls_;
    if (result != ncclSuccess) failure = library_->failure_message(result, "ncclCommRegister", comm_, rank_text_);
  } catch (const std::exception& error) {
    failure = error.what();
  }
  call.unlock();
  lock.lock();
  Registration& entry = registrations_[key];  // still there: forget_registered waits for pending entries
  if (failure.empty()) {
    entry.state = Registration::State::kRegistered;
    entry.handle = handle;
    settled_.notify_all();
    return true;
  }
  if (register_mode_ == NcclRegisterMode::kYes) {
    registrations_.erase(key);  // not remembered: the next call tries again
    settled_.notify_all();
    lock.unlock();
    raise(ErrorCode::kUnsupported, "BRAID_NCCL_REGISTER=yes, but NCCL {} could not register {} bytes at {}: {}",
          library_->version(), bytes, base, failure);
  }
  entry.state = Registration::State::kUnregistered;
  settled_.notify_all();
  const bool first = !std::exchange(warned_, true);
  lock.unlock();
  if (first) {
    BRAID_WARN("{} ({} bytes at {}); this range and any other NCCL refuses run unregistered, NCCL copying through "
               "its own buffers (BRAID_NCCL_REGISTER=try; =no skips registration, =yes makes this an error)",
               failure, bytes, base);
  } else {
    BRAID_DEBUG("{} ({} bytes at {}); the range runs unregistered", failure, bytes, base);
  }
  return false;
}

void NcclBackend::forget_registered(uint64_t key) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto found = registrations_.find(key);
  while (found != registrations_.end() && found->second.state == Registration::State::kPending) {
    settled_.wait(lock);
    found = registrations_.find(key);
  }
  if (found == registrations_.end()) return;
  const Registration registration = found->second;
  registrations_.erase(found);
  lock.unlock();
  if (registration.state == Registration::State::kRegistered) deregister(registration.handle, key);
}

void NcclBackend::deregister(void* handle, uint64_t key) noexcept {
  // After an abort (the watchdog's or a user's) the registrations went with the communicator.
  if (aborting_.load() || (watchdog_ != nullptr && watchdog_->expired())) return;
  try {
    const CallLock call(calls_);
    if (aborting_.load()) return;
    DeviceGuard guard(device_);
    const ncclResult_t result = library_->api().comm_deregister(comm_, handle);
    ++deregister_calls_;
    if (result != ncclSuccess) {
      BRAID_WARN("{} (registered range {})",
                 library_->failure_message(result, "ncclCommDeregister", comm_, rank_text_), key);
    }
  } catch (...) {
    // Never throws: it runs from forget_registered and the destructor.
  }
}

size_t NcclBackend::registered_count() const {
  if (aborted_.load()) return 0;  // NCCL dropped them with the aborted communicator
  std::lock_guard<std::mutex> lock(mutex_);
  size_t count = 0;
  for (const auto& [key, registration] : registrations_) {
    if (registration.state == Registration::State::kRegistered) ++count;
  }
  return count;
}

void NcclBackend::abort_communicator() noexcept {
  std::lock_guard<std::mutex> lock(abort_mutex_);
  if (aborted_.load()) return;
  aborting_ = true;  // from here no call enters NCCL
  try {
    std::unique_lock<std::shared_timed_mutex> calls(calls_, std::defer_lock);
    if (!calls.try_lock_for(std::chrono::duration<double>(kAbortWaitForCallsS))) {
      BRAID_WARN("NCCL rank {}: a call into NCCL has not returned within {} s of the abort; aborting the "
                 "communicator under it (NCCL's abort ends its wait)", rank_text_, kAbortWaitForCallsS);
    }
    DeviceGuard guard(device_);
    const ncclResult_t result = library_->api().comm_abort(comm_);
    if (result != ncclSuccess) BRAID_WARN("{}", library_->failure_message(result, "ncclCommAbort", nullptr, rank_text_));
  } catch (...) {
    // Never throws (the guard's and the log's failures included).
  }
  aborted_ = true;
}

void NcclBackend::abort() noexcept { abort_communicator(); }

// The first fatal failure stays the one raised: the watchdog's timeout, an asynchronous error already met, and only
// then an abort(); a communicator aborted is not asked for its errors any more.
void NcclBackend::check() {
  raise_if_expired();
  {
    std::lock_guard<std::mutex> lock(async_failure_mutex_);
    if (async_failure_) throw *async_failure_;
  }
  ncclResult_t async = ncclSuccess;
  {
    const CallLock call = enter_call();
    check_call(library_->api().comm_get_async_error(comm_, &async), "ncclCommGetAsyncError");
  }
  if (async == ncclSuccess || async == ncclInProgress) return;
  std::lock_guard<std::mutex> lock(async_failure_mutex_);
  if (!async_failure_) {
    async_failure_.emplace(nccl_error_code(async),
                           library_->failure_message(async, "an operation of the NCCL communicator (ncclCommGetAsyncError)",
                                                     comm_, rank_text_));
  }
  throw *async_failure_;
}

}  // namespace braid::detail
