// A signal pad for users' kernels (braid/device/sync_device.hpp): built as that header says a user's pad is, on
// a communicator, and handed to Python as addresses, DLPack arrays and the packed braid::device::SignalPad, so a
// Triton kernel (through the arrays) or a CUDA kernel (through the struct or its fields) can signal and wait.
// check() reads the pad's error words with the header's host protocol.
#include <cuda_runtime.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <atomic>
#include <cstring>
#include <string>

#include "bindings.hpp"
#include "braid/device/sync_device.hpp"

namespace braid::python {
namespace {

void cuda_check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw Error(ErrorCode::kCudaError, fmt::format("SignalPad: {} failed: {}", what, cudaGetErrorString(status)));
  }
}

// The pad's memory on one rank: the symmetric counters and plan words, the expected counts, the two error words
// (host-mapped) and a device copy of the struct.
class UserSignalPad {
 public:
  UserSignalPad(PyCommunicator& c, int channels) {
    const char* function = "SignalPad";
    if (channels < 1) raise_argument(function, "channels", fmt::format("is {}; it must be >= 1", channels));
    const std::shared_ptr<Communicator> comm = c.get("SignalPad");
    device_ = comm->device();
    const size_t slots = size_t(channels) * size_t(comm->size());
    memory_ = comm->alloc(3 * slots * sizeof(uint64_t));  // counters, then plan words (zeroed)
    int previous = 0;
    cuda_check(cudaGetDevice(&previous), "cudaGetDevice");
    cuda_check(cudaSetDevice(device_), "cudaSetDevice");
    try {
      cuda_check(cudaMalloc(&expected_, slots * sizeof(uint64_t)), "cudaMalloc (expected)");
      cuda_check(cudaMemset(expected_, 0, slots * sizeof(uint64_t)), "cudaMemset (expected)");
      cuda_check(cudaHostAlloc(&words_, 2 * sizeof(device::ErrorWord), cudaHostAllocMapped),
                 "cudaHostAlloc (error words)");
      std::memset(words_, 0, 2 * sizeof(device::ErrorWord));
      void* mapped = nullptr;
      cuda_check(cudaHostGetDevicePointer(&mapped, words_, 0), "cudaHostGetDevicePointer");
      pad_.local = static_cast<uint64_t*>(memory_.local());
      pad_.peers = reinterpret_cast<uint64_t* const*>(memory_.device_peers());
      pad_.expected = static_cast<uint64_t*>(expected_);
      pad_.error = static_cast<device::ErrorWord*>(mapped);
      pad_.data_error = static_cast<device::ErrorWord*>(mapped) + 1;
      pad_.rank = comm->rank();
      pad_.world = comm->size();
      pad_.channels = channels;
      pad_.timeout_ns = static_cast<unsigned long long>(comm->timeout_s() * 1e9);
      cuda_check(cudaMalloc(&device_struct_, sizeof(pad_)), "cudaMalloc (struct)");
      cuda_check(cudaMemcpy(device_struct_, &pad_, sizeof(pad_), cudaMemcpyHostToDevice), "cudaMemcpy (struct)");
    } catch (...) {
      release();
      cudaSetDevice(previous);
      throw;
    }
    cuda_check(cudaSetDevice(previous), "cudaSetDevice");
  }
  UserSignalPad(const UserSignalPad&) = delete;
  UserSignalPad& operator=(const UserSignalPad&) = delete;
  ~UserSignalPad() { release(); }

  const device::SignalPad& pad() const { return pad_; }
  int device() const { return device_; }
  uintptr_t device_struct() const { return address_of(device_struct_); }

  // A fatal failure (never cleared: the pad's counters are out of step), else a data error (cleared, as the
  // header's protocol says a host clears its pad's data word), raised as braid.Error.
  void check() const {
    auto* words = static_cast<device::ErrorWord*>(words_);
    raise_recorded(words[0], false);
    raise_recorded(words[1], true);
  }

 private:
  static void raise_recorded(device::ErrorWord& word, bool clear) {
    std::atomic_ref<unsigned int> code(word.code);
    const unsigned int seen = clear ? code.exchange(0, std::memory_order_acq_rel) : code.load(std::memory_order_acquire);
    if (seen == 0) return;
    const device::ErrorWord copy = word;
    if (clear) std::atomic_ref<unsigned int>(word.claimed).store(0, std::memory_order_release);
    const ErrorCode error = seen == device::kErrorTimeout        ? ErrorCode::kTimeout
                            : seen == device::kErrorPlanMismatch ? ErrorCode::kMismatch
                                                                 : ErrorCode::kInvalidArgument;
    const std::string what = seen == device::kErrorTimeout
                                 ? fmt::format("a wait on rank {} for peer {} (channel {}, tag {}, site {}) gave up after {} ns{}",
                                               copy.rank, copy.peer, copy.channel, copy.collective, copy.site, copy.waited_ns,
                                               copy.limit == 0 ? std::string()
                                                               : fmt::format(" (peer's signal count {}, needed {})",
                                                                             copy.value, copy.limit))
                                 : fmt::format("rank {} recorded code {} (tag {}, peer {}): value {}, limit {}", copy.rank,
                                               seen, copy.collective, copy.peer, copy.value, copy.limit);
    throw Error(error, "SignalPad.check: " + what);
  }

  void release() {
    if (device_struct_ != nullptr) cudaFree(device_struct_);
    if (expected_ != nullptr) cudaFree(expected_);
    if (words_ != nullptr) cudaFreeHost(words_);
    device_struct_ = expected_ = words_ = nullptr;
  }

  SymmetricMemory memory_;
  device::SignalPad pad_{};
  int device_ = -1;
  void* expected_ = nullptr;
  void* words_ = nullptr;
  void* device_struct_ = nullptr;
};

}  // namespace

void bind_signal_pad(nb::module_& m) {
  nb::class_<UserSignalPad>(m, "SignalPad",
                            "A signal pad for your kernels (braid/device/sync_device.hpp), made collectively on a "
                            "communicator with `channels` channels: addresses as integers, arrays as DLPack int64.")
      .def(nb::init<PyCommunicator&, int>(), nb::arg("comm"), nb::arg("channels"),
           nb::call_guard<nb::gil_scoped_release>(), "Collective: every rank, the same channels.")
      .def_prop_ro("local", [](const UserSignalPad& p) { return address_of(p.pad().local); },
                   "This rank's counters: uint64 [channels][world], then the plan words.")
      .def_prop_ro("peers", [](const UserSignalPad& p) { return address_of(p.pad().peers); },
                   "A device array of world pointers: every rank's counters as mapped here.")
      .def_prop_ro("expected", [](const UserSignalPad& p) { return address_of(p.pad().expected); },
                   "uint64 [channels][world] of this rank's device memory: the counts its waits waited for.")
      .def_prop_ro("error", [](const UserSignalPad& p) { return address_of(p.pad().error); },
                   "The fatal ErrorWord (host-mapped), as kernels address it.")
      .def_prop_ro("data_error", [](const UserSignalPad& p) { return address_of(p.pad().data_error); },
                   "The data-error ErrorWord (host-mapped), as kernels address it.")
      .def_prop_ro("rank", [](const UserSignalPad& p) { return p.pad().rank; })
      .def_prop_ro("world", [](const UserSignalPad& p) { return p.pad().world; })
      .def_prop_ro("channels", [](const UserSignalPad& p) { return p.pad().channels; })
      .def_prop_ro("timeout_ns", [](const UserSignalPad& p) { return p.pad().timeout_ns; })
      .def_prop_ro("device", [](const UserSignalPad& p) { return p.device(); })
      .def_prop_ro(
          "struct",
          [](const UserSignalPad& p) { return nb::bytes(reinterpret_cast<const char*>(&p.pad()), sizeof(p.pad())); },
          "The braid::device::SignalPad itself, to pass a kernel by value.")
      .def_prop_ro("device_struct", &UserSignalPad::device_struct,
                   "A copy of the struct in device memory, for a kernel that takes `const SignalPad*`.")
      .def(
          "counters_array",
          [](UserSignalPad& p) {
            return device_array<int64_t>(p.pad().local, size_t(p.pad().channels) * p.pad().world, p.device(), nb::find(&p));
          },
          "This rank's counters, [channels * world] int64 (slot c * world + q: signals received from q on c).")
      .def(
          "expected_array",
          [](UserSignalPad& p) {
            return device_array<int64_t>(p.pad().expected, size_t(p.pad().channels) * p.pad().world, p.device(), nb::find(&p));
          },
          "This rank's expected counts, [channels * world] int64.")
      .def(
          "peers_array",
          [](UserSignalPad& p) {
            return device_array<int64_t>(const_cast<uint64_t**>(p.pad().peers), size_t(p.pad().world), p.device(), nb::find(&p));
          },
          "Every rank's counters' address as mapped here, [world] int64 on the GPU.")
      .def("check", &UserSignalPad::check,
           "Raises braid.Error for a failure a kernel recorded in this pad: a timeout (TIMEOUT) or a barrier's plan "
           "mismatch (MISMATCH), both recorded for good, or a data error (cleared once raised).")
      .def("__repr__", [](const UserSignalPad& p) {
        return fmt::format("SignalPad(rank={}, world={}, channels={}, device={})", p.pad().rank, p.pad().world,
                           p.pad().channels, p.device());
      });
  m.attr("SIGNAL_PAD_STRUCT_BYTES") = sizeof(device::SignalPad);
}

}  // namespace braid::python
