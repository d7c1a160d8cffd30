#include "unique_id.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <random>

#include <fmt/format.h>

namespace braid::shim {
namespace {

constexpr char kMagic[8] = {'b', 'r', 'a', 'i', 'd', 'I', 'D', '1'};

// The id's bytes (fits NCCL_UNIQUE_ID_BYTES; the rest is zero).
struct IdLayout {
  char magic[8];
  uint64_t nonce;
  uint32_t port;
  char host[46];     // IPv4 text
  char boot_id[40];  // /proc/sys/kernel/random/boot_id
};
static_assert(sizeof(IdLayout) <= NCCL_UNIQUE_ID_BYTES, "the shim's id must fit ncclUniqueId");

std::string boot_id() {
  std::ifstream file("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(file, id);
  return id;
}

// The first IPv4 address of an interface that is up and not loopback; 127.0.0.1 where there is none.
std::string advertised_host() {
  ifaddrs* list = nullptr;
  std::string host = "127.0.0.1";
  if (getifaddrs(&list) != 0) return host;
  for (ifaddrs* entry = list; entry != nullptr; entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr || entry->ifa_addr->sa_family != AF_INET) continue;
    if ((entry->ifa_flags & IFF_UP) == 0 || (entry->ifa_flags & IFF_LOOPBACK) != 0) continue;
    char text[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(entry->ifa_addr)->sin_addr, text, sizeof(text));
    host = text;
    break;
  }
  freeifaddrs(list);
  return host;
}

// Stores this process serves, by nonce: held strongly until a communicator claims them, weakly after.
std::mutex stores_mutex;
std::map<uint64_t, std::shared_ptr<StoreHost>> unclaimed_stores;
std::map<uint64_t, std::weak_ptr<StoreHost>> claimed_stores;

}  // namespace

ncclUniqueId make_unique_id() {
  const std::string host = advertised_host();
  auto store = std::make_shared<StoreHost>(host == "127.0.0.1" ? "127.0.0.1" : "0.0.0.0", 0);
  const std::string address = store->address();
  const int port = std::stoi(address.substr(address.rfind(':') + 1));
  std::random_device entropy;
  const uint64_t nonce = (uint64_t(entropy()) << 32) ^ entropy() ^ (uint64_t(getpid()) << 16);

  IdLayout layout{};
  std::memcpy(layout.magic, kMagic, sizeof(kMagic));
  layout.nonce = nonce;
  layout.port = static_cast<uint32_t>(port);
  std::snprintf(layout.host, sizeof(layout.host), "%s", host.c_str());
  std::snprintf(layout.boot_id, sizeof(layout.boot_id), "%s", boot_id().c_str());
  ncclUniqueId id{};
  std::memcpy(id.internal, &layout, sizeof(layout));
  {
    std::lock_guard<std::mutex> lock(stores_mutex);
    unclaimed_stores[nonce] = std::move(store);
  }
  return id;
}

std::optional<StoreAddress> read_unique_id(const ncclUniqueId& id) {
  IdLayout layout;
  std::memcpy(&layout, id.internal, sizeof(layout));
  if (std::memcmp(layout.magic, kMagic, sizeof(kMagic)) != 0) return std::nullopt;
  layout.host[sizeof(layout.host) - 1] = '\0';
  layout.boot_id[sizeof(layout.boot_id) - 1] = '\0';
  const bool same_boot = boot_id() == layout.boot_id;
  return StoreAddress{fmt::format("{}:{}", same_boot ? "127.0.0.1" : layout.host, layout.port), layout.nonce};
}

std::shared_ptr<StoreHost> claim_store(uint64_t nonce) {
  std::lock_guard<std::mutex> lock(stores_mutex);
  if (auto found = unclaimed_stores.find(nonce); found != unclaimed_stores.end()) {
    std::shared_ptr<StoreHost> store = std::move(found->second);
    unclaimed_stores.erase(found);
    claimed_stores[nonce] = store;
    return store;
  }
  if (auto found = claimed_stores.find(nonce); found != claimed_stores.end()) return found->second.lock();
  return nullptr;
}

}  // namespace braid::shim
