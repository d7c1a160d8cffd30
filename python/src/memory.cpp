// Symmetric memory (braid/memory.hpp) for Python: the addresses as integers, and each rank's copy (or the
// contiguous view) as a one-dimensional uint8 DLPack array on the allocation's GPU, which torch.from_dlpack turns
// into a tensor. Every array holds a reference to the SymmetricMemory object, so the memory stays mapped while
// any tensor made from it lives; there is no explicit free (the mappings go with the last reference).
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <fmt/format.h>

#include "bindings.hpp"

namespace braid::python {
void bind_memory(nb::module_& m) {
  nb::class_<Symmetric>(m, "SymmetricMemory",
                        "One symmetric allocation (Communicator.alloc): the same size on every rank, every rank's "
                        "copy mapped here. Addresses are integers; *_buffer() give DLPack arrays of bytes.")
      .def_prop_ro("bytes", [](const Symmetric& s) { return s.memory.bytes(); })
      .def_prop_ro("world_size", [](const Symmetric& s) { return s.memory.world_size(); })
      .def_prop_ro("rank", [](const Symmetric& s) { return s.memory.rank(); })
      .def_prop_ro("device", [](const Symmetric& s) { return s.device; }, "CUDA ordinal of this rank's GPU.")
      .def_prop_ro("local", [](const Symmetric& s) { return address_of(s.memory.local()); }, "This rank's copy.")
      .def(
          "peer", [](const Symmetric& s, int rank) { return address_of(s.memory.peer(rank)); }, nb::arg("rank"),
          "Rank's copy as mapped here (an address on this rank's GPU).")
      .def_prop_ro(
          "peers",
          [](const Symmetric& s) {
            std::vector<uintptr_t> peers;
            for (int rank = 0; rank < s.memory.world_size(); ++rank) peers.push_back(address_of(s.memory.peers()[rank]));
            return peers;
          },
          "Every rank's copy as mapped here, in rank order.")
      .def_prop_ro(
          "device_peers", [](const Symmetric& s) { return address_of(s.memory.device_peers()); },
          "A device array of `world_size` pointers (the peers), to pass to kernels.")
      .def_prop_ro(
          "view", [](const Symmetric& s) { return address_of(s.memory.view()); },
          "The contiguous view (rank r's copy at view + r * view_stride), or 0 without contiguous_view.")
      .def_prop_ro("view_stride", [](const Symmetric& s) { return s.memory.view_stride(); },
                   "Bytes between consecutive ranks in the view (bytes rounded up to the mapping granularity).")
      .def(
          "local_buffer",
          [](Symmetric& s) { return device_array<uint8_t>(s.memory.local(), s.memory.bytes(), s.device, nb::find(&s)); },
          "This rank's copy: `bytes` uint8 on this rank's GPU (DLPack).")
      .def(
          "peer_buffer",
          [](Symmetric& s, int rank) {
            return device_array<uint8_t>(s.memory.peer(rank), s.memory.bytes(), s.device, nb::find(&s));
          },
          nb::arg("rank"), "Rank's copy as mapped here: `bytes` uint8 on this rank's GPU (DLPack).")
      .def(
          "view_buffer",
          [](Symmetric& s) {
            if (s.memory.view() == nullptr) {
              raise_argument("SymmetricMemory.view_buffer", "self",
                             "has no contiguous view: allocate it with contiguous_view=True");
            }
            return device_array<uint8_t>(s.memory.view(), s.memory.view_stride() * s.memory.world_size(), s.device,
                              nb::find(&s));
          },
          "The contiguous view: world_size * view_stride uint8 on this rank's GPU (DLPack). Raises braid.Error "
          "(INVALID_ARGUMENT) where the memory was allocated without contiguous_view.")
      .def("__repr__", [](const Symmetric& s) {
        return fmt::format("SymmetricMemory(bytes={}, rank={}, world_size={}, device={}, view={})", s.memory.bytes(),
                           s.memory.rank(), s.memory.world_size(), s.device, s.memory.view() ? "True" : "False");
      });
}

}  // namespace braid::python
