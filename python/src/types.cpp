// Datatypes, reduction operators and point-to-point ops (braid/types.hpp). Enum members take Python's
// upper-case names; ReduceOp's follow torch.distributed.ReduceOp (PRODUCT for braid's kProd).
#include <fmt/format.h>
#include <nanobind/stl/string.h>

#include "braid/types.hpp"
#include "bindings.hpp"

namespace braid::python {

void bind_types(nb::module_& m) {
  nb::enum_<DataType>(m, "DataType", "Element types of braid's calls (NCCL's set and numbering).")
      .value("INT8", DataType::kInt8)
      .value("UINT8", DataType::kUint8)
      .value("INT32", DataType::kInt32)
      .value("UINT32", DataType::kUint32)
      .value("INT64", DataType::kInt64)
      .value("UINT64", DataType::kUint64)
      .value("FLOAT16", DataType::kFloat16)
      .value("FLOAT32", DataType::kFloat32)
      .value("FLOAT64", DataType::kFloat64)
      .value("BFLOAT16", DataType::kBFloat16)
      .value("FLOAT8_E4M3", DataType::kFloat8E4M3)
      .value("FLOAT8_E5M2", DataType::kFloat8E5M2);

  nb::enum_<ReduceOp>(m, "ReduceOp", "Reduction operators (torch.distributed.ReduceOp's names).")
      .value("SUM", ReduceOp::kSum)
      .value("PRODUCT", ReduceOp::kProd)
      .value("MAX", ReduceOp::kMax)
      .value("MIN", ReduceOp::kMin)
      .value("AVG", ReduceOp::kAvg);

  m.def("datatype_size", &datatype_size, nb::arg("dtype"), "Bytes of one element of dtype.");
  m.def(
      "datatype_name", [](DataType type) { return std::string(datatype_name(type)); }, nb::arg("dtype"),
      "braid's name of dtype ('float32', 'bfloat16', ...).");

  nb::class_<PointToPoint> p2p(m, "PointToPoint",
                               "One send or receive of a Communicator.send_recv batch (pointer: a device address).");
  nb::enum_<PointToPoint::Kind>(p2p, "Kind").value("SEND", PointToPoint::kSend).value("RECV", PointToPoint::kRecv);
  p2p.def(
         "__init__",
         [](PointToPoint* self, PointToPoint::Kind kind, int peer, uintptr_t pointer, size_t count, DataType type) {
           new (self) PointToPoint{kind, peer, pointer_from(pointer), count, type};
         },
         nb::arg("kind"), nb::arg("peer"), nb::arg("pointer"), nb::arg("count"), nb::arg("dtype"))
      .def_rw("kind", &PointToPoint::kind)
      .def_rw("peer", &PointToPoint::peer)
      .def_prop_rw(
          "pointer", [](const PointToPoint& op) { return address_of(op.buffer); },
          [](PointToPoint& op, uintptr_t pointer) { op.buffer = pointer_from(pointer); })
      .def_rw("count", &PointToPoint::count)
      .def_rw("dtype", &PointToPoint::type)
      .def("__repr__", [](const PointToPoint& op) {
        return fmt::format("PointToPoint({}, peer={}, pointer={:#x}, count={}, dtype={})",
                           op.kind == PointToPoint::kSend ? "SEND" : "RECV", op.peer, address_of(op.buffer), op.count,
                           datatype_name(op.type));
      });
}

}  // namespace braid::python
