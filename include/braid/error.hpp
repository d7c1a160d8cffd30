// braid/error.hpp — the one error type of braid's C++ API.
#pragma once

#include <stdexcept>
#include <string>

namespace braid {

// Error codes, shared by the C++ API (braid::Error::code()) and the C API (braidResult_t).
// Keep in step with braidResult_t in braid.h; src/core/error.cpp maps each to its name.
enum class ErrorCode : int {
  kSuccess = 0,
  kInvalidArgument = 1,  // a caller's argument is wrong; the message names it
  kNoDevice = 2,         // no usable CUDA driver (none, or one older than the runtime) or no device
  kCudaError = 3,        // a CUDA runtime call failed (message: call, code name, rank)
  kDriverError = 4,      // a CUDA driver call failed (message: call, code name, rank)
  kSystemError = 5,      // an OS call failed (sockets, fds, processes)
  kTimeout = 6,          // a bounded wait expired (message: what was awaited and, where known, the peer waited on)
  kPeerUnreachable = 7,  // ranks cannot reach each other's memory (no P2P/NVLink)
  kMismatch = 8,         // ranks disagree on a collective call (sizes, order)
  kUnsupported = 9,      // a valid request this build or device cannot serve
  kRemoteError = 10,     // a peer failed or went away
  kInternal = 11,        // a bug in braid
  kAborted = 12,   // this rank aborted the communicator (Communicator::abort): check(), later calls that take a
                   // stream and waits on the store or a peer's fd (more than one rank) fail so
  kRevoked = 13,   // a rank revoked the communicator (Communicator::revoke): every rank's check(), calls that
                   // take a stream and waits on the store or a peer's fd fail so
};

// A short description of a code, e.g. "invalid argument" ("unknown error" for a value that is none).
const char* error_code_name(ErrorCode code) noexcept;

// Thrown by every braid C++ call that fails. what() is a complete sentence naming the argument,
// the CUDA call or the peer at fault.
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

}  // namespace braid
