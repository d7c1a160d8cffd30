#include "memory/automatic_registration.hpp"

#include "core/config.hpp"
#include "core/cuda_driver.hpp"
#include "core/device_guard.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "memory/memory_context.hpp"
#include "memory/registration.hpp"
#include "memory/shareable.hpp"

namespace braid::detail {
namespace {

// Automatic registrations key the peers' mapping caches by their allocation's CUDA buffer id, unique in the
// process for its life, with this bit set: registration ids count up from 1 and never reach it.
constexpr uint64_t kAutomaticIdBit = uint64_t(1) << 63;

// This rank's buffer described for the exchange, or nullopt when it cannot be shared (host, managed or another
// GPU's memory, cudaMallocAsync memory of any pool): the call then runs staged on every rank.
std::optional<MemoryDescriptor> describe_automatic(const void* pointer, size_t bytes, int device) {
  MemoryDescriptor mine;
  try {
    mine = describe_shareable("automatic registration", "buffer", pointer, bytes, device);
  } catch (const Error& error) {
    BRAID_DEBUG("automatic registration: {} ({} bytes) cannot be shared; the call runs staged: {}", pointer, bytes,
                error.what());
    return std::nullopt;
  }
  DeviceGuard guard(device);
  unsigned long long buffer_id = 0;
  const CUresult got = driver().cuPointerGetAttribute(&buffer_id, CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                                      reinterpret_cast<CUdeviceptr>(pointer));
  if (got != CUDA_SUCCESS || (buffer_id & kAutomaticIdBit) != 0) {
    BRAID_DEBUG("automatic registration: {} has no CUDA buffer id; the call runs staged", pointer);
    return std::nullopt;
  }
  mine.id = kAutomaticIdBit | buffer_id;
  return mine;
}

}  // namespace

bool automatic_registration_on() {
  static const bool on = Config::get().string("BRAID_AUTO_REGISTER").value_or("1") == "1";
  return on;
}

std::optional<AutomaticRange> exchange_automatically(MemoryContext& state, const void* pointer, size_t bytes,
                                                     const std::function<void()>& before_exchange) {
  const std::optional<MemoryDescriptor> mine = describe_automatic(pointer, bytes, state.device);
  before_exchange();
  std::optional<ExchangedTable> table = exchange_tables(state, mine ? &*mine : nullptr, reinterpret_cast<uintptr_t>(pointer),
                                                        "automatic registration exchange", true);
  if (!table) {
    state.registrations->count_automatic_exchange();
    return std::nullopt;
  }
  state.registrations->remember_automatic(*table);
  BRAID_DEBUG("automatic registration of {} ({} bytes): peers' mappings exchanged", pointer, bytes);
  auto mappings = std::make_shared<const std::vector<std::shared_ptr<PeerMapping>>>(std::move(table->mappings));
  return AutomaticRange{table->range, std::move(mappings)};
}

}  // namespace braid::detail
