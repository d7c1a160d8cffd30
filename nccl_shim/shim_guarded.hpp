// guarded(): the boundary between NCCL's C API and braid's exceptions (included by shim.hpp).
#pragma once

#include <new>
#include <stdexcept>

#include "core/log.hpp"

namespace braid::shim {

template <typename Body>
ncclResult_t guarded(const char* function, Body&& body) {
  try {
    body();
    return ncclSuccess;
  } catch (const RealNcclError& error) {  // the real NCCL's own result
    set_last_error(error.what());
    BRAID_WARN("{}", error.what());
    return error.result();
  } catch (const braid::Error& error) {
    set_last_error(error.what());
    BRAID_WARN("{}", error.what());  // braid's messages name the call
    return detail::to_nccl_result(error.code());
  } catch (const std::bad_alloc&) {
    set_last_error(std::string(function) + ": host memory allocation failed");
    return ncclSystemError;
  } catch (const std::exception& error) {
    set_last_error(std::string(function) + ": " + error.what());
    BRAID_WARN("{}: {}", function, error.what());
    return ncclInternalError;
  }
}

}  // namespace braid::shim
