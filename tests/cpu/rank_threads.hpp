// The CPU tests' ranks as threads of the test process.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <thread>
#include <vector>

#include "braid/error.hpp"

namespace braid {

// Runs body(rank) on one thread per rank in `ranks`; a braid::Error escaping a rank fails the test, naming it.
inline void run_ranks(const std::vector<int>& ranks, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (int rank : ranks) {
    threads.emplace_back([&body, rank] {
      try {
        body(rank);
      } catch (const Error& error) {
        ADD_FAILURE() << "rank " << rank << ": " << error.what();
      }
    });
  }
  for (auto& thread : threads) thread.join();
}

// 0, 1, ..., size - 1.
inline std::vector<int> all_ranks(int size) {
  std::vector<int> ranks(size);
  for (int r = 0; r < size; ++r) ranks[r] = r;
  return ranks;
}

}  // namespace braid
