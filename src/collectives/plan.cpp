#include "collectives/plan.hpp"

#include <fmt/format.h>

#include "braid/device/sync_device.hpp"
#include "core/hash.hpp"

namespace braid::collectives {

namespace {
constexpr uint64_t kExchangeAlgorithmBits = 0xF;
constexpr uint64_t kHashBits = (uint64_t(1) << 48) - 1;
// Bits 48-54 of an exchange's word: the buffer, and whether the exchange is an automatic registration.
constexpr uint64_t kAutomaticExchangeBit = 4;
// Mixed into the hash of an announcing kernel's plan, so it never matches the staged plan of the same algorithm.
constexpr uint64_t kAnnouncedField = 0xA5A5'0A11'0CED'5A5Aull;
// Mixed into the hash of a call whose schedule in place differs from the one out of place.
constexpr uint64_t kInPlaceField = 0x1F1A'CE00'0D0E'5EEDull;
}  // namespace

uint64_t plan_word(const PlanArguments& plan) {
  uint64_t hash = mix64(plan.count);
  for (const uint64_t field : {plan.type, plan.op, static_cast<uint64_t>(plan.root), plan.send_identity, plan.recv_identity}) {
    hash = mix64(hash ^ field);
  }
  if (plan.announced) hash = mix64(hash ^ kAnnouncedField);
  if (plan.in_place) hash = mix64(hash ^ kInPlaceField);
  return (static_cast<uint64_t>(plan.algorithm) + 1) << 60 | (static_cast<uint64_t>(plan.collective) & 0xF) << 56 |
         static_cast<uint64_t>(plan.zero_copy) << 55 | (static_cast<uint64_t>(plan.blocks) & 0x7F) << 48 |
         (hash & kHashBits);
}

uint64_t exchange_plan_word(Collective collective, ExchangedBuffer buffer, uint64_t bytes, ExchangeKind kind) {
  const uint64_t field = static_cast<uint64_t>(buffer) | (kind == ExchangeKind::kAutomatic ? kAutomaticExchangeBit : 0);
  const uint64_t hash = mix64(mix64(bytes) ^ field);
  return kExchangeAlgorithmBits << 60 | (static_cast<uint64_t>(collective) & 0xF) << 56 | field << 48 | (hash & kHashBits);
}

std::string describe_plan(uint64_t word) {
  if (word == 0) return "no plan (a barrier outside the collectives)";
  if (word == device::kStoppedPlan) {
    return "none: it had stopped after a failure of its own (a mismatch, a timeout, a peer's exit, an abort or a "
           "revocation), which its own error names";
  }
  const unsigned int collective = static_cast<unsigned int>(word >> 56 & 0xF);
  if (word >> 60 == kExchangeAlgorithmBits) {
    const uint64_t field = word >> 48 & 0x7F;
    const char* buffer = (field & ~kAutomaticExchangeBit) == static_cast<uint64_t>(ExchangedBuffer::kSend) ? "send" : "recv";
    if (field & kAutomaticExchangeBit) {
      return fmt::format("{}: the automatic registration of an unregistered {} buffer in a captured call, whose "
                         "mappings the ranks exchange (arguments 0x{:012x})",
                         collective_name(collective), buffer, word & kHashBits);
    }
    return fmt::format("{}: the first use of a registered {} buffer at this address, whose mappings the ranks "
                       "exchange (arguments 0x{:012x})",
                       collective_name(collective), buffer, word & kHashBits);
  }
  const auto algorithm = static_cast<Algorithm>((word >> 60) - 1);
  const bool zero_copy = (word >> 55 & 1) != 0;
  const int blocks = static_cast<int>(word >> 48 & 0x7F);
  return fmt::format("{} {}{} with {} blocks (arguments and buffers 0x{:012x})", collective_name(collective),
                     algorithm_name(algorithm), zero_copy ? " zero copy" : "", blocks, word & kHashBits);
}

}  // namespace braid::collectives
