#include "smoke.hpp"

#include <cstdio>
#include <vector>

#include "peer_check.hpp"

namespace braid::bench {

uint64_t smoke_run(Communicator& comm, size_t min_bytes, size_t max_bytes, size_t factor) {
  using braid::check::Route;
  if (comm.rank() == 0) {
    std::printf("# braid-bench symmetric-memory smoke run: %d ranks\n%s", comm.size(), comm.describe().c_str());
    std::printf("# every rank writes a fresh random pattern into its region of every peer's buffer; every rank checks\n");
    std::printf("# the regions it received (poisoned first). wrong = bytes wrong summed over all ranks.\n");
    std::printf("%14s  %-16s  %6s  %10s  %s\n", "region_bytes", "route", "ranks", "wrong", "result");
  }
  uint64_t wrong_total = 0;
  for (size_t region = min_bytes; region <= max_bytes; region *= factor) {
    for (Route route : {Route::kPeerPointer, Route::kContiguousView}) {
      for (size_t bytes : {region, region + 3}) {  // aligned and odd sizes
        braid::check::PeerWriteReport report = braid::check::peers_write_owners_check(comm, bytes, route);
        std::fputs(report.describe_failures(comm.rank()).c_str(), stderr);
        std::vector<uint64_t> wrong = braid::check::exchange_through_peers(comm, report.wrong_bytes());
        uint64_t sum = 0;
        for (uint64_t w : wrong) sum += w;
        wrong_total += sum;
        if (comm.rank() == 0) {
          std::printf("%14zu  %-16s  %6d  %10llu  %s\n", bytes, braid::check::route_name(route), comm.size(),
                      static_cast<unsigned long long>(sum), sum == 0 ? "ok" : "WRONG");
          std::fflush(stdout);
        }
      }
    }
    if (factor < 2) break;
  }
  if (comm.rank() == 0) {
    std::printf("# %s\n", wrong_total == 0 ? "smoke run passed: every byte arrived at every owner"
                                           : "smoke run FAILED: some bytes did not arrive");
  }
  return wrong_total;
}

}  // namespace braid::bench
