// Where the ranks meet (braid/rendezvous.hpp): Rendezvous.from_env() reads braid-run's, torchrun's, MPI's or
// Slurm's variables; StoreHost serves a store in this process (for ranks that are threads, or tests).
#include <fmt/format.h>
#include <nanobind/stl/string.h>

#include "braid/rendezvous.hpp"
#include "bindings.hpp"

namespace braid::python {

void bind_rendezvous(nb::module_& m) {
  nb::class_<Rendezvous>(m, "Rendezvous", "Where and how the ranks of a job meet (braid/rendezvous.hpp).")
      .def(nb::init<>())
      .def_static("from_env", &Rendezvous::from_env,
                  "From the launcher's variables: braid-run, torchrun, Open MPI, MPICH, Slurm (the first that "
                  "matches). Raises braid.Error (INVALID_ARGUMENT) naming a missing or malformed variable.")
      .def_static("at_store", &Rendezvous::at_store, nb::arg("store_address"), nb::arg("rank"), nb::arg("size"),
                  nb::arg("rank0_serves_store"),
                  "Explicit: every rank names the same store 'host:port'; rank 0 serves it when rank0_serves_store.")
      .def_rw("rank", &Rendezvous::rank)
      .def_rw("size", &Rendezvous::size)
      .def_rw("local_rank", &Rendezvous::local_rank)
      .def_rw("local_size", &Rendezvous::local_size)
      .def_rw("store_host", &Rendezvous::store_host)
      .def_rw("store_port", &Rendezvous::store_port)
      .def_rw("serve_store", &Rendezvous::serve_store)
      .def_rw("job_id", &Rendezvous::job_id)
      .def_rw("source", &Rendezvous::source)
      .def("__repr__", [](const Rendezvous& r) {
        return fmt::format("Rendezvous(source='{}', rank={}, size={}, local_rank={}, local_size={}, store='{}:{}', "
                           "serve_store={})",
                           r.source, r.rank, r.size, r.local_rank, r.local_size, r.store_host, r.store_port,
                           r.serve_store ? "True" : "False");
      });

  nb::class_<StoreHost>(m, "StoreHost",
                        "A store served by this process until it is garbage-collected; pass .address to "
                        "Rendezvous.at_store(..., rank0_serves_store=False).")
      .def(nb::init<const std::string&, int>(), nb::arg("bind_host") = "127.0.0.1", nb::arg("port") = 0,
           nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("address", &StoreHost::address);
}

}  // namespace braid::python
