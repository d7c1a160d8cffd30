#include "overlap/algorithm_trials.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace braid::detail {

AlgorithmTrials::AlgorithmTrials(int candidates, size_t samples)
    : samples_(samples),
      times_(std::max(candidates, 1)),
      in_flight_(times_.size()),
      refused_(times_.size()),
      settled_(candidates <= 1 || samples == 0) {}

int AlgorithmTrials::next() const {
  if (settled_) return -1;
  int next = -1;
  size_t fewest = samples_;
  for (size_t i = 0; i < times_.size(); ++i) {
    const size_t taken = times_[i].size() + in_flight_[i];
    if (!refused_[i] && taken < fewest) {
      fewest = taken;
      next = static_cast<int>(i);
    }
  }
  return next;
}

void AlgorithmTrials::started(int candidate) { ++in_flight_.at(candidate); }

void AlgorithmTrials::finished(int candidate, float seconds) {
  if (in_flight_.at(candidate) == 0) throw std::logic_error("AlgorithmTrials: a trial ended that never started");
  --in_flight_[candidate];
  times_[candidate].push_back(seconds);
}

void AlgorithmTrials::refused(int candidate) {
  if (candidate == 0) throw std::logic_error("AlgorithmTrials: the first candidate cannot be refused");
  refused_.at(candidate) = true;
}

float AlgorithmTrials::median(int candidate) const {
  std::vector<float> times = times_[candidate];
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

bool AlgorithmTrials::settle() {
  if (settled_) return true;
  for (size_t i = 0; i < times_.size(); ++i) {
    if (!refused_[i] && times_[i].size() < samples_) return false;
  }
  for (size_t i = 1; i < times_.size(); ++i) {
    if (!refused_[i] && median(static_cast<int>(i)) < median(chosen_)) chosen_ = static_cast<int>(i);
  }
  settled_ = true;
  return true;
}

std::string AlgorithmTrials::medians_us() const {
  std::string text;
  for (size_t i = 0; i < times_.size(); ++i) {
    if (i != 0) text += ' ';
    text += refused_[i] || times_[i].empty() ? std::string("-") : fmt::format("{:.1f}", median(static_cast<int>(i)) * 1e6f);
  }
  return text;
}

}  // namespace braid::detail
