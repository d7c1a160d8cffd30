// braid::FusedMatmul (braid/fused_matmul.hpp) for Python: the GEMMs of tensor-parallel layers fused with their
// all-gather or reduce-scatter. Matrices are device addresses with their extents, streams cudaStream_t ints, as in
// Communicator's calls; the braid package (braid/ops.py) turns tensors into them. Every call names its communicator
// first, so a call after Communicator.destroy() raises braid.Error instead of reaching a freed communicator.
#include <nanobind/stl/string.h>

#include <optional>

#include <fmt/format.h>

#include "braid/fused_matmul.hpp"
#include "bindings.hpp"

namespace braid::python {
namespace {

using release_gil = nb::call_guard<nb::gil_scoped_release>;

// A FusedMatmul and the Python communicator it was made on (kept alive by the binding's keep_alive).
class PyFusedMatmul {
 public:
  explicit PyFusedMatmul(PyCommunicator& comm)
      : comm_(&comm), fused_(FusedMatmul::create(*comm.get("FusedMatmul"))), device_(comm.get("FusedMatmul")->device()) {}

  // The FusedMatmul, or braid.Error naming `function` once its communicator was destroyed or close() ran.
  FusedMatmul& get(const char* function) {
    comm_->get(function);
    if (!fused_) {
      throw Error(ErrorCode::kInvalidArgument, fmt::format("FusedMatmul.{}: the FusedMatmul was closed", function));
    }
    return *fused_;
  }
  void close() { fused_.reset(); }
  bool closed() const { return !fused_.has_value(); }
  int device() const { return device_; }

 private:
  PyCommunicator* comm_;
  std::optional<FusedMatmul> fused_;
  int device_ = -1;
};

}  // namespace

void bind_fused_matmul(nb::module_& m) {
  nb::enum_<Layout>(m, "Layout", "How a K x N matrix B is stored (braid::Layout): ROW_MAJOR [K, N], or TRANSPOSED "
                                 "[N, K] (a torch Linear layer's weight).")
      .value("ROW_MAJOR", Layout::kRowMajor)
      .value("TRANSPOSED", Layout::kTransposed);

  nb::class_<PyFusedMatmul>(m, "FusedMatmul",
                            "GEMMs fused with their collective on one communicator (braid::FusedMatmul): a cuBLASLt "
                            "handle, a side stream and a symmetric workspace that grows to the largest call. "
                            "Matrices are dense row-major device addresses, streams cudaStream_t ints.")
      .def(nb::init<PyCommunicator&>(), nb::arg("comm"), nb::keep_alive<1, 2>(), release_gil(),
           "Local (no peer takes part). comm must use the CUDA backend; cuBLASLt is loaded at run time. The object "
           "keeps comm alive.")
      .def(
          "all_gather_matmul",
          [](PyFusedMatmul& f, uintptr_t a_shard, size_t rows, size_t k, uintptr_t b, Layout b_layout, size_t n,
             uintptr_t out, uintptr_t a_gathered, DataType type, uintptr_t stream) {
            f.get("all_gather_matmul")
                .all_gather_matmul(pointer_from(a_shard), rows, k, pointer_from(b), b_layout, n, pointer_from(out),
                                   pointer_from(a_gathered), type, stream_from(stream));
          },
          nb::arg("a_shard"), nb::arg("rows"), nb::arg("k"), nb::arg("b"), nb::arg("b_layout"), nb::arg("n"),
          nb::arg("out"), nb::arg("a_gathered"), nb::arg("dtype"), nb::arg("stream"), release_gil(),
          "Collective: out [rows * size, n] = all_gather(a_shard [rows, k]) x B (k x n, stored as b_layout says); "
          "a_gathered 0, or [rows * size, k] that receives the gathered A.")
      .def(
          "matmul_reduce_scatter",
          [](PyFusedMatmul& f, uintptr_t a, size_t m, size_t k, uintptr_t b, Layout b_layout, size_t n, uintptr_t out,
             DataType type, ReduceOp op, uintptr_t stream) {
            f.get("matmul_reduce_scatter")
                .matmul_reduce_scatter(pointer_from(a), m, k, pointer_from(b), b_layout, n, pointer_from(out), type,
                                       op, stream_from(stream));
          },
          nb::arg("a"), nb::arg("m"), nb::arg("k"), nb::arg("b"), nb::arg("b_layout"), nb::arg("n"), nb::arg("out"),
          nb::arg("dtype"), nb::arg("op"), nb::arg("stream"), release_gil(),
          "Collective: out [m / size, n] = block rank() of op (SUM or AVG) over the ranks of a [m, k] x B; m must "
          "divide by the world size.")
      .def(
          "reserve", [](PyFusedMatmul& f, size_t bytes) { f.get("reserve").reserve(bytes); }, nb::arg("bytes"),
          release_gil(),
          "Collective: grows the symmetric workspace to at least `bytes` now (workspace_bytes after an eager call "
          "of the largest shape is what that shape needs). Not inside a graph capture.")
      .def_prop_ro(
          "workspace_bytes", [](PyFusedMatmul& f) { return f.get("workspace_bytes").workspace_bytes(); },
          "The symmetric workspace's bytes on this rank now.")
      .def_prop_ro(
          "epilogue_reduce_scatters",
          [](PyFusedMatmul& f) { return f.get("epilogue_reduce_scatters").epilogue_reduce_scatters(); },
          "The matmul_reduce_scatter calls run as one launch of braid's Hopper GEMM with the reduce-scatter in its "
          "epilogue (BRAID_MATMUL_REDUCE_SCATTER=epilogue or engines), captured ones counted once at capture.")
      .def_prop_ro(
          "all_gathers_under_loads",
          [](PyFusedMatmul& f) { return f.get("all_gathers_under_loads").all_gathers_under_loads(); },
          "The all_gather_matmul calls run as one launch of braid's Hopper GEMM with the all-gather under its loads "
          "(BRAID_ALL_GATHER_MATMUL=loads), captured ones counted once at capture.")
      .def_prop_ro("device", &PyFusedMatmul::device, "CUDA ordinal of the communicator's GPU.")
      .def("close", &PyFusedMatmul::close, release_gil(),
           "Frees the cuBLASLt handle, the side stream and the workspace now (later calls raise braid.Error).")
      .def_prop_ro("closed", &PyFusedMatmul::closed)
      .def("__repr__", [](const PyFusedMatmul& f) {
        return fmt::format("FusedMatmul(device={}{})", f.device(), f.closed() ? ", closed" : "");
      });
}

}  // namespace braid::python
