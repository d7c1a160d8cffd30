// The windows the shim makes (ncclCommWindowRegister on a shim communicator): braid's registration of the buffer
// and the real NCCL's window on the paired communicator. An ncclWindow_t the shim hands out points at one; the
// registry tells them from the real NCCL's own windows, which functions without a communicator also receive.
#pragma once

#include <nccl.h>

#include "braid/braid.hpp"

namespace braid::shim {

struct ShimWindow {
  RegisteredBuffer braid;       // empty where braid's CUDA backend does not serve the communicator
  ncclWindow_t real = nullptr;  // the real NCCL's window, or null
  void* user = nullptr;         // the buffer the caller registered
};

// Registers a window made by the shim, and forgets it (before it is freed).
void remember_window(ShimWindow* window);
void forget_window(ShimWindow* window);
// The shim's window behind `window`, or null for a real NCCL window (or null).
ShimWindow* shim_window(ncclWindow_t window);
// The window the real NCCL knows: itself for a real NCCL window, the paired real window for a shim one
// (kUnsupported naming `function` where there is none).
ncclWindow_t real_window(ncclWindow_t window, const char* function);

}  // namespace braid::shim
