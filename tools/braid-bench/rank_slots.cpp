#include "rank_slots.hpp"

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "options.hpp"

namespace braid::bench {

void gather_slots(Communicator& comm, const Slot* slots, size_t count, int average, Slot* total) {
  const size_t bytes = sizeof(Slot) * count;
  const std::vector<std::string> all = comm.host_allgather(std::string(reinterpret_cast<const char*>(slots), bytes));
  std::vector<std::vector<double>> times(count);  // every rank's, in rank order
  std::vector<Slot> theirs(count);
  for (size_t i = 0; i < count; ++i) total[i] = Slot{};
  for (const std::string& text : all) {
    if (text.size() != bytes) throw std::runtime_error("a rank's results arrived truncated");
    std::memcpy(theirs.data(), text.data(), bytes);
    for (size_t i = 0; i < count; ++i) {
      times[i].push_back(theirs[i].time_us);
      total[i].wrong += theirs[i].wrong;
      total[i].state = theirs[i].state;
    }
  }
  for (size_t i = 0; i < count; ++i) total[i].time_us = combine_rank_times(times[i], average);
}

}  // namespace braid::bench
