#include "braid/error.hpp"

namespace braid {

const char* error_code_name(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kSuccess: return "success";
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kNoDevice: return "no CUDA device";
    case ErrorCode::kCudaError: return "CUDA error";
    case ErrorCode::kDriverError: return "CUDA driver error";
    case ErrorCode::kSystemError: return "system error";
    case ErrorCode::kTimeout: return "timeout";
    case ErrorCode::kPeerUnreachable: return "peer unreachable";
    case ErrorCode::kMismatch: return "mismatch between ranks";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kRemoteError: return "remote error";
    case ErrorCode::kInternal: return "internal error";
    case ErrorCode::kAborted: return "aborted";
    case ErrorCode::kRevoked: return "revoked";
  }
  return "unknown error";
}

}  // namespace braid
