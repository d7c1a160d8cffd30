// MoE dispatch and combine (braid/moe.hpp) for Python: MoeShape, MoeBuffer, MoeDispatchOutput, MoeHandle and
// MoeHook, with buffers as device addresses and streams as cudaStream_t ints, like Communicator's calls. The
// views dispatch returns come back as addresses and, through MoeBuffer.arrays(), as uint8 DLPack arrays of the
// sizes moe.hpp gives each field, each holding the MoeBuffer object, so tensors made from them keep the buffer's
// memory alive. The braid package (braid/_moe.py) turns them into typed torch tensors once and reuses them: the
// addresses are the same for every dispatch of a buffer.
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <optional>
#include <utility>

#include <fmt/format.h>

#include "braid/braid.hpp"
#include "braid/moe.hpp"
#include "bindings.hpp"

namespace braid::python {
namespace {

using release_gil = nb::call_guard<nb::gil_scoped_release>;

// A MoeBuffer and what the arrays of its outputs need: the world size (received_tokens) and the GPU.
struct PyMoeBuffer {
  MoeBuffer buffer;
  int world = 0;
  int device = -1;
};

MoeHook* hook_from(std::optional<MoeHook*> hook) { return hook ? *hook : nullptr; }

}  // namespace

void bind_moe(nb::module_& m) {
  m.attr("MAX_TOP_K") = kMaxTopK;
  m.attr("MOE_MAX_EXPERTS") = kMoeMaxExperts;
  m.attr("MOE_SCALE_COLUMNS") = kMoeScaleColumns;

  nb::enum_<MoeLayout>(m, "MoeLayout", "How dispatch lays out the rows a rank receives (braid::MoeLayout).")
      .value("EXPERT_MAJOR", MoeLayout::kExpertMajor)
      .value("RANK_MAJOR", MoeLayout::kRankMajor);

  nb::class_<MoeShape>(m, "MoeShape", "What a MoeBuffer is made for (braid::MoeShape); every rank passes the same.")
      .def(nb::init<>())
      .def_rw("hidden", &MoeShape::hidden)
      .def_rw("type", &MoeShape::type)
      .def_rw("dispatch_type", &MoeShape::dispatch_type)
      .def_rw("index_type", &MoeShape::index_type)
      .def_rw("max_tokens", &MoeShape::max_tokens)
      .def_rw("top_k", &MoeShape::top_k)
      .def_rw("experts", &MoeShape::experts)
      .def_rw("expert_alignment", &MoeShape::expert_alignment)
      .def_rw("capacity_rows", &MoeShape::capacity_rows)
      .def_rw("layout", &MoeShape::layout)
      .def_rw("max_sms", &MoeShape::max_sms)
      .def_rw("low_latency", &MoeShape::low_latency)
      .def("__repr__", [](const MoeShape& s) {
        return fmt::format("MoeShape(hidden={}, type={}, dispatch_type={}, index_type={}, max_tokens={}, top_k={}, "
                           "experts={}, expert_alignment={}, capacity_rows={}, layout={}, max_sms={}, low_latency={})",
                           s.hidden, datatype_name(s.type), s.dispatch_type ? datatype_name(*s.dispatch_type) : "None",
                           datatype_name(s.index_type), s.max_tokens, s.top_k, s.experts, s.expert_alignment,
                           s.capacity_rows, s.layout == MoeLayout::kRankMajor ? "RANK_MAJOR" : "EXPERT_MAJOR",
                           s.max_sms, s.low_latency ? "True" : "False");
      });

  nb::class_<MoeHandle>(m, "MoeHandle", "Names one routed dispatch of a MoeBuffer (braid::MoeHandle).")
      .def(nb::init<>())
      .def_rw("dispatch", &MoeHandle::dispatch, "The buffer's routed dispatches up to and including this one.")
      .def("__repr__", [](const MoeHandle& h) { return fmt::format("MoeHandle(dispatch={})", h.dispatch); });

  nb::class_<MoeHook>(m, "MoeHook",
                      "The receiving half of a rank-major dispatch, redispatch or combine called with it "
                      "(braid::MoeHook). Valid while its MoeBuffer lives.")
      .def(nb::init<>())
      .def_prop_ro("pending", &MoeHook::pending, "Whether a receiving half is still to be enqueued.")
      .def(
          "receive", [](MoeHook& hook, uintptr_t stream) { hook.receive(stream_from(stream)); }, nb::arg("stream"),
          release_gil(), "Enqueues the receiving half on `stream`; once per hook.");

  nb::class_<MoeDispatchOutput>(m, "MoeDispatchOutput",
                                "What dispatch returns (braid::MoeDispatchOutput): addresses of views of the "
                                "buffer's memory, 0 for fields of the other layout.")
      .def_prop_ro("x", [](const MoeDispatchOutput& o) { return address_of(o.x); })
      .def_prop_ro("scales", [](const MoeDispatchOutput& o) { return address_of(o.scales); })
      .def_prop_ro("expert_counts", [](const MoeDispatchOutput& o) { return address_of(o.expert_counts); })
      .def_prop_ro("expert_offsets", [](const MoeDispatchOutput& o) { return address_of(o.expert_offsets); })
      .def_prop_ro("weights", [](const MoeDispatchOutput& o) { return address_of(o.weights); })
      .def_prop_ro("local_expert", [](const MoeDispatchOutput& o) { return address_of(o.local_expert); })
      .def_prop_ro("source_rank", [](const MoeDispatchOutput& o) { return address_of(o.source_rank); })
      .def_prop_ro("source_token", [](const MoeDispatchOutput& o) { return address_of(o.source_token); })
      .def_prop_ro("received_tokens", [](const MoeDispatchOutput& o) { return address_of(o.received_tokens); })
      .def_prop_ro("topk_expert", [](const MoeDispatchOutput& o) { return address_of(o.topk_expert); })
      .def_prop_ro("topk_weights", [](const MoeDispatchOutput& o) { return address_of(o.topk_weights); })
      .def_prop_ro("combine_input", [](const MoeDispatchOutput& o) { return address_of(o.combine_input); })
      .def_ro("capacity_rows", &MoeDispatchOutput::capacity_rows)
      .def_ro("local_experts", &MoeDispatchOutput::local_experts)
      .def_ro("handle", &MoeDispatchOutput::handle);

  nb::class_<PyMoeBuffer>(m, "MoeBuffer",
                          "Symmetric buffers for one MoE shape class on one communicator (braid::MoeBuffer). "
                          "Buffers are device addresses, streams cudaStream_t ints.")
      .def_static(
          "create",
          [](PyCommunicator& c, const MoeShape& shape) {
            const std::shared_ptr<Communicator> comm = c.get("MoeBuffer.create");
            return PyMoeBuffer{MoeBuffer::create(*comm, shape), comm->size(), comm->device()};
          },
          nb::arg("comm"), nb::arg("shape"), nb::keep_alive<0, 1>(), release_gil(),
          "Collective over comm's ranks, every rank with the same shape. The buffer keeps comm alive.")
      .def_static("worst_case_rows", &MoeBuffer::worst_case_rows, nb::arg("shape"), nb::arg("world"),
                  "Receive rows that no routing can exceed.")
      .def_static("symmetric_bytes", &MoeBuffer::symmetric_bytes, nb::arg("shape"), nb::arg("world"),
                  "Symmetric memory one MoeBuffer of this shape holds on each rank; validates the shape.")
      .def_prop_ro("shape", [](const PyMoeBuffer& b) { return b.buffer.shape(); })
      .def_prop_ro("capacity_rows", [](const PyMoeBuffer& b) { return b.buffer.capacity_rows(); })
      .def_ro("world_size", &PyMoeBuffer::world)
      .def_ro("device", &PyMoeBuffer::device)
      .def(
          "dispatch",
          [](PyMoeBuffer& b, uintptr_t x, uintptr_t x_scales, uintptr_t topk_idx, uintptr_t topk_weights,
             size_t num_tokens, uintptr_t num_tokens_device, uintptr_t stream, std::optional<MoeHook*> hook) {
            return b.buffer.dispatch(pointer_from(x), pointer_from<const float>(x_scales), pointer_from(topk_idx),
                                     pointer_from<const float>(topk_weights), num_tokens,
                                     pointer_from<const int64_t>(num_tokens_device), stream_from(stream),
                                     hook_from(hook));
          },
          nb::arg("x"), nb::arg("x_scales"), nb::arg("topk_idx"), nb::arg("topk_weights"), nb::arg("num_tokens"),
          nb::arg("num_tokens_device"), nb::arg("stream"), nb::arg("hook").none() = nb::none(), release_gil(),
          "x_scales 0 unless the shape dispatches fp8; num_tokens_device 0: T is num_tokens.")
      .def(
          "redispatch",
          [](PyMoeBuffer& b, const MoeHandle& handle, uintptr_t x, uintptr_t x_scales, uintptr_t stream,
             std::optional<MoeHook*> hook) {
            return b.buffer.redispatch(handle, pointer_from(x), pointer_from<const float>(x_scales),
                                       stream_from(stream), hook_from(hook));
          },
          nb::arg("handle"), nb::arg("x"), nb::arg("x_scales"), nb::arg("stream"), nb::arg("hook").none() = nb::none(),
          release_gil(), "Rank-major: new rows with the routing of the dispatch `handle` names.")
      .def(
          "combine",
          [](PyMoeBuffer& b, uintptr_t y, uintptr_t out, bool weighted, uintptr_t stream, std::optional<MoeHook*> hook,
             const std::optional<MoeHandle>& handle) {
            if (handle) {
              b.buffer.combine(*handle, pointer_from(y), pointer_from(out), weighted, stream_from(stream),
                               hook_from(hook));
            } else {
              b.buffer.combine(pointer_from(y), pointer_from(out), weighted, stream_from(stream), hook_from(hook));
            }
          },
          nb::arg("y"), nb::arg("out"), nb::arg("weighted"), nb::arg("stream"), nb::arg("hook").none() = nb::none(),
          nb::arg("handle").none() = nb::none(), release_gil(),
          "For the tokens of the last dispatch (or the one `handle` names, which must be the last).")
      .def(
          "copy_expert_counts",
          [](PyMoeBuffer& b, uintptr_t host_counts, uintptr_t stream) {
            b.buffer.copy_expert_counts(pointer_from<int64_t>(host_counts), stream_from(stream));
          },
          nb::arg("host_counts"), nb::arg("stream"), release_gil(),
          "One cudaMemcpyAsync of the last dispatch's expert_counts into host memory (pinned: capturable).")
      .def(
          "arrays",
          [](PyMoeBuffer& b, const MoeDispatchOutput& o) {
            // Byte sizes as moe.hpp gives each field: rows of capacity_rows, per local expert, per rank.
            const MoeShape& shape = b.buffer.shape();
            const size_t rows = o.capacity_rows;
            const size_t type_bytes = datatype_size(shape.type);
            const size_t moved_bytes = datatype_size(shape.dispatch_type.value_or(shape.type));
            const size_t local = static_cast<size_t>(o.local_experts);
            const size_t k = static_cast<size_t>(shape.top_k);
            nb::handle owner = nb::find(&b);
            nb::dict arrays;
            auto add = [&](const char* name, const void* pointer, size_t bytes) {
              if (pointer == nullptr) return;
              arrays[name] = device_array<uint8_t>(const_cast<void*>(pointer), bytes, b.device, owner);
            };
            add("x", o.x, rows * shape.hidden * moved_bytes);
            add("scales", o.scales, rows * (shape.hidden / kMoeScaleColumns) * sizeof(float));
            add("expert_counts", o.expert_counts, local * sizeof(int64_t));
            add("expert_offsets", o.expert_offsets, (local + 1) * sizeof(int64_t));
            add("weights", o.weights, rows * sizeof(float));
            add("local_expert", o.local_expert, rows * sizeof(int32_t));
            add("source_rank", o.source_rank, rows * sizeof(int32_t));
            add("source_token", o.source_token, rows * sizeof(int32_t));
            add("received_tokens", o.received_tokens, static_cast<size_t>(b.world) * sizeof(int64_t));
            add("topk_expert", o.topk_expert, rows * k * sizeof(int32_t));
            add("topk_weights", o.topk_weights, rows * k * sizeof(float));
            add("combine_input", o.combine_input, rows * shape.hidden * type_bytes);
            return arrays;
          },
          nb::arg("output"),
          "Each non-null field of a dispatch's output as uint8 DLPack arrays (of the byte sizes moe.hpp gives "
          "them) on this rank's GPU, each holding this buffer.")
      .def("__repr__", [](const PyMoeBuffer& b) {
        const MoeShape& s = b.buffer.shape();
        return fmt::format("MoeBuffer(hidden={}, max_tokens={}, top_k={}, experts={}, layout={}, capacity_rows={}, "
                           "world_size={}, device={})",
                           s.hidden, s.max_tokens, s.top_k, s.experts,
                           s.layout == MoeLayout::kRankMajor ? "RANK_MAJOR" : "EXPERT_MAJOR", b.buffer.capacity_rows(),
                           b.world, b.device);
      });
}

}  // namespace braid::python
