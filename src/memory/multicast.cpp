#include "memory/multicast.hpp"

#include <unistd.h>

#include <cstdint>
#include <string>

#include "core/config.hpp"
#include "core/cuda_driver.hpp"
#include "core/log.hpp"
#include "memory/vmm.hpp"

namespace braid::detail {
namespace {

constexpr CUmemAllocationHandleType kHandleType = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;

// Name of a failed driver call for the warning, or "" on success.
std::string failure(CUresult result, const char* call) {
  if (result == CUDA_SUCCESS) return {};
  const char* name = nullptr;
  if (driver().cuGetErrorName == nullptr || driver().cuGetErrorName(result, &name) != CUDA_SUCCESS) name = nullptr;
  return fmt::format("{} failed ({})", call, name != nullptr ? name : std::to_string(static_cast<int>(result)));
}

bool has_multicast_entry_points(const DriverApi& api) {
  return api.cuMulticastGetGranularity != nullptr && api.cuMulticastCreate != nullptr &&
         api.cuMulticastAddDevice != nullptr && api.cuMulticastBindAddr != nullptr && api.cuMulticastUnbind != nullptr;
}

}  // namespace

bool multicast_enabled(const Config& config) { return config.string("BRAID_ENABLE_MULTICAST").value_or("0") == "1"; }

MulticastRegion::~MulticastRegion() {
  const DriverApi& api = driver();
  if (mapped_) release_quietly(api.cuMemUnmap(multicast_address_, bytes_), "cuMemUnmap (multicast)");
  if (reserved_) release_quietly(api.cuMemAddressFree(multicast_address_, bytes_), "cuMemAddressFree (multicast)");
  if (bound_) release_quietly(api.cuMulticastUnbind(handle_, device_, 0, bytes_), "cuMulticastUnbind");
  if (has_handle_) release_quietly(api.cuMemRelease(handle_), "cuMemRelease (multicast)");
}

std::unique_ptr<MulticastRegion> open_multicast(const Config& config, const MulticastTeam& team, size_t bytes) {
  if (!multicast_enabled(config)) return nullptr;  // the gate: nothing below runs
  const DriverApi& api = driver();
  auto region = std::make_unique<MulticastRegion>();
  std::string problem;  // this rank's, for its warning
  // Every rank warns alike when any rank failed; the region's destructor undoes what this rank made.
  auto agreed = [&](const char* step) {
    if (team.all_agree(problem.empty())) return true;
    BRAID_WARN("BRAID_ENABLE_MULTICAST=1, but multicast setup failed at {} ({}); collectives run unicast", step,
               problem.empty() ? "on another rank" : problem);
    return false;
  };

  int supported = 0;
  if (!has_multicast_entry_points(api)) {
    problem = "the CUDA driver has no multicast entry points";
  } else {
    problem = failure(api.cuDeviceGet(&region->device_, team.device), "cuDeviceGet");
    if (problem.empty()) {
      problem = failure(api.cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, region->device_),
                        "cuDeviceGetAttribute(MULTICAST_SUPPORTED)");
    }
    if (problem.empty() && supported == 0) problem = fmt::format("GPU {} reports no multicast support", team.device);
  }
  if (!agreed("the support check")) return nullptr;

  CUmulticastObjectProp prop{};
  prop.numDevices = static_cast<unsigned int>(team.size);
  prop.handleTypes = kHandleType;
  prop.size = bytes;
  size_t granularity = 0;
  problem = failure(api.cuMulticastGetGranularity(&granularity, &prop, CU_MULTICAST_GRANULARITY_MINIMUM),
                    "cuMulticastGetGranularity");
  if (problem.empty() && granularity == 0) problem = "cuMulticastGetGranularity returned 0";
  if (!agreed("the granularity query")) return nullptr;
  prop.size = (bytes + granularity - 1) / granularity * granularity;
  region->bytes_ = prop.size;
  region->memory_ = team.allocate(prop.size);
  if (region->memory_) {  // (a cpu test's fake team hands back an empty one)
    region->local_ = static_cast<char*>(region->memory_.local());
    region->device_peers_ = region->memory_.device_peers();
  }

  int exported = -1;
  if (team.rank == 0) {
    problem = failure(api.cuMulticastCreate(&region->handle_, &prop), "cuMulticastCreate");
    region->has_handle_ = problem.empty();
    if (problem.empty()) {
      problem = failure(api.cuMemExportToShareableHandle(&exported, region->handle_, kHandleType, 0),
                        "cuMemExportToShareableHandle (multicast)");
    }
  }
  FdOwner exported_owner(exported);
  if (!agreed("creating the multicast object")) return nullptr;

  FdOwner received(team.share_fd(team.rank == 0 ? exported : -1));
  if (team.rank != 0) {
    if (received.fd < 0) {
      problem = "no multicast handle arrived from rank 0";
    } else {
      problem = failure(api.cuMemImportFromShareableHandle(&region->handle_,
                                                            reinterpret_cast<void*>(static_cast<uintptr_t>(received.fd)),
                                                            kHandleType),
                        "cuMemImportFromShareableHandle (multicast)");
      region->has_handle_ = problem.empty();
    }
  }
  if (!agreed("importing the multicast object")) return nullptr;

  problem = failure(api.cuMulticastAddDevice(region->handle_, region->device_), "cuMulticastAddDevice");
  if (!agreed("adding the GPUs")) return nullptr;

  problem = failure(api.cuMulticastBindAddr(region->handle_, 0, reinterpret_cast<CUdeviceptr>(region->local_),
                                            prop.size, 0),
                    "cuMulticastBindAddr");
  region->bound_ = problem.empty();
  if (!agreed("binding memory")) return nullptr;

  problem = failure(api.cuMemAddressReserve(&region->multicast_address_, prop.size, granularity, 0, 0),
                    "cuMemAddressReserve (multicast)");
  region->reserved_ = problem.empty();
  if (problem.empty()) {
    problem = failure(api.cuMemMap(region->multicast_address_, prop.size, 0, region->handle_, 0), "cuMemMap (multicast)");
    region->mapped_ = problem.empty();
  }
  if (problem.empty()) {
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = team.device;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    problem = failure(api.cuMemSetAccess(region->multicast_address_, prop.size, &access, 1), "cuMemSetAccess (multicast)");
  }
  if (!agreed("mapping the multicast address")) return nullptr;
  BRAID_INFO("NVLink multicast on: {} bytes per rank bound to a multicast object of {} GPUs", prop.size, team.size);
  return region;
}

}  // namespace braid::detail
