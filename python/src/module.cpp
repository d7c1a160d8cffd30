// The module braid._braid (imported by braid/__init__.py; use the package, not this module, directly).
#include "bindings.hpp"

NB_MODULE(_braid, m) {
  m.doc() = "braid's C++ API for Python: pointers and CUDA streams as integers (the braid package wraps tensors)";
  // A torch tensor over braid memory (braid.empty, .peer, .view_all) holds its SymmetricMemory through DLPack, and
  // torch may free a tensor the program keeps until exit after nanobind's shutdown check: no leak, yet a screen of
  // "leaked instance" warnings at every such exit.
  nanobind::set_leak_warnings(false);
  braid::python::bind_errors(m);  // first: the translator must exist before any other binding can throw
  braid::python::bind_types(m);
  braid::python::bind_rendezvous(m);
  braid::python::bind_memory(m);
  braid::python::bind_communicator(m);
  braid::python::bind_moe(m);  // after Communicator: MoeBuffer.create takes one
  braid::python::bind_signal_pad(m);  // after Communicator: a SignalPad is made on one
  braid::python::bind_fused_matmul(m);  // after Communicator: a FusedMatmul is made on one
}
