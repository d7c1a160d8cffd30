// Host-side collectives over the store.
//
// Every call is collective and takes the next sequence number s (1, 2, ...); in call s each rank posts
// the key "<prefix>/<s>/<rank>" and waits (one store WAIT, one deadline) until every rank has posted.
// The operation's name is not part of the key, so a rank that names it differently still meets the
// others and the sequence stays the only thing ranks must agree on.
//
// Cleanup: after finishing call s a rank deletes its own key of call s-1. That is race-free because a
// rank finishes call s only after every rank has posted in call s, which each did only after finishing
// (and reading everything of) call s-1. So at most two calls' keys per rank exist at any time.
//
// broadcast posts from every rank too (non-roots post an empty string): it costs a few more keys but
// keeps the cleanup rule above valid for every call, and a timeout still names the root when it is
// the one missing.
#include "bootstrap/bootstrap.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <unordered_map>

#include "core/error.hpp"
#include "core/log.hpp"

namespace braid {
namespace {

std::string key_for(const std::string& prefix, uint64_t sequence, int rank) {
  return fmt::format("{}/{}/{}", prefix, sequence, rank);
}

// Runs a store request of the call `label` names (e.g. "allgather 'symmetric alloc' #3"): a failure (a lost store,
// a wait the client's interrupt ended: NOTE [ended host waits]) keeps its code, with the call named first.
template <typename Request>
auto on_store(const std::string& label, Request&& request) -> decltype(request()) {
  try {
    return request();
  } catch (const Error& error) {
    throw Error(error.code(), fmt::format("bootstrap {}: {}", label, error.what()));
  }
}

// Posts `mine` for call `sequence`, then waits until every rank has posted. Throws kTimeout naming the ranks that
// never posted.
void post_and_wait(Bootstrap& bootstrap, uint64_t sequence, const std::string& mine, const std::string& label,
                   const std::function<void()>& poll = {}) {
  const std::string& prefix = bootstrap.prefix();
  StoreClient& store = bootstrap.store();
  on_store(label, [&] { store.set(key_for(prefix, sequence, bootstrap.rank()), mine); });

  std::vector<std::string> others;
  std::unordered_map<std::string, int> rank_of_key;
  for (int rank = 0; rank < bootstrap.size(); ++rank) {
    if (rank == bootstrap.rank()) continue;
    others.push_back(key_for(prefix, sequence, rank));
    rank_of_key[others.back()] = rank;
  }
  std::vector<std::string> missing;
  if (!poll) {
    missing = on_store(label, [&] { return store.wait(others, bootstrap.timeout_s()); });
  } else {  // in slices, polling between them, within the same deadline
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(bootstrap.timeout_s());
    for (;;) {
      const double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
      missing = on_store(label, [&] {
        return store.wait(others, std::max(0.0, std::min(left, Bootstrap::kPollInterval_s)));
      });
      if (missing.empty() || left <= Bootstrap::kPollInterval_s) break;
      poll();
    }
  }
  if (missing.empty()) return;

  std::vector<int> missing_ranks;
  for (const std::string& key : missing) missing_ranks.push_back(rank_of_key.at(key));
  std::sort(missing_ranks.begin(), missing_ranks.end());
  raise(ErrorCode::kTimeout, "bootstrap {}: rank(s) {} did not arrive within {} s (store {})", label,
        fmt::join(missing_ranks, ", "), bootstrap.timeout_s(), store.address());
}

// Reads rank `rank`'s post of call `sequence`, known to exist (post_and_wait succeeded).
std::string read_post(Bootstrap& bootstrap, uint64_t sequence, int rank, const std::string& label) {
  std::optional<std::string> value =
      on_store(label, [&] { return bootstrap.store().try_get(key_for(bootstrap.prefix(), sequence, rank)); });
  if (!value) {
    raise(ErrorCode::kInternal, "bootstrap {}: rank {}'s post vanished before rank {} read it (store {})",
          label, rank, bootstrap.rank(), bootstrap.store().address());
  }
  return std::move(*value);
}

// After call `sequence` completed: every rank has finished call sequence-1, so our post there is dead.
void delete_previous_post(Bootstrap& bootstrap, uint64_t sequence, const std::string& label) {
  if (sequence > 1) {
    on_store(label, [&] { bootstrap.store().remove(key_for(bootstrap.prefix(), sequence - 1, bootstrap.rank())); });
  }
}

}  // namespace

Bootstrap::Bootstrap(std::shared_ptr<StoreClient> store, std::string prefix, int rank, int size, double timeout_s)
    : store_(std::move(store)), prefix_(std::move(prefix)), rank_(rank), size_(size), timeout_s_(timeout_s) {
  if (!store_) raise_invalid_argument("Bootstrap", "store", "is null");
  if (size_ < 1) raise_invalid_argument("Bootstrap", "size", "is {}; it must be at least 1", size_);
  if (rank_ < 0 || rank_ >= size_) {
    raise_invalid_argument("Bootstrap", "rank", "is {}, outside [0, {})", rank_, size_);
  }
  if (!(timeout_s_ > 0)) raise_invalid_argument("Bootstrap", "timeout_s", "is {}; it must be positive", timeout_s_);
}

std::vector<std::string> Bootstrap::allgather(const std::string& mine, const char* what,
                                              const std::function<void()>& poll) {
  const uint64_t sequence = ++sequence_;
  std::vector<std::string> result(size_);
  result[rank_] = mine;
  if (size_ == 1) return result;  // nobody to meet

  const std::string label = fmt::format("allgather '{}' #{}", what, sequence);
  post_and_wait(*this, sequence, mine, label, poll);
  for (int rank = 0; rank < size_; ++rank) {
    if (rank != rank_) result[rank] = read_post(*this, sequence, rank, label);
  }
  delete_previous_post(*this, sequence, label);
  return result;
}

std::string Bootstrap::broadcast(const std::string& value, int root, const char* what) {
  if (root < 0 || root >= size_) {
    raise_invalid_argument("Bootstrap::broadcast", "root", "is {}, outside [0, {})", root, size_);
  }
  const uint64_t sequence = ++sequence_;
  if (size_ == 1) return value;

  const std::string label = fmt::format("broadcast '{}' #{} from root {}", what, sequence, root);
  post_and_wait(*this, sequence, rank_ == root ? value : std::string(), label);
  std::string result = rank_ == root ? value : read_post(*this, sequence, root, label);
  delete_previous_post(*this, sequence, label);
  return result;
}

void Bootstrap::barrier(const char* what) {
  const uint64_t sequence = ++sequence_;
  if (size_ == 1) return;

  const std::string label = fmt::format("barrier '{}' #{}", what, sequence);
  post_and_wait(*this, sequence, std::string(), label);
  delete_previous_post(*this, sequence, label);
}

}  // namespace braid
