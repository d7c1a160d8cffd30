// Which candidate a GEMM shape runs (one of cuBLASLt's algorithms, or braid's Hopper GEMM): the bookkeeping of its
// timed trials (NOTE [GEMM algorithm choice] in cublaslt.cpp), host-only. The runner times the runs; this decides which candidate each run tries and which one
// the shape keeps.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace braid::detail {

class AlgorithmTrials {
 public:
  // `candidates` in the runner's order (at least 1: cuBLASLt's, then braid's Hopper GEMM where offered), `samples`
  // timed runs of each before the shape settles. One candidate: settled from the start.
  AlgorithmTrials(int candidates, size_t samples);

  // The candidate the next timed run tries: the one with the fewest times, read and in flight (the first on a tie);
  // -1 once every candidate has its samples read or in flight, or once settled.
  int next() const;
  void started(int candidate);                 // a timed run of `candidate` is in flight
  void finished(int candidate, float seconds);  // one of them ended, taking `seconds`
  // `candidate` could not be launched: it is never tried again nor kept (candidate 0 cannot be refused).
  void refused(int candidate);
  // Settles once every candidate has its samples read: the lowest median (the first on a tie) is kept. Returns
  // whether the shape is settled.
  bool settle();

  bool settled() const { return settled_; }
  int chosen() const { return chosen_; }  // what a run takes that times nothing: 0 until settled
  // "m0 m1 ..." the candidates' medians in microseconds ("-" for one refused or not read yet).
  std::string medians_us() const;

 private:
  float median(int candidate) const;

  size_t samples_;
  std::vector<std::vector<float>> times_;  // seconds, per candidate
  std::vector<size_t> in_flight_;
  std::vector<bool> refused_;
  int chosen_ = 0;
  bool settled_;
};

}  // namespace braid::detail
