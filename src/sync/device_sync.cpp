#include "sync/device_sync.hpp"

#include <cuda_runtime_api.h>

#include <atomic>
#include <cmath>
#include <string>
#include <vector>

#include "core/capture_mode.hpp"
#include "core/cuda_check.hpp"
#include "core/device_guard.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/private_copy.hpp"

namespace braid {

const char* wait_site_name(unsigned int site) {
  switch (site) {
    case kSiteEntryBarrier: return "entry barrier";
    case kSiteMiddleBarrier: return "middle barrier";
    case kSiteExitBarrier: return "exit barrier";
    case kSiteFifoData: return "wait for a pipeline piece";
    case kSiteFifoCredit: return "wait for a free pipeline slot";
    case kSiteLLData: return "LL line poll";
    case kSiteMoeRows: return "MoE rows round";
    case kSiteMoeCounts: return "MoE routing counts";
    case kSiteExchangeBarrier: return "barrier before a registered buffer's exchange";
    case kSiteMoeCountsCleared: return "wait for block 0 to clear the MoE expert counts";
    case kSiteExchangeRows: return "wait for a peer's rows of the reduce-scatter in the GEMM's epilogue";
    case kSiteExchangeFreed: return "wait for a peer to have read the previous call's rows";
    case kSiteGatheredRows: return "wait for a peer's rows of A, gathered under the GEMM's loads";
    case kSiteProductRows: return "wait for this rank's GEMM to store a chunk of a peer's rows";
  }
  return "wait";
}

namespace {

// The fields of a published word (no kernel writes them while it is claimed); `claimed` left 0.
device::ErrorWord fields_of(const device::ErrorWord& word, unsigned int code) {
  device::ErrorWord seen{};
  seen.code = code;
  seen.collective = word.collective;
  seen.site = word.site;
  seen.rank = word.rank;
  seen.peer = word.peer;
  seen.channel = word.channel;
  seen.waited_ns = word.waited_ns;
  seen.value = word.value;
  seen.limit = word.limit;
  return seen;
}

// What a timed-out wait saw of its peer (device::WaitProgress), as a sentence; empty where it told nothing.
std::string wait_progress_text(const device::ErrorWord& error) {
  if (error.limit == 0) return "";
  if (error.site == kSiteLLData) {
    // Flags are the LL calls' numbers cut to 32 bits; 0: a line never written.
    const auto held = static_cast<uint32_t>(error.value), needed = static_cast<uint32_t>(error.limit);
    if (held == 0) {
      return fmt::format(" The line had never been written; this call is the communicator's LL call {}.", needed);
    }
    return fmt::format(" The line held LL call {}'s flag; this call is the communicator's LL call {}.", held, needed);
  }
  return fmt::format(" Rank {}'s signal count on that channel was {}; the wait needed {}.", error.peer, error.value,
                     error.limit);
}

}  // namespace

device::ErrorWord read_error_word(device::ErrorWord* word) {
  // Acquire: the fields the kernel wrote before its release of the code are visible after this load.
  const unsigned int code = std::atomic_ref<unsigned int>(word->code).load(std::memory_order_acquire);
  if (code == 0) return device::ErrorWord{};
  return fields_of(*word, code);
}

device::ErrorWord take_error_word(device::ErrorWord* word) {
  std::atomic_ref<unsigned int> code_ref(word->code);
  if (code_ref.load(std::memory_order_acquire) == 0) return device::ErrorWord{};  // the common case: read only
  const unsigned int code = code_ref.exchange(0, std::memory_order_acq_rel);
  if (code == 0) return device::ErrorWord{};  // another caller took it
  const device::ErrorWord seen = fields_of(*word, code);
  // Last, after the copy and after code is 0: a kernel's next claim may now write the fields and the code.
  std::atomic_ref<unsigned int>(word->claimed).store(0, std::memory_order_release);
  return seen;
}

DeviceSync::DeviceSync(const std::shared_ptr<detail::MemoryContext>& memory, double timeout_s, int channels)
    : device_(memory->device), setup_stream_(memory->setup()) {
  const int world = memory->size;
  const size_t slots = static_cast<size_t>(channels) * world;
  // The counters, then two plan words per counter (device::plan_slot); zeroed, every peer's copy mapped.
  pad_memory_ = allocate_symmetric(memory, 3 * slots * sizeof(uint64_t), AllocOptions{});
  DeviceGuard guard(device_);
  BRAID_CUDA(cudaMalloc(reinterpret_cast<void**>(&expected_), slots * sizeof(uint64_t)));
  detail::fill_zeros_now(expected_, slots * sizeof(uint64_t), setup_stream_);  // NOTE [no device-wide waits]
  BRAID_CUDA(cudaMalloc(reinterpret_cast<void**>(&counters_), sizeof(Counters)));
  detail::fill_zeros_now(counters_, sizeof(Counters), setup_stream_);
  // Two words: [0] fatal failures, [1] refused data.
  BRAID_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&error_host_), 2 * sizeof(device::ErrorWord), cudaHostAllocMapped));
  BRAID_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&stop_value_), sizeof(unsigned int), cudaHostAllocDefault));
  *stop_value_ = 1;
  error_host_[0] = device::ErrorWord{};
  error_host_[1] = device::ErrorWord{};
  device::ErrorWord* error_device = nullptr;
  BRAID_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&error_device), error_host_, 0));

  pad_.local = static_cast<uint64_t*>(pad_memory_->peer_pointers[memory->rank]);
  pad_.peers = reinterpret_cast<uint64_t* const*>(pad_memory_->device_peer_pointers);
  pad_.expected = expected_;
  pad_.error = error_device;
  pad_.data_error = error_device + 1;
  pad_.rank = memory->rank;
  pad_.world = world;
  pad_.channels = channels;
  pad_.timeout_ns = static_cast<unsigned long long>(std::llround(timeout_s * 1e9));
  pad_.stopped = &counters_->stopped;
}

DeviceSync::~DeviceSync() {
  DeviceGuard guard(device_);
  // A stopped flag's copy still queued would land in counters_ after they are freed, perhaps in the next
  // communicator's, whose kernels would then act on nothing.
  if (stop_enqueued_.load()) cudaStreamSynchronize(setup_stream_);
  cudaFree(expected_);
  cudaFree(counters_);
  cudaFreeHost(error_host_);
  cudaFreeHost(stop_value_);
}

void DeviceSync::grant_credits(int first, int count, uint64_t credits) {
  if (first < 0 || count < 0 || first + count > pad_.channels) {
    raise(ErrorCode::kInternal, "credit channels [{}, {}) outside the pad's {}", first, first + count, pad_.channels);
  }
  const std::vector<uint64_t> below_zero(static_cast<size_t>(count) * pad_.world, uint64_t(0) - credits);
  DeviceGuard guard(device_);
  detail::copy_to_device_now(expected_ + static_cast<size_t>(first) * pad_.world, below_zero.data(),
                             below_zero.size() * sizeof(uint64_t), setup_stream_);
}

bool DeviceSync::publish_failure(unsigned int code, int peer, long long value) {
  // The word first, the flag's copy after it and never waited for (verify/models/host_failure.pml): a kernel that
  // gives its call up marks the rank stopped itself, so the kernel behind it starts stopped however late this copy
  // lands. It may land late: on a GPU that ranks of one process share, the copy can sit in a hardware queue behind
  // a kernel that spins until it sees this code.
  device::ErrorWord& word = *error_host_;
  unsigned int free = 0;
  // The claim kernels make (claim_error_word), from the host: one of them or this thread wins the word.
  const bool won = std::atomic_ref<unsigned int>(word.claimed).compare_exchange_strong(free, 1u,
                                                                                       std::memory_order_acquire);
  if (won) {
    word.collective = 0;
    word.site = 0;
    word.rank = pad_.rank;
    word.peer = peer;
    word.channel = -1;
    word.waited_ns = 0;
    word.value = value;
    word.limit = 0;
    std::atomic_ref<unsigned int>(word.code).store(code, std::memory_order_release);
  }
  if (!stop_enqueued_.exchange(true)) {  // kernels that start later act on nothing (NOTE [stopped ranks])
    RelaxedCaptureMode relaxed;  // another thread of the process may be capturing
    DeviceGuard guard(device_);
    // Pinned source: the copy is asynchronous and enqueues without waiting for the stream.
    cudaMemcpyAsync(&counters_->stopped, stop_value_, sizeof *stop_value_, cudaMemcpyHostToDevice, setup_stream_);
  }
  return won;
}

void DeviceSync::set_ll_epoch_for_testing(uint64_t calls_so_far) {
  DeviceGuard guard(device_);
  BRAID_CUDA(cudaMemcpy(&counters_->ll_epoch, &calls_so_far, sizeof calls_so_far, cudaMemcpyHostToDevice));
}

void DeviceSync::raise_recorded_error(const char* (*collective_name)(unsigned int),
                                      std::string (*describe_plan)(uint64_t)) const {
  const device::ErrorWord error = read_error_word(error_host_);  // never cleared: the communicator is unusable
  if (error.code == device::kErrorPlanMismatch) {
    auto plan = [&](long long word) {
      return describe_plan != nullptr ? describe_plan(static_cast<uint64_t>(word)) : fmt::format("0x{:016x}", word);
    };
    // Against a stopped peer the call was never in question: the peer's own failure came first.
    const char* advice = static_cast<uint64_t>(error.limit) == device::kStoppedPlan
                             ? ""
                             : " Every rank must make the call with the same count, datatype, op and root, and pass "
                               "the same kind of buffer (symmetric memory at the same offset, a registered buffer, "
                               "or neither) on every rank, with the same BRAID_ALGO.";
    raise(ErrorCode::kMismatch,
          "{}: ranks {} and {} ran different plans for one call: rank {} {}; rank {} {}.{} Nothing of the peers' "
          "data was used. The communicator is unusable; destroy it.",
          collective_name(error.collective), error.rank, error.peer, error.rank, plan(error.value), error.peer,
          plan(error.limit), advice);
  }
  if (error.code == device::kErrorPeerExited) {
    raise(ErrorCode::kRemoteError,
          "rank {}'s process (pid {}) exited while rank {} still used the communicator: every wait on it has "
          "ended. The communicator is unusable; destroy it (the survivors may make a new one).",
          error.peer, error.value, error.rank);
  }
  if (error.code == device::kErrorRevoked) {
    raise(ErrorCode::kRevoked, "rank {} revoked the communicator (Communicator::revoke); destroy it", error.peer);
  }
  if (error.code == device::kErrorAborted) {
    raise(ErrorCode::kAborted, "rank {} aborted the communicator (Communicator::abort); destroy it", error.rank);
  }
  if (error.code != 0 && error.peer == error.rank) {  // a wait within this rank's own kernel
    raise(ErrorCode::kTimeout,
          "{}: rank {} waited {:.1f} s at the {} (channel {}) and gave up: its own kernel did not get there within "
          "the timeout. The communicator is unusable; destroy it.",
          collective_name(error.collective), error.rank, error.waited_ns * 1e-9, wait_site_name(error.site),
          error.channel);
  }
  if (error.code != 0) {
    raise(ErrorCode::kTimeout,
          "{}: rank {} waited {:.1f} s for rank {} at the {} (channel {}) and gave up: rank {} did not arrive within "
          "the timeout.{} The communicator is unusable; destroy it.",
          collective_name(error.collective), error.rank, error.waited_ns * 1e-9, error.peer,
          wait_site_name(error.site), error.channel, error.peer, wait_progress_text(error));
  }
}

void DeviceSync::raise_refused_data(const char* (*collective_name)(unsigned int)) const {
  // Taken out, so raised once: the kernel kept its counters in step, so the communicator goes on.
  const device::ErrorWord seen = take_error_word(error_host_ + 1);
  if (seen.code == 0) return;
  const char* name = collective_name(seen.collective);
  switch (seen.code) {
    case device::kErrorOverflow:
      // all_to_allv_device: elements against recv_capacity; MoE dispatch: receive rows, alignment padding
      // included, against the shape's capacity_rows.
      raise(ErrorCode::kInvalidArgument,
            "{}: rank {} was sent {} elements (MoE dispatch: receive rows, alignment padding included) in total but "
            "its receive capacity (recv_capacity; MoE: the shape's capacity_rows) is {}; nothing was written to its "
            "receive buffer (the received counts and offsets were)",
            name, seen.rank, seen.value, seen.limit);
    case device::kErrorCountMismatch:
      raise(ErrorCode::kMismatch,
            "{}: rank {} expected {} elements from rank {}, which sent {}; nothing from rank {} was written", name,
            seen.rank, seen.limit, seen.peer, seen.value, seen.peer);
    case device::kErrorSizeMismatch:
      raise(ErrorCode::kMismatch,
            "{}: rank {} expected {} bytes from rank {}, which sent {} bytes; nothing of that pair was written", name,
            seen.rank, seen.limit, seen.peer, seen.value);
    case device::kErrorNegativeCount:
      raise(ErrorCode::kInvalidArgument,
            "{}: rank {} was given send count {} for rank {} (below zero, or more bytes than 64 bits hold); nothing "
            "was sent there", name, seen.rank, seen.value, seen.peer);
    case device::kErrorBadExpert:
      raise(ErrorCode::kInvalidArgument,
            "{}: rank {} was given expert id {} in argument 'topk_idx'; ids must be in [-1, {}) (the pair was skipped)",
            name, seen.rank, seen.value, seen.limit);
    case device::kErrorRepeatedExpert:
      raise(ErrorCode::kInvalidArgument,
            "{}: rank {} was given expert id {} twice for token {} in argument 'topk_idx'; a token's expert ids "
            "must be distinct (the repeated pair was skipped)",
            name, seen.rank, seen.value, seen.limit);
    case device::kErrorTooManyTokens:
      raise(ErrorCode::kInvalidArgument,
            "{}: rank {} was given {} tokens in argument 'num_tokens_device'; must be in [0, {}] (shape.max_tokens; "
            "nothing was sent)",
            name, seen.rank, seen.value, seen.limit);
    case device::kErrorNegativeDisplacement:
      raise(ErrorCode::kInvalidArgument,
            "{}: rank {} was given send displacement {} for rank {} (below zero, or past 64 bits of bytes with its "
            "count); nothing was sent there", name, seen.rank, seen.value, seen.peer);
  }
  raise(ErrorCode::kInternal, "{}: rank {} recorded unknown device error code {}", name, seen.rank, seen.code);
}

}  // namespace braid
