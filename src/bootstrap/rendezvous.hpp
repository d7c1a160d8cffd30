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

// The address rank 0's store binds for a store the ranks dial at `host`: a loopback name binds every address it
// resolves to (127.0.1.1, Debian's address for the host name, is not 127.0.0.1; "localhost" is both 127.0.0.1 and
// ::1, and clients try every address of the name, so the store holds them all), any other host every interface of
// both families ("").
std::string store_bind_host(const std::string& host);

// The process environment as a map.
Environment process_environment_map();

}  // namespace braid
