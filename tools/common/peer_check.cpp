#include "peer_check.hpp"

#include <cuda_runtime_api.h>

#include <random>
#include <sstream>
#include <stdexcept>

namespace braid::check {
namespace {

void cuda(cudaError_t result, const char* what) {
  if (result != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(result));
}

char* bytes_at(void* base, size_t offset) { return static_cast<char*>(base) + offset; }

}  // namespace

const char* route_name(Route route) { return route == Route::kPeerPointer ? "peer pointers" : "contiguous view"; }

uint64_t fresh_seed() {
  std::random_device entropy;
  return (static_cast<uint64_t>(entropy()) << 32) ^ entropy();
}

uint64_t PeerWriteReport::wrong_bytes() const {
  uint64_t total = 0;
  for (const PatternCheck& check : received) total += check.wrong;
  return total;
}

std::string PeerWriteReport::describe_failures(int rank) const {
  std::ostringstream text;
  for (size_t writer = 0; writer < received.size(); ++writer) {
    const PatternCheck& check = received[writer];
    if (check.wrong == 0) continue;
    text << "rank " << rank << ": " << check.wrong << " of " << region_bytes << " bytes from rank " << writer
         << " (through " << route_name(route) << ") wrong; first at byte " << check.first_bad << ": expected "
         << check.expected << ", got " << check.got << "\n";
  }
  return text.str();
}

std::vector<uint64_t> exchange_through_peers(Communicator& comm, uint64_t mine) {
  cuda(cudaSetDevice(comm.device()), "cudaSetDevice");
  SymmetricMemory slots = comm.alloc(sizeof(uint64_t) * comm.size());
  for (int peer = 0; peer < comm.size(); ++peer) {
    cuda(cudaMemcpy(bytes_at(slots.peer(peer), sizeof(uint64_t) * comm.rank()), &mine, sizeof(mine), cudaMemcpyDefault),
         "cudaMemcpy to peer");
  }
  comm.barrier();
  std::vector<uint64_t> values(comm.size());
  cuda(cudaMemcpy(values.data(), slots.local(), sizeof(uint64_t) * comm.size(), cudaMemcpyDefault), "cudaMemcpy");
  comm.barrier();  // nobody frees `slots` while a peer still writes
  return values;
}

PeerWriteReport peers_write_owners_check(Communicator& comm, size_t region, Route route) {
  const int world = comm.size(), me = comm.rank();
  cuda(cudaSetDevice(comm.device()), "cudaSetDevice");
  AllocOptions options;
  options.contiguous_view = route == Route::kContiguousView;
  SymmetricMemory memory = comm.alloc(region * world, options);
  const uint64_t seed = fresh_seed();
  std::vector<uint64_t> seeds = exchange_through_peers(comm, seed);

  poison(memory.local(), region * world, nullptr);
  cuda(cudaDeviceSynchronize(), "poison");
  comm.barrier();  // every owner poisoned before anyone writes
  for (int owner = 0; owner < world; ++owner) {
    void* target = route == Route::kPeerPointer ? bytes_at(memory.peer(owner), region * me)
                                                : bytes_at(memory.view(), memory.view_stride() * owner + region * me);
    write_pattern(target, region, seed, me, owner, nullptr);
  }
  cuda(cudaDeviceSynchronize(), "write_pattern");
  comm.barrier();  // every write landed before anyone checks
  PeerWriteReport report;
  report.region_bytes = region;
  report.route = route;
  for (int writer = 0; writer < world; ++writer) {
    report.received.push_back(check_pattern(bytes_at(memory.local(), region * writer), region, seeds[writer], writer, me, nullptr));
  }
  comm.barrier();  // nobody frees while a peer still checks
  return report;
}

}  // namespace braid::check
