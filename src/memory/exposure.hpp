// A rank's registered ranges exposed to its peers one-sidedly (docs/dev/registration.md, "Eager zero copy on
// registered memory: the design"): the owner posts each new range to a helper thread of every peer, which imports
// it and answers; withdrawing a range makes every peer release it before the owner goes on. No peer's calling
// thread takes part. Host side only: where the imported ranges go for the peers' kernels, and waiting for the
// owner's own calls before a withdrawal, are the callers'.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bootstrap/store.hpp"
#include "memory/exposure_table.hpp"

namespace braid::detail {

// What a peer's helper does with a range it is sent: a CUDA import and release in the library, a fake in tests.
class ExposureImporter {
 public:
  virtual ~ExposureImporter() = default;
  // Maps the range `descriptor` names (a packed MemoryDescriptor of rank `owner`) into this rank; returns its
  // address here. Throws braid::Error where it cannot: the owner learns the reason.
  virtual uintptr_t import(int owner, uint64_t id, const std::string& descriptor) = 0;
  // Releases what import(owner, id, ...) made.
  virtual void release(int owner, uint64_t id) noexcept = 0;
};

// NOTE [exposure ids]
// An owner's ids are serial and never reused (NOTE [exposure mailboxes]), and range `id` lands in slot
// id % kExposureSlots of the owner's row of every peer's table (memory/exposure_table.hpp), which refuses a range
// whose slot another live range of the owner holds. So the owner skips the ids whose slot one of its ranges still
// holds: while it has fewer than kExposureSlots ranges exposed, however long one of them lives, a new range never
// meets a held slot. A range holds its slot from its exposure until a withdrawal every peer answered; one that a
// peer did not answer in time keeps it (that peer may still hold the range).
class ExposureIds {
 public:
  explicit ExposureIds(uint64_t slots = kExposureSlots) : slots_(slots) {}
  // The next id whose slot no held range holds, now holding it; where every slot is held, the next id, holding
  // nothing (the peers refuse it: the range stays staged).
  uint64_t take();
  // Range `id` was withdrawn everywhere: its slot is free (nothing where it holds none).
  void release(uint64_t id);
  size_t held() const { return held_.size(); }

 private:
  uint64_t slots_;
  uint64_t next_ = 1;
  std::map<uint64_t, uint64_t> held_;  // slot -> the id holding it
};

// NOTE [exposure mailboxes]
// Each rank's helper reads a mailbox in the store. A sender takes the next slot with an atomic add on
// "<prefix>/exposure/<rank>/slots" and writes its request at "<prefix>/exposure/<rank>/<slot>"; the helper reads
// the slots in order (a blocking get, then removes the slot), so one owner's withdrawal of a range is served after
// its exposure. Every answer has a key of its own, "<prefix>/exposure/answer/<owner>/<id>/<e|w>/<peer>", which
// the owner waits for and then removes. Ids are the owner's serial numbers, never reused, so a late answer can
// never be taken for another range's. A service that stops sets "<prefix>/exposure/gone/<rank>" once its helper
// has ended: an owner waiting for that rank's answer takes it as given (a withdrawal: the rank holds nothing any
// more once its importer is gone; an exposure: refused), rather than waiting out the timeout.
class ExposureService {
 public:
  // `connect` makes a store client; the service makes two, one for its helper and one for expose and withdraw.
  // `prefix`: the communicator's namespace in the store. timeout_s bounds each wait for the peers' answers.
  // Starts the helper.
  ExposureService(const std::function<std::unique_ptr<StoreClient>()>& connect, std::string prefix, int rank,
                  int size, double timeout_s, ExposureImporter& importer);
  // Stops the helper and tells the peers (NOTE [exposure mailboxes]). What it imported stays imported until the
  // importer releases it.
  ~ExposureService();
  ExposureService(const ExposureService&) = delete;
  ExposureService& operator=(const ExposureService&) = delete;

  struct Exposure {
    uint64_t id = 0;
    std::vector<int> refused;  // peers that could not import the range or did not answer in time
    std::string reasons;       // one line a refusing peer: "rank <peer>: <reason>"
    bool everywhere() const { return refused.empty(); }
  };
  // Posts `descriptor` under a new id to every peer and waits for their answers. Never throws for a peer's
  // refusal or silence: those are in the result. `before_post` (optional) is called with the new id before
  // anything is posted.
  Exposure expose(const std::string& descriptor, const std::function<void(uint64_t id)>& before_post = {});
  // Makes every peer release range `id` (one this rank exposed) and waits for every answer. Throws
  // Error(kTimeout) naming the peers that did not answer within the timeout.
  void withdraw(uint64_t id);
  // From any thread (Communicator::abort, a fatal failure the peer watch saw): expose and withdraw, waiting now or
  // later, raise Error(kAborted), or `code` with `reason` (NOTE [ended host waits]). The helper goes on answering
  // the peers.
  void interrupt() { caller_store_->interrupt(); }
  void interrupt(ErrorCode code, std::string_view reason) { caller_store_->interrupt(code, reason); }

  // Where this rank's helper mapped range `id` of `owner`, if it holds it.
  std::optional<uintptr_t> imported(int owner, uint64_t id) const;
  size_t imported_count() const;

 private:
  enum class Kind : char { kExpose = 'e', kWithdraw = 'w' };
  struct Request {
    Kind kind;
    int owner;
    uint64_t id;
    std::string descriptor;  // exposures only
  };
  static std::string pack(const Request& request);
  static std::optional<Request> unpack(const std::string& message);

  std::string slots_key(int rank) const;
  std::string slot_key(int rank, uint64_t slot) const;
  std::string answer_key(int owner, uint64_t id, Kind kind, int peer) const;
  std::string gone_key(int rank) const;

  // Posts `request` to every peer and waits for their answers: (peer, answer) for each that answered.
  std::vector<std::pair<int, std::string>> ask_peers(const Request& request, std::vector<int>& silent);
  void serve();  // the helper
  std::string handle(const Request& request);  // the answer to one request

  std::string prefix_;
  int rank_, size_;
  double timeout_s_;
  ExposureImporter& importer_;
  std::unique_ptr<StoreClient> helper_store_;
  std::unique_ptr<StoreClient> caller_store_;
  std::mutex caller_mutex_;  // expose and withdraw, from any thread
  ExposureIds ids_;          // under caller_mutex_ (NOTE [exposure ids])
  mutable std::mutex imported_mutex_;
  std::map<std::pair<int, uint64_t>, uintptr_t> imported_;  // (owner, id) -> address here
  std::atomic<bool> stopping_{false};
  std::thread helper_;
};

}  // namespace braid::detail
