// Host side of device synchronisation: a communicator's signal pad (symmetric), the expected counts and the
// staging epoch (device memory), and the error word (host-mapped), made once at communicator init so that no
// collective allocates (graph capture).
#pragma once

#include <memory>
#include <string>

#include "braid/braid.hpp"
#include "braid/device/sync_device.hpp"

namespace braid {

// Wait sites and collective ids as the device reports them; names for messages live in one table.
enum WaitSite : unsigned int { kSiteEntryBarrier = 1, kSiteMiddleBarrier = 2, kSiteExitBarrier = 3 };
const char* wait_site_name(unsigned int site);

class DeviceSync {
 public:
  static constexpr int kMaxChannels = 64;

  DeviceSync(Communicator& comm, double timeout_s);
  ~DeviceSync();
  DeviceSync(const DeviceSync&) = delete;
  DeviceSync& operator=(const DeviceSync&) = delete;

  device::SignalPad pad() const { return pad_; }
  uint64_t* epoch() const { return epoch_; }               // staging parity counter, advanced by kernels
  unsigned int* blocks_done() const { return blocks_done_; }  // the last block of a launch advances epoch

  // Throws the failure a kernel recorded, if any (kTimeout naming collective, wait site and peer).
  // `collective_name` maps the recorded collective id to a name.
  void raise_recorded_error(const char* (*collective_name)(unsigned int)) const;

 private:
  SymmetricMemory pad_memory_;
  device::SignalPad pad_{};
  device::ErrorWord* error_host_ = nullptr;  // same memory as pad_.error, host view
  uint64_t* epoch_ = nullptr;
  unsigned int* blocks_done_ = nullptr;
  uint64_t* expected_ = nullptr;
  int device_ = -1;
};

}  // namespace braid
