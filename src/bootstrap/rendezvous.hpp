// Rendezvous from launcher conventions. The public entry points are braid::Rendezvous::from_env() and
// ::at_store() (braid/braid.hpp); this parses an explicit environment so every convention is testable.
#pragma once

#include <map>
#include <string>

#include "braid/rendezvous.hpp"

namespace braid {

using Environment = std::map<std::string, std::string>;

// The rendezvous described by `env` (see Rendezvous::from_env for the order of conventions).
// Throws Error(kInvalidArgument) naming the variable that is missing or malformed.
Rendezvous rendezvous_from_environment(const Environment& env);

// The address rank 0's store binds for a store the ranks dial at `host`: a loopback alias binds exactly what
// they dial (127.0.1.1, Debian's address for the host name, is not 127.0.0.1; ::1 is IPv6), "localhost" binds
// 127.0.0.1 (clients try every address the name resolves to), and any other host every interface (0.0.0.0).
std::string store_bind_host(const std::string& host);

// The process environment as a map.
Environment process_environment_map();

}  // namespace braid
