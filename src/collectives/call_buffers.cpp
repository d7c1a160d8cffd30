#include "collectives/call_buffers.hpp"

#include <string>
#include <vector>

#include "collectives/announced_calls.hpp"
#include "collectives/collective_context.hpp"
#include "collectives/exchanged_posts.hpp"
#include "kernels/kernels.hpp"
#include "core/capture_mode.hpp"
#include "core/cuda_check.hpp"
#include "core/device_guard.hpp"
#include "core/private_copy.hpp"
#include "memory/automatic_registration.hpp"
#include "memory/deferred_release.hpp"

namespace braid::collectives {
namespace {

struct Exchange {
  Collective collective;
  ExchangedBuffer buffer;
  size_t bytes;
  ExchangeKind kind;
};

// Returns once every peer is about to exchange the same buffer; else throws (kMismatch, or kTimeout), the failure
// recorded for the whole communicator.
void agree_on_exchange(CollectiveContext& state, const Exchange& exchange) {
  const auto [collective, buffer, bytes, kind] = exchange;
  RelaxedCaptureMode relaxed;  // a capture may be running, here or in another rank's thread
  DeviceGuard guard(state.device);
  const cudaStream_t stream = state.exchange_stream->get();
  state.order.follow_eager(stream);  // the pad's counters where the communicator's eager calls left them
  kernels::launch_barrier(state.sync->pad(), static_cast<unsigned int>(collective), kSiteExchangeBarrier,
                          exchange_plan_word(collective, buffer, bytes, kind), stream);
  BRAID_CUDA(cudaStreamSynchronize(stream));  // bounded: the barrier gives up at the communicator's timeout
  state.sync->raise_recorded_error(collective_name, describe_plan);
}

// Runs once the graph is destroyed and its launches complete; releases on a thread where CUDA calls are allowed.
void release_graph_held(void* owned) {
  auto* held = static_cast<std::shared_ptr<const void>*>(owned);
  detail::release_later(std::move(*held));
  delete held;
}

// `graph` holds `mappings` for as long as it (or an executable graph made from it) exists.
void hold_in_graph(cudaGraph_t graph, std::shared_ptr<const void> mappings) {
  RelaxedCaptureMode relaxed;
  auto* held = new std::shared_ptr<const void>(std::move(mappings));
  cudaUserObject_t object = nullptr;
  if (cudaError_t error = cudaUserObjectCreate(&object, held, release_graph_held, 1, cudaUserObjectNoDestructorSync);
      error != cudaSuccess) {
    delete held;
    BRAID_CUDA(error);
  }
  // The graph takes the one reference.
  if (cudaError_t error = cudaGraphRetainUserObject(graph, object, 1, cudaGraphUserObjectMove); error != cudaSuccess) {
    cudaUserObjectRelease(object, 1);
    BRAID_CUDA(error);
  }
}

// NOTE [exchanged exposures]
// An eager call's kernels learn where the peers' buffers lie at their entry barrier (announcing kernels), too late for
// the copy engines, whose copies the host enqueues with every address. So at the sizes where the engines pay (NOTE
// [exchanged sizes], selection.cpp) every rank gathers every rank's announcement of the buffer on the host first
// (exposure_exchange, a mailbox in shared memory) and forms the peers' addresses from its exposure table: the call then plans as
// one on buffers peers map, every rank from the same words, or, where any rank's buffer is not exposed, or where the
// ranks differ in whether the call runs in place (a reduce-scatter's plan depends on it), as before. Every rank
// exchanges for the same calls (the switch, the world, the collective and the buffer's size are the same everywhere;
// symmetric buffers too), in the communicator's call order; posts of different calls fail the call with kMismatch on
// every rank that exchanged, before anything is enqueued. A peer's range stays mapped until the call has ended: its
// owner withdraws it only after its own calls have, and the owner's call ends after this rank's copies into or from it.
// The exchange waits for every peer's host (bounded by the timeout, ended early by a failure the communicator recorded
// or by abort).
std::optional<PeerRange> exchanged_exposure_range(CollectiveContext& state, Collective collective,
                                                  ExchangedBuffer buffer, const void* pointer, size_t bytes,
                                                  bool in_place, bool symmetric) {
  // A symmetric buffer posts nothing to map (its call takes its symmetric range), so it is never exposed itself.
  const uint64_t mine = symmetric ? kernels::kAnnouncedStaged : announcement_of(state, pointer, bytes, 16);
  CollectiveContext* const communicator = &state;
  const std::vector<std::string> posts = state.exposure_exchange->allgather(
      exchanged_post(collective, buffer, bytes, in_place, mine), "eager call's buffer",
      [communicator] { communicator->sync->raise_recorded_error(collective_name, describe_plan); });
  const ExchangedPosts read = read_exchanged_posts(posts, state.rank);
  const std::vector<uint64_t>& words = read.words;
  if (!read.same_placement) return std::nullopt;  // in place on some ranks only
  PeerRange range{};
  range.aligned16 = true;  // an exposed announcement starts on 16 bytes (announcement_of)
  range.same_process_peers = false;
  range.identity = 0xcbf29ce484222325ull;  // FNV-1a of every rank's word: the same on every rank
  for (int r = 0; r < state.size; ++r) {
    const uint64_t word = words[r];
    range.identity = (range.identity ^ word) * 0x100000001b3ull;
    if (word == kernels::kAnnouncedStaged) return std::nullopt;
    if (r == state.rank) {
      range.buffers.at[r] = static_cast<char*>(const_cast<void*>(pointer));
      continue;
    }
    const uint64_t id = word >> kernels::kAnnouncedOffsetBits;
    const std::optional<uintptr_t> base = state.exposures->imported(r, id);
    if (!base) {  // an owner posts only a range every peer mapped, and withdraws it only after its calls end
      raise(ErrorCode::kInternal, "rank {} passed its exposed range {}, which rank {} does not hold", r, id,
            state.rank);
    }
    range.buffers.at[r] = reinterpret_cast<char*>(*base + (word & kernels::kAnnouncedOffsetMask));
  }
  return range;
}

}  // namespace

std::optional<PeerRange> call_buffer_range(CollectiveContext& state, Collective collective, ExchangedBuffer buffer,
                                           const void* pointer, size_t bytes, bool in_place) {
  // BRAID_EAGER_ZERO_COPY: registered buffers serve eager calls through their exposure (announcing kernels), never
  // through an exchange, so the ranks' registrations need not match; symmetric memory is found as ever. Exposures
  // exist only beyond one rank: one rank finds its registrations as without the switch.
  if (state.eager_zero_copy && state.exposures != nullptr && state.order.call_graph() == nullptr) {
    std::optional<PeerRange> symmetric = find_symmetric_range(state.memory, pointer, bytes);
    std::optional<PeerRange> exchanged;  // every rank joins, symmetric buffer or not (NOTE [exchanged exposures])
    if (state.exposure_exchange != nullptr && exchanging_pays(collective, bytes)) {
      exchanged = exchanged_exposure_range(state, collective, buffer, pointer, bytes, in_place, symmetric.has_value());
    }
    return symmetric ? symmetric : exchanged;
  }
  // Two pointers, which std::function holds without allocating: every call builds the hook, few run it.
  CollectiveContext* const communicator = &state;
  const Exchange registered{collective, buffer, bytes, ExchangeKind::kRegistered};
  const Exchange* const first_use = &registered;
  std::optional<PeerRange> found = find_peer_range(
      state.memory, pointer, bytes, [communicator, first_use] { agree_on_exchange(*communicator, *first_use); });
  if (found || bytes == 0 || !detail::automatic_registration_on()) return found;
  const cudaGraph_t graph = state.order.call_graph();  // the call's ordering scope asked CUDA already
  if (graph == nullptr) return std::nullopt;            // eager calls of unregistered buffers are staged
  const Exchange automatic{collective, buffer, bytes, ExchangeKind::kAutomatic};
  const Exchange* const captured = &automatic;
  std::optional<detail::AutomaticRange> range = detail::exchange_automatically(
      state.memory, pointer, bytes, [communicator, captured] { agree_on_exchange(*communicator, *captured); });
  if (!range) return std::nullopt;
  hold_in_graph(graph, std::move(range->mappings));
  return range->range;
}

}  // namespace braid::collectives
