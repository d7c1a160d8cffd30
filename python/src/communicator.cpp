// braid::Communicator for Python. Buffers are device addresses (ints), counts are elements, streams are cudaStream_t
// values as ints (torch.cuda.current_stream().cuda_stream; 0 is the legacy default stream). Every call that may wait
// releases the GIL: init, alloc and barrier wait for peers (bounded by the communicator's timeout), and a collective
// may wait for the first use of a registered buffer. destroy() frees the communicator before the object goes; symmetric
// memory made from it stays valid.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <optional>

#include <fmt/format.h>

#include "braid/braid.hpp"
#include "bindings.hpp"

namespace braid::python {
namespace {

using release_gil = nb::call_guard<nb::gil_scoped_release>;

// A host array of counts or displacements must hold one entry per rank: the C++ call reads size() of them.
const size_t* per_rank(const std::optional<std::vector<size_t>>& values, int size, const char* function,
                       const char* argument, bool required) {
  if (!values) {
    if (required) raise_argument(function, argument, "is None; it needs one entry per rank");
    return nullptr;
  }
  if (values->size() != static_cast<size_t>(size)) {
    raise_argument(function, argument, fmt::format("has {} entries; it needs {} (one per rank)", values->size(), size));
  }
  return values->data();
}

}  // namespace

void bind_communicator(nb::module_& m) {
  nb::class_<PyCommunicator>(m, "Communicator",
                             "A group of ranks, one GPU each (braid::Communicator). Make one with "
                             "Communicator.init; buffers are device addresses, streams cudaStream_t ints.")
      .def_static(
          "init",
          [](const std::optional<Rendezvous>& rendezvous, int device, double timeout_s, const std::string& algorithms,
             int max_blocks, const std::string& backend, const std::string& nccl_library) {
            CommOptions options;
            options.device = device;
            options.timeout_s = timeout_s;
            options.algorithms = algorithms;
            options.max_blocks = max_blocks;
            options.backend = backend;
            options.nccl_library = nccl_library;
            return std::make_unique<PyCommunicator>(
                Communicator::init(rendezvous ? *rendezvous : Rendezvous::from_env(), options));
          },
          nb::arg("rendezvous").none() = nb::none(), nb::kw_only(), nb::arg("device") = -1,
          nb::arg("timeout_s") = 0.0, nb::arg("algorithms") = "", nb::arg("max_blocks") = 0,
          nb::arg("backend") = "", nb::arg("nccl_library") = "", release_gil(),
          "Collective over the rendezvous' ranks (None: Rendezvous.from_env()). device -1: BRAID_DEVICE, else the "
          "local rank; 0 and '' take braid's defaults (BRAID_TIMEOUT_S, BRAID_ALGO, ...).")
      .def("destroy", &PyCommunicator::destroy, release_gil(),
           "Frees the communicator (later calls raise braid.Error): now, or, where another thread is inside one of its "
           "calls, when that call returns. Symmetric memory made from it stays valid.")
      .def_prop_ro("destroyed", [](const PyCommunicator& c) { return !c.alive(); })
      .def_prop_ro("rank", [](PyCommunicator& c) { return c.get("rank")->rank(); })
      .def_prop_ro("size", [](PyCommunicator& c) { return c.get("size")->size(); })
      .def_prop_ro("device", [](PyCommunicator& c) { return c.get("device")->device(); }, "CUDA ordinal of this rank's GPU.")
      .def_prop_ro("timeout_s", [](PyCommunicator& c) { return c.get("timeout_s")->timeout_s(); })
      .def_prop_ro("backend", [](PyCommunicator& c) { return std::string(c.get("backend")->backend()); },
                   "'cuda' (symmetric memory, one host) or 'nccl'.")
      .def_prop_ro("uses_multicast", [](PyCommunicator& c) { return c.get("uses_multicast")->uses_multicast(); })
      .def("describe", [](PyCommunicator& c) { return c.get("describe")->describe(); }, "A line for this rank, then a line per other rank.")
      .def(
          "alloc",
          [](PyCommunicator& c, size_t bytes, bool contiguous_view) {
            const std::shared_ptr<Communicator> comm = c.get("alloc");
            return Symmetric{comm->alloc(bytes, {.contiguous_view = contiguous_view}), comm->device()};
          },
          nb::arg("bytes"), nb::arg("contiguous_view") = false, release_gil(),
          "Collective: every rank asks for the same bytes (> 0) in the same order. The memory is zeroed.")
      .def("barrier", [](PyCommunicator& c) { c.get("barrier")->barrier(); }, release_gil(),
           "Host-side barrier over the store (it does not wait for the GPU: synchronise first).")
      .def(
          "host_allgather",
          [](PyCommunicator& c, nb::bytes mine) {
            std::string own(mine.c_str(), mine.size());
            std::vector<std::string> all;
            {
              nb::gil_scoped_release released;
              all = c.get("host_allgather")->host_allgather(own);
            }
            nb::list result;
            for (const std::string& item : all) result.append(nb::bytes(item.data(), item.size()));
            return result;
          },
          nb::arg("mine"), "Collective: every rank's bytes, in rank order (small values, over the store).")
      .def("check", [](PyCommunicator& c) { c.get("check")->check(); },
           "Raises what a kernel recorded (a timeout, a plan mismatch, a peer process that exited, an abort, refused "
           "data); does not synchronise.")
      .def("abort", [](PyCommunicator& c) { c.get("abort")->abort(); },
           "Aborts this rank's use of the communicator from any thread: its waits end; check() and every later call "
           "that takes a stream raise ABORTED (unless another fatal failure came first). Local (the peers are not "
           "told). Raises only on a destroyed communicator.")
      .def(
          "shrink",
          [](PyCommunicator& c, const std::vector<int>& excluded) {
            const std::shared_ptr<Communicator> parent = c.get("shrink");
            nb::gil_scoped_release released;  // collective over the survivors
            return std::make_unique<PyCommunicator>(parent->shrink(excluded));
          },
          nb::arg("excluded"),
          "Collective over the ranks not in `excluded` (they alone call it): a new communicator of theirs, ranks in "
          "their old order, through this one's store. Works after a failure; revoke first.")
      .def("revoke", [](PyCommunicator& c) { c.get("revoke")->revoke(); },
           "Revokes the communicator for every rank: within about 10 ms every rank's waits end; check() and every "
           "later call that takes a stream raise REVOKED (unless another fatal failure came first). CUDA backend "
           "only.")
      .def(
          "all_reduce",
          [](PyCommunicator& c, uintptr_t send, uintptr_t recv, size_t count, DataType type, ReduceOp op,
             uintptr_t stream) {
            c.get("all_reduce")->all_reduce(pointer_from(send), pointer_from(recv), count, type, op, stream_from(stream));
          },
          nb::arg("send"), nb::arg("recv"), nb::arg("count"), nb::arg("dtype"), nb::arg("op"), nb::arg("stream"),
          release_gil())
      .def(
          "reduce",
          [](PyCommunicator& c, uintptr_t send, uintptr_t recv, size_t count, DataType type, ReduceOp op, int root,
             uintptr_t stream) {
            c.get("reduce")->reduce(pointer_from(send), pointer_from(recv), count, type, op, root, stream_from(stream));
          },
          nb::arg("send"), nb::arg("recv"), nb::arg("count"), nb::arg("dtype"), nb::arg("op"), nb::arg("root"),
          nb::arg("stream"), release_gil())
      .def(
          "reduce_scatter",
          [](PyCommunicator& c, uintptr_t send, uintptr_t recv, size_t recv_count, DataType type, ReduceOp op,
             uintptr_t stream) {
            c.get("reduce_scatter")
                ->reduce_scatter(pointer_from(send), pointer_from(recv), recv_count, type, op, stream_from(stream));
          },
          nb::arg("send"), nb::arg("recv"), nb::arg("recv_count"), nb::arg("dtype"), nb::arg("op"), nb::arg("stream"),
          release_gil())
      .def(
          "all_gather",
          [](PyCommunicator& c, uintptr_t send, uintptr_t recv, size_t send_count, DataType type, uintptr_t stream) {
            c.get("all_gather")->all_gather(pointer_from(send), pointer_from(recv), send_count, type, stream_from(stream));
          },
          nb::arg("send"), nb::arg("recv"), nb::arg("send_count"), nb::arg("dtype"), nb::arg("stream"), release_gil())
      .def(
          "broadcast",
          [](PyCommunicator& c, uintptr_t send, uintptr_t recv, size_t count, DataType type, int root, uintptr_t stream) {
            c.get("broadcast")->broadcast(pointer_from(send), pointer_from(recv), count, type, root, stream_from(stream));
          },
          nb::arg("send"), nb::arg("recv"), nb::arg("count"), nb::arg("dtype"), nb::arg("root"), nb::arg("stream"),
          release_gil())
      .def(
          "all_to_all",
          [](PyCommunicator& c, uintptr_t send, uintptr_t recv, size_t count, DataType type, uintptr_t stream) {
            c.get("all_to_all")->all_to_all(pointer_from(send), pointer_from(recv), count, type, stream_from(stream));
          },
          nb::arg("send"), nb::arg("recv"), nb::arg("count"), nb::arg("dtype"), nb::arg("stream"), release_gil(),
          "count elements per rank, in both directions.")
      .def(
          "all_to_allv",
          [](PyCommunicator& c, uintptr_t send, const std::optional<std::vector<size_t>>& send_counts,
             const std::optional<std::vector<size_t>>& send_displs, uintptr_t recv,
             const std::optional<std::vector<size_t>>& recv_counts,
             const std::optional<std::vector<size_t>>& recv_displs, DataType type, uintptr_t stream) {
            const std::shared_ptr<Communicator> comm = c.get("all_to_allv");
            const char* function = "Communicator.all_to_allv";
            const int size = comm->size();
            comm->all_to_allv(pointer_from(send), per_rank(send_counts, size, function, "send_counts", true),
                             per_rank(send_displs, size, function, "send_displs", false), pointer_from(recv),
                             per_rank(recv_counts, size, function, "recv_counts", true),
                             per_rank(recv_displs, size, function, "recv_displs", false), type, stream_from(stream));
          },
          nb::arg("send"), nb::arg("send_counts").none(), nb::arg("send_displs").none(), nb::arg("recv"),
          nb::arg("recv_counts").none(), nb::arg("recv_displs").none(), nb::arg("dtype"), nb::arg("stream"),
          release_gil(),
          "MPI_Alltoallv's shape: host lists of one count (and displacement) per rank, in elements; None "
          "displacements: packed in rank order. send_counts and recv_counts are required: None, or a length other "
          "than the world size, raises braid.Error (INVALID_ARGUMENT) naming them.")
      .def(
          "all_to_allv_device",
          [](PyCommunicator& c, uintptr_t send, uintptr_t send_counts, uintptr_t send_displs, uintptr_t recv,
             size_t recv_capacity, uintptr_t recv_counts, uintptr_t recv_displs, DataType type, uintptr_t stream) {
            c.get("all_to_allv_device")
                ->all_to_allv_device(pointer_from(send), pointer_from<const int64_t>(send_counts),
                                    pointer_from<const int64_t>(send_displs), pointer_from(recv), recv_capacity,
                                    pointer_from<int64_t>(recv_counts), pointer_from<int64_t>(recv_displs), type,
                                    stream_from(stream));
          },
          nb::arg("send"), nb::arg("send_counts"), nb::arg("send_displs"), nb::arg("recv"), nb::arg("recv_capacity"),
          nb::arg("recv_counts"), nb::arg("recv_displs"), nb::arg("dtype"), nb::arg("stream"), release_gil(),
          "All-to-all-v with the send counts in device memory (int64, one per rank, in elements; decided on the "
          "GPU, capturable): send_displs a device array or 0 (packed). What arrives is packed in rank order into "
          "recv (recv_capacity elements); the counts received are written to the device array recv_counts and their "
          "offsets to recv_displs (or 0). A total above the capacity writes nothing into recv; check() reports it.")
      .def(
          "send",
          [](PyCommunicator& c, uintptr_t buffer, size_t count, DataType type, int peer, uintptr_t stream) {
            c.get("send")->send(pointer_from(buffer), count, type, peer, stream_from(stream));
          },
          nb::arg("buffer"), nb::arg("count"), nb::arg("dtype"), nb::arg("peer"), nb::arg("stream"), release_gil())
      .def(
          "recv",
          [](PyCommunicator& c, uintptr_t buffer, size_t count, DataType type, int peer, uintptr_t stream) {
            c.get("recv")->recv(pointer_from(buffer), count, type, peer, stream_from(stream));
          },
          nb::arg("buffer"), nb::arg("count"), nb::arg("dtype"), nb::arg("peer"), nb::arg("stream"), release_gil())
      .def(
          "send_recv",
          [](PyCommunicator& c, const std::vector<PointToPoint>& ops, uintptr_t stream) {
            c.get("send_recv")->send_recv(ops.empty() ? nullptr : ops.data(), ops.size(), stream_from(stream));
          },
          nb::arg("ops"), nb::arg("stream"), release_gil(),
          "A batch of sends and receives in flight together (NCCL's group of ncclSend/ncclRecv).")
      .def("__repr__", [](const PyCommunicator& c) {
        if (!c.alive()) return std::string("Communicator(destroyed)");
        PyCommunicator& self = const_cast<PyCommunicator&>(c);
        const std::shared_ptr<Communicator> comm = self.get("__repr__");
        return fmt::format("Communicator(rank={}, size={}, device={}, backend='{}')", comm->rank(), comm->size(),
                           comm->device(), comm->backend());
      });
}

}  // namespace braid::python
