// braid._braid: the nanobind extension over libbraid.so's C++ API. Each bind_* function adds one part of the
// API to the module (a file each); module.cpp calls them in order. Pointers and streams cross as Python ints,
// so the extension never links torch: the pure-Python package (python/braid/) turns tensors into them.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "braid/braid.hpp"
#include "braid/memory.hpp"

namespace braid::python {

namespace nb = nanobind;

// Throws braid::Error(kInvalidArgument) worded as braid's own checks are: "<function>: argument '<name>' <problem>".
[[noreturn]] void raise_argument(const char* function, const char* argument, const std::string& problem);

// An integer from Python as a pointer (0 is null).
template <typename T = void>
T* pointer_from(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}
inline uintptr_t address_of(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer); }
// A cudaStream_t from Python (torch.cuda.current_stream().cuda_stream; 0 is the legacy default stream).
inline Stream stream_from(uintptr_t stream) { return reinterpret_cast<Stream>(stream); }

// `count` elements of T at `pointer` on CUDA device `device`, as a one-dimensional DLPack array that keeps `owner`
// alive (torch.from_dlpack makes it a tensor).
template <typename T>
nb::ndarray<> device_array(void* pointer, size_t count, int device, nb::handle owner) {
  const size_t shape[1] = {count};
  return nb::ndarray<>(pointer, 1, shape, owner, nullptr, nb::dtype<T>(), nb::device::cuda::value, device);
}

// The Python object Communicator: braid::Communicator until destroy() (communicator.cpp; moe.cpp builds on it).
// NOTE [communicator held by each call]: the bindings release the GIL around braid's calls, so one thread's
// destroy() may run while another thread is inside a call (abort() from another thread is the documented way to end
// such a call). Each call holds the communicator through its own reference (get(), taken under a mutex), and
// destroy() drops only this object's: the communicator goes when the last call holding it returns.
// Neither copied nor moved (its mutex): the calls that make one return it in a std::unique_ptr.
class PyCommunicator {
 public:
  explicit PyCommunicator(Communicator comm) : comm_(std::make_shared<Communicator>(std::move(comm))) {}

  // The communicator, held for as long as the returned reference lives, or braid.Error naming `function` after
  // destroy().
  std::shared_ptr<Communicator> get(const char* function) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!comm_) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("Communicator.{}: the communicator was destroyed (destroy())", function));
    }
    return comm_;
  }
  bool alive() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return comm_ != nullptr;
  }
  void destroy() {
    std::shared_ptr<Communicator> last;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      last.swap(comm_);
    }
  }  // `last` goes here, outside the lock: the communicator's teardown may wait for its peers

 private:
  mutable std::mutex mutex_;
  std::shared_ptr<Communicator> comm_;
};

// A symmetric allocation and the GPU it lives on (what a DLPack export of it must name).
struct Symmetric {
  SymmetricMemory memory;
  int device = -1;
};

void bind_errors(nb::module_& m);        // braid::Error -> braid.Error (errors.cpp)
void bind_types(nb::module_& m);         // DataType, ReduceOp, PointToPoint (types.cpp)
void bind_rendezvous(nb::module_& m);    // Rendezvous, StoreHost (rendezvous.cpp)
void bind_memory(nb::module_& m);        // SymmetricMemory (memory.cpp)
void bind_communicator(nb::module_& m);  // Communicator (communicator.cpp)
void bind_moe(nb::module_& m);           // MoeShape, MoeBuffer, MoeHook (moe.cpp)
void bind_signal_pad(nb::module_& m);    // SignalPad: a pad for users' kernels (signal_pad.cpp)
void bind_fused_matmul(nb::module_& m);  // Layout, FusedMatmul: GEMMs fused with a collective (fused_matmul.cpp)

}  // namespace braid::python
