// braid::StoreHost: a store server for a job, and the address its clients dial.
#include <memory>
#include <string>

#include "bootstrap/store.hpp"
#include "braid/rendezvous.hpp"
#include "core/error.hpp"
#include "core/log.hpp"

namespace braid {

namespace {

// The host that clients on this machine should dial for a server bound to `bind_host`: a wildcard
// address is not dialable, so use loopback; IPv6 literals need brackets in "host:port".
std::string dialable_host(const std::string& bind_host) {
  if (bind_host.empty() || bind_host == "0.0.0.0") return "127.0.0.1";
  if (bind_host == "::") return "[::1]";
  if (bind_host.find(':') != std::string::npos) return "[" + bind_host + "]";
  return bind_host;
}

int store_host_port(int port) {
  if (port < 0 || port > 65535) {
    raise_invalid_argument("StoreHost", "port", "must be in [0, 65535] (0: a free port), got {}", port);
  }
  return port;
}

}  // namespace

StoreHost::StoreHost(const std::string& bind_host, int port)
    : host_(dialable_host(bind_host)), server_(std::make_unique<StoreServer>(bind_host, store_host_port(port))) {
  log_enabled(LogLevel::kWarn);  // prints, once, the warnings about unknown BRAID_* names (typos)
}

StoreHost::~StoreHost() = default;

std::string StoreHost::address() const { return fmt::format("{}:{}", host_, server_->port()); }

}  // namespace braid
