// Which path serves a call: the one place the shim decides between braid and the real NCCL.
#pragma once

#include <nccl.h>

#include "group.hpp"

namespace braid::shim {

struct Route {
  bool braid;          // braid serves it; otherwise the real NCCL
  const char* reason;  // why NCCL serves it (nullptr when braid does)
};

// braid serves a call where the communicator runs on braid's CUDA backend, BRAID_SHIM_FALLBACK does not name the
// call's kind, and braid has the datatype and operator (moves without arithmetic need neither: all-gather,
// broadcast, all-to-all and sends travel as bytes). Every input is the same on every rank of a collective (and on
// both sides of a send), so both sides of every exchange take the same path.
Route route(const Op& op);

// BRAID_LOG_LEVEL=info: one line per (kind, size class, path), the first time that combination is served.
void log_route(const Op& op, const Route& route);

// Bytes of one element of an NCCL datatype; 0 outside the enum.
size_t nccl_type_size(ncclDataType_t type);

}  // namespace braid::shim
