// Rendezvous from launcher conventions. The public entry points are braid::Rendezvous::from_env() and
// ::at_store() (braid/braid.hpp); this parses an explicit environment so every convention is testable.
#pragma once

#include <map>
#include <string>

#include "braid/braid.hpp"

namespace braid {

using Environment = std::map<std::string, std::string>;

// The rendezvous described by `env` (see Rendezvous::from_env for the order of conventions).
// Throws Error(kInvalidArgument) naming the variable that is missing or malformed.
Rendezvous rendezvous_from_environment(const Environment& env);

// The process environment as a map.
Environment process_environment_map();

}  // namespace braid
