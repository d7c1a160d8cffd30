// Host-side collectives among the ranks of one communicator, built on the store.
// Used at setup time (communicator init, symmetric allocation) and, through a Bootstrap of its own, by the large
// eager calls that learn where the peers' exposed buffers lie (NOTE [exchanged exposures],
// collectives/call_buffers.cpp).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bootstrap/store.hpp"

namespace braid {

class Bootstrap {
 public:
  // `prefix` is the communicator's namespace in the store (unique per communicator).
  Bootstrap(std::shared_ptr<StoreClient> store, std::string prefix, int rank, int size, double timeout_s);

  int rank() const { return rank_; }
  int size() const { return size_; }
  double timeout_s() const { return timeout_s_; }
  StoreClient& store() { return *store_; }
  const std::string& prefix() const { return prefix_; }

  // Every rank contributes `mine`; returns all contributions indexed by rank.
  // `what` names the operation in errors. On timeout: Error(kTimeout) naming the ranks that did not arrive,
  // e.g. "bootstrap allgather 'symmetric alloc' #3: rank(s) 2, 3 did not arrive within 30 s (store 127.0.0.1:2999)".
  // `poll` (optional) runs every kPollInterval_s while waiting, and may throw to end the wait (a failure the
  // communicator recorded); the wait stays bounded by the timeout. A store request of the call that fails (a lost
  // store, a wait the store client's interrupt ended) keeps its code, with the call's name before its message:
  // "bootstrap allgather 'symmetric alloc' #3: store ...".
  std::vector<std::string> allgather(const std::string& mine, const char* what = "allgather",
                                     const std::function<void()>& poll = {});
  static constexpr double kPollInterval_s = 0.05;
  // Returns root's `value` on every rank (others pass anything).
  std::string broadcast(const std::string& value, int root, const char* what = "broadcast");
  void barrier(const char* what = "barrier");

 private:
  std::shared_ptr<StoreClient> store_;
  std::string prefix_;
  int rank_;
  int size_;
  double timeout_s_;
  uint64_t sequence_ = 0;  // calls are collective, so every rank's sequence agrees
};

}  // namespace braid
