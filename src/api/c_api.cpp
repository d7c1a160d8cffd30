// The C API: thin wrappers that turn braid::Error into codes and keep the message per thread.
#include "braid/braid.h"

#include <string>
#include <vector>

#include "braid/braid.hpp"
#include "braid/fused_matmul.hpp"
#include "core/error.hpp"

// guarded() returns a braid::ErrorCode as a braidResult_t: the values must agree one for one.
static constexpr bool same_code(braidResult_t c, braid::ErrorCode cpp) {
  return static_cast<int>(c) == static_cast<int>(cpp);
}
static_assert(same_code(braidSuccess, braid::ErrorCode::kSuccess) &&
                  same_code(braidInvalidArgument, braid::ErrorCode::kInvalidArgument) &&
                  same_code(braidNoDevice, braid::ErrorCode::kNoDevice) &&
                  same_code(braidCudaError, braid::ErrorCode::kCudaError) &&
                  same_code(braidDriverError, braid::ErrorCode::kDriverError) &&
                  same_code(braidSystemError, braid::ErrorCode::kSystemError) &&
                  same_code(braidTimeout, braid::ErrorCode::kTimeout) &&
                  same_code(braidPeerUnreachable, braid::ErrorCode::kPeerUnreachable) &&
                  same_code(braidMismatch, braid::ErrorCode::kMismatch) &&
                  same_code(braidUnsupported, braid::ErrorCode::kUnsupported) &&
                  same_code(braidRemoteError, braid::ErrorCode::kRemoteError) &&
                  same_code(braidInternalError, braid::ErrorCode::kInternal) &&
                  same_code(braidAborted, braid::ErrorCode::kAborted) &&
                  same_code(braidRevoked, braid::ErrorCode::kRevoked),
              "braidResult_t and braid::ErrorCode disagree");

// Every call passes a braidDataType_t on as a braid::DataType (data_type()): the values must agree one for one.
static constexpr bool same_value(braidDataType_t c, braid::DataType cpp) { return static_cast<int>(c) == static_cast<int>(cpp); }
static_assert(same_value(braidInt8, braid::DataType::kInt8) && same_value(braidUint8, braid::DataType::kUint8) &&
                  same_value(braidInt32, braid::DataType::kInt32) && same_value(braidUint32, braid::DataType::kUint32) &&
                  same_value(braidInt64, braid::DataType::kInt64) && same_value(braidUint64, braid::DataType::kUint64) &&
                  same_value(braidFloat16, braid::DataType::kFloat16) && same_value(braidFloat32, braid::DataType::kFloat32) &&
                  same_value(braidFloat64, braid::DataType::kFloat64) &&
                  same_value(braidBfloat16, braid::DataType::kBFloat16) &&
                  same_value(braidFloat8e4m3, braid::DataType::kFloat8E4M3) &&
                  same_value(braidFloat8e5m2, braid::DataType::kFloat8E5M2) && braid::kDataTypeCount == 12,
              "braidDataType_t and braid::DataType disagree");

static constexpr bool same_op(braidRedOp_t c, braid::ReduceOp cpp) { return static_cast<int>(c) == static_cast<int>(cpp); }
static_assert(same_op(braidSum, braid::ReduceOp::kSum) && same_op(braidProd, braid::ReduceOp::kProd) &&
                  same_op(braidMax, braid::ReduceOp::kMax) && same_op(braidMin, braid::ReduceOp::kMin) &&
                  same_op(braidAvg, braid::ReduceOp::kAvg) && braid::kReduceOpCount == 5,
              "braidRedOp_t and braid::ReduceOp disagree");
static_assert(static_cast<int>(braidP2PSend) == braid::PointToPoint::kSend &&
                  static_cast<int>(braidP2PRecv) == braid::PointToPoint::kRecv,
              "braidP2PKind_t and braid::PointToPoint::Kind disagree");

struct braidComm {
  braid::Communicator comm;
};
struct braidSymmetricMemory {
  braid::SymmetricMemory memory;
};
struct braidRegisteredBuffer {
  braid::RegisteredBuffer buffer;
};
struct braidExportedHandle {
  braid::ExportedHandle handle;
};
struct braidImportedMemory {
  braid::ImportedMemory memory;
};
struct braidGlobalMemory {
  braid::GlobalMemory memory;
};
struct braidMoeBuffer {
  braid::MoeBuffer buffer;
};
static_assert(static_cast<int>(braidMoeExpertMajor) == static_cast<int>(braid::MoeLayout::kExpertMajor) &&
                  static_cast<int>(braidMoeRankMajor) == static_cast<int>(braid::MoeLayout::kRankMajor),
              "braidMoeLayout_t and braid::MoeLayout disagree");
struct braidFusedMatmul {
  braid::FusedMatmul fused;
};
static_assert(static_cast<int>(braidLayoutRowMajor) == static_cast<int>(braid::Layout::kRowMajor) &&
                  static_cast<int>(braidLayoutTransposed) == static_cast<int>(braid::Layout::kTransposed),
              "braidLayout_t and braid::Layout disagree");

namespace {

thread_local std::string t_last_error;

// Runs `body`, mapping every exception to a code and remembering its message.
template <typename Body>
braidResult_t guarded(Body&& body) {
  try {
    body();
    return braidSuccess;
  } catch (const braid::Error& error) {
    t_last_error = error.what();
    return static_cast<braidResult_t>(error.code());
  } catch (const std::bad_alloc&) {
    t_last_error = "host memory allocation failed";
    return braidSystemError;
  } catch (const std::exception& error) {
    t_last_error = error.what();
    return braidInternalError;
  } catch (...) {
    t_last_error = "an exception that is not a std::exception";
    return braidInternalError;
  }
}

template <typename T>
void require(const T* pointer, const char* function, const char* argument) {
  if (pointer == nullptr) braid::raise_invalid_argument(function, argument, "is NULL");
}

// A constructor's out-parameter is NULL from its first step until its object is made, whatever fails.
template <typename T>
void clear_output(T** out) {
  if (out != nullptr) *out = nullptr;
}

braid::DataType data_type(braidDataType_t datatype) { return static_cast<braid::DataType>(datatype); }
braid::ReduceOp reduce_op(braidRedOp_t op) { return static_cast<braid::ReduceOp>(op); }

braidMoeDispatchOutput_t dispatch_output(const braid::MoeDispatchOutput& got) {
  return braidMoeDispatchOutput_t{got.x,           got.scales,          got.expert_counts, got.expert_offsets,
                                  got.weights,     got.local_expert,    got.source_rank,   got.source_token,
                                  got.received_tokens, got.topk_expert, got.topk_weights,  got.combine_input,
                                  got.capacity_rows, got.local_experts, got.handle.dispatch};
}

}  // namespace

extern "C" {

const char* braidGetErrorString(braidResult_t result) {
  return braid::error_code_name(static_cast<braid::ErrorCode>(result));
}

const char* braidGetLastError(void) { return t_last_error.c_str(); }

braidResult_t braidCommInitFromEnv(braidComm_t* comm, int device) {
  return guarded([&] {
    clear_output(comm);
    require(comm, "braidCommInitFromEnv", "comm");
    braid::CommOptions options;
    options.device = device;
    *comm = new braidComm{braid::Communicator::init(braid::Rendezvous::from_env(), options)};
  });
}

braidResult_t braidCommInitRank(braidComm_t* comm, const char* store_address, int rank, int size,
                                int rank0_serves_store, int device) {
  return guarded([&] {
    clear_output(comm);
    require(comm, "braidCommInitRank", "comm");
    require(store_address, "braidCommInitRank", "store_address");
    braid::CommOptions options;
    options.device = device;
    *comm = new braidComm{braid::Communicator::init(
        braid::Rendezvous::at_store(store_address, rank, size, rank0_serves_store != 0), options)};
  });
}

braidResult_t braidCommDestroy(braidComm_t comm) {
  return guarded([&] { delete comm; });
}

braidResult_t braidCommRank(braidComm_t comm, int* rank) {
  return guarded([&] {
    require(comm, "braidCommRank", "comm");
    require(rank, "braidCommRank", "rank");
    *rank = comm->comm.rank();
  });
}

braidResult_t braidCommSize(braidComm_t comm, int* size) {
  return guarded([&] {
    require(comm, "braidCommSize", "comm");
    require(size, "braidCommSize", "size");
    *size = comm->comm.size();
  });
}

braidResult_t braidCommDevice(braidComm_t comm, int* device) {
  return guarded([&] {
    require(comm, "braidCommDevice", "comm");
    require(device, "braidCommDevice", "device");
    *device = comm->comm.device();
  });
}

braidResult_t braidCommBarrier(braidComm_t comm) {
  return guarded([&] {
    require(comm, "braidCommBarrier", "comm");
    comm->comm.barrier();
  });
}

braidResult_t braidSymmetricAlloc(braidComm_t comm, size_t bytes, int contiguous_view, braidSymmetricMemory_t* memory) {
  return guarded([&] {
    clear_output(memory);
    require(comm, "braidSymmetricAlloc", "comm");
    require(memory, "braidSymmetricAlloc", "memory");
    braid::AllocOptions options;
    options.contiguous_view = contiguous_view != 0;
    *memory = new braidSymmetricMemory{comm->comm.alloc(bytes, options)};
  });
}

braidResult_t braidSymmetricFree(braidSymmetricMemory_t memory) {
  return guarded([&] { delete memory; });
}

braidResult_t braidSymmetricLocal(braidSymmetricMemory_t memory, void** pointer) {
  return guarded([&] {
    require(memory, "braidSymmetricLocal", "memory");
    require(pointer, "braidSymmetricLocal", "pointer");
    *pointer = memory->memory.local();
  });
}

braidResult_t braidSymmetricPeer(braidSymmetricMemory_t memory, int rank, void** pointer) {
  return guarded([&] {
    require(memory, "braidSymmetricPeer", "memory");
    require(pointer, "braidSymmetricPeer", "pointer");
    *pointer = memory->memory.peer(rank);
  });
}

braidResult_t braidSymmetricDevicePeers(braidSymmetricMemory_t memory, void* const** device_array) {
  return guarded([&] {
    require(memory, "braidSymmetricDevicePeers", "memory");
    require(device_array, "braidSymmetricDevicePeers", "device_array");
    *device_array = memory->memory.device_peers();
  });
}

braidResult_t braidSymmetricView(braidSymmetricMemory_t memory, void** view, size_t* stride) {
  return guarded([&] {
    require(memory, "braidSymmetricView", "memory");
    require(view, "braidSymmetricView", "view");
    *view = memory->memory.view();
    if (stride != nullptr) *stride = memory->memory.view_stride();
  });
}

braidResult_t braidSend(braidComm_t comm, const void* buffer, size_t count, braidDataType_t datatype, int peer,
                        braidStream_t stream) {
  return guarded([&] {
    require(comm, "braidSend", "comm");
    comm->comm.send(buffer, count, data_type(datatype), peer, stream);
  });
}

braidResult_t braidRecv(braidComm_t comm, void* buffer, size_t count, braidDataType_t datatype, int peer,
                        braidStream_t stream) {
  return guarded([&] {
    require(comm, "braidRecv", "comm");
    comm->comm.recv(buffer, count, data_type(datatype), peer, stream);
  });
}

braidResult_t braidAllReduce(braidComm_t comm, const void* sendbuff, void* recvbuff, size_t count,
                             braidDataType_t datatype, braidRedOp_t op, braidStream_t stream) {
  return guarded([&] {
    require(comm, "braidAllReduce", "comm");
    comm->comm.all_reduce(sendbuff, recvbuff, count, data_type(datatype), reduce_op(op), stream);
  });
}

braidResult_t braidReduce(braidComm_t comm, const void* sendbuff, void* recvbuff, size_t count,
                          braidDataType_t datatype, braidRedOp_t op, int root, braidStream_t stream) {
  return guarded([&] {
    require(comm, "braidReduce", "comm");
    comm->comm.reduce(sendbuff, recvbuff, count, data_type(datatype), reduce_op(op), root, stream);
  });
}

braidResult_t braidReduceScatter(braidComm_t comm, const void* sendbuff, void* recvbuff, size_t recvcount,
                                 braidDataType_t datatype, braidRedOp_t op, braidStream_t stream) {
  return guarded([&] {
    require(comm, "braidReduceScatter", "comm");
    comm->comm.reduce_scatter(sendbuff, recvbuff, recvcount, data_type(datatype), reduce_op(op), stream);
  });
}

braidResult_t braidAllGather(braidComm_t comm, const void* sendbuff, void* recvbuff, size_t sendcount,
                             braidDataType_t datatype, braidStream_t stream) {
  return guarded([&] {
    require(comm, "braidAllGather", "comm");
    comm->comm.all_gather(sendbuff, recvbuff, sendcount, data_type(datatype), stream);
  });
}

braidResult_t braidBroadcast(braidComm_t comm, const void* sendbuff, void* recvbuff, size_t count,
                             braidDataType_t datatype, int root, braidStream_t stream) {
  return guarded([&] {
    require(comm, "braidBroadcast", "comm");
    comm->comm.broadcast(sendbuff, recvbuff, count, data_type(datatype), root, stream);
  });
}

braidResult_t braidAllToAll(braidComm_t comm, const void* sendbuff, void* recvbuff, size_t count,
                            braidDataType_t datatype, braidStream_t stream) {
  return guarded([&] {
    require(comm, "braidAllToAll", "comm");
    comm->comm.all_to_all(sendbuff, recvbuff, count, data_type(datatype), stream);
  });
}

braidResult_t braidAllToAllv(braidComm_t comm, const void* sendbuff, const size_t* sendcounts, const size_t* sdispls,
                             void* recvbuff, const size_t* recvcounts, const size_t* rdispls, braidDataType_t datatype,
                             braidStream_t stream) {
  return guarded([&] {
    require(comm, "braidAllToAllv", "comm");
    require(sendcounts, "braidAllToAllv", "sendcounts");
    require(recvcounts, "braidAllToAllv", "recvcounts");
    comm->comm.all_to_allv(sendbuff, sendcounts, sdispls, recvbuff, recvcounts, rdispls, data_type(datatype), stream);
  });
}

braidResult_t braidAllToAllvDevice(braidComm_t comm, const void* sendbuff, const int64_t* sendcounts,
                                   const int64_t* sdispls, void* recvbuff, size_t recvcapacity, int64_t* recvcounts,
                                   int64_t* rdispls, braidDataType_t datatype, braidStream_t stream) {
  return guarded([&] {
    require(comm, "braidAllToAllvDevice", "comm");
    require(sendcounts, "braidAllToAllvDevice", "sendcounts");
    require(recvcounts, "braidAllToAllvDevice", "recvcounts");
    comm->comm.all_to_allv_device(sendbuff, sendcounts, sdispls, recvbuff, recvcapacity, recvcounts, rdispls,
                                  data_type(datatype), stream);
  });
}

braidResult_t braidCommCheck(braidComm_t comm) {
  return guarded([&] {
    require(comm, "braidCommCheck", "comm");
    comm->comm.check();
  });
}

braidResult_t braidCommAbort(braidComm_t comm) {
  return guarded([&] {
    require(comm, "braidCommAbort", "comm");
    comm->comm.abort();
  });
}

braidResult_t braidCommRevoke(braidComm_t comm) {
  return guarded([&] {
    require(comm, "braidCommRevoke", "comm");
    comm->comm.revoke();
  });
}

braidResult_t braidCommShrink(braidComm_t comm, const int* excluded, size_t count, braidComm_t* newcomm) {
  return guarded([&] {
    clear_output(newcomm);
    require(comm, "braidCommShrink", "comm");
    require(newcomm, "braidCommShrink", "newcomm");
    if (excluded == nullptr && count > 0) {
      braid::raise_invalid_argument("braidCommShrink", "excluded", "is NULL with count {}", count);
    }
    const std::vector<int> ranks(excluded, excluded + count);
    *newcomm = new braidComm{comm->comm.shrink(ranks)};
  });
}

braidResult_t braidSendRecv(braidComm_t comm, const braidP2POp_t* ops, size_t count, braidStream_t stream) {
  return guarded([&] {
    require(comm, "braidSendRecv", "comm");
    if (ops == nullptr && count > 0) braid::raise_invalid_argument("braidSendRecv", "ops", "is NULL with count {}", count);
    std::vector<braid::PointToPoint> batch(count);
    for (size_t i = 0; i < count; ++i) {
      batch[i] = braid::PointToPoint{static_cast<braid::PointToPoint::Kind>(ops[i].kind), ops[i].peer, ops[i].buffer,
                                     ops[i].count, data_type(ops[i].datatype)};
    }
    comm->comm.send_recv(batch.data(), batch.size(), stream);
  });
}

braidResult_t braidRegisterBuffer(braidComm_t comm, void* pointer, size_t bytes, braidRegisteredBuffer_t* buffer) {
  return guarded([&] {
    clear_output(buffer);
    require(comm, "braidRegisterBuffer", "comm");
    require(buffer, "braidRegisterBuffer", "buffer");
    *buffer = new braidRegisteredBuffer{comm->comm.register_buffer(pointer, bytes)};
  });
}

braidResult_t braidDeregisterBuffer(braidRegisteredBuffer_t buffer) {
  return guarded([&] { delete buffer; });
}

braidResult_t braidExportHandle(const void* pointer, size_t bytes, int device, braidExportedHandle_t* handle) {
  return guarded([&] {
    clear_output(handle);
    require(handle, "braidExportHandle", "handle");
    *handle = new braidExportedHandle{braid::export_handle(pointer, bytes, device)};
  });
}

braidResult_t braidExportedBlob(braidExportedHandle_t handle, const void** blob, size_t* size) {
  return guarded([&] {
    require(handle, "braidExportedBlob", "handle");
    require(blob, "braidExportedBlob", "blob");
    require(size, "braidExportedBlob", "size");
    *blob = handle->handle.blob().data();
    *size = handle->handle.blob().size();
  });
}

braidResult_t braidExportedHandleFree(braidExportedHandle_t handle) {
  return guarded([&] { delete handle; });
}

braidResult_t braidImportHandle(const void* blob, size_t size, int device, braidImportedMemory_t* memory) {
  return guarded([&] {
    clear_output(memory);
    require(memory, "braidImportHandle", "memory");
    if (blob == nullptr && size > 0) braid::raise_invalid_argument("braidImportHandle", "blob", "is NULL with size {}", size);
    const std::string text = blob == nullptr ? std::string() : std::string(static_cast<const char*>(blob), size);
    *memory = new braidImportedMemory{braid::import_handle(text, device)};
  });
}

braidResult_t braidImportedPointer(braidImportedMemory_t memory, void** pointer, size_t* bytes) {
  return guarded([&] {
    require(memory, "braidImportedPointer", "memory");
    require(pointer, "braidImportedPointer", "pointer");
    *pointer = memory->memory.data();
    if (bytes != nullptr) *bytes = memory->memory.bytes();
  });
}

braidResult_t braidImportedMemoryFree(braidImportedMemory_t memory) {
  return guarded([&] { delete memory; });
}

braidResult_t braidImportGlobal(braidComm_t comm, braidExportedHandle_t mine, braidGlobalMemory_t* memory) {
  return guarded([&] {
    clear_output(memory);
    require(comm, "braidImportGlobal", "comm");
    require(memory, "braidImportGlobal", "memory");
    // A NULL mine is the C++ call's empty handle: refused (naming mine) after the ranks' exchange, so that the
    // other ranks fail at once too.
    *memory = new braidGlobalMemory{comm->comm.import_global(mine != nullptr ? mine->handle : braid::ExportedHandle())};
  });
}

braidResult_t braidGlobalPeer(braidGlobalMemory_t memory, int rank, void** pointer, size_t* bytes) {
  return guarded([&] {
    require(memory, "braidGlobalPeer", "memory");
    require(pointer, "braidGlobalPeer", "pointer");
    *pointer = memory->memory.peer(rank);
    if (bytes != nullptr) *bytes = memory->memory.bytes(rank);
  });
}

braidResult_t braidGlobalMemoryFree(braidGlobalMemory_t memory) {
  return guarded([&] { delete memory; });
}

braidResult_t braidPut(braidComm_t comm, braidGlobalMemory_t memory, int peer, size_t offset, const void* source,
                       size_t bytes, braidStream_t stream) {
  return guarded([&] {
    require(comm, "braidPut", "comm");
    require(memory, "braidPut", "memory");
    comm->comm.put(memory->memory, peer, offset, source, bytes, stream);
  });
}

braidResult_t braidGet(braidComm_t comm, braidGlobalMemory_t memory, int peer, size_t offset, void* destination,
                       size_t bytes, braidStream_t stream) {
  return guarded([&] {
    require(comm, "braidGet", "comm");
    require(memory, "braidGet", "memory");
    comm->comm.get(memory->memory, peer, offset, destination, bytes, stream);
  });
}

braidResult_t braidAllToAllGlobal(braidComm_t comm, braidGlobalMemory_t sendmemory, void* recvbuff, size_t count,
                                  braidDataType_t datatype, braidStream_t stream) {
  return guarded([&] {
    require(comm, "braidAllToAllGlobal", "comm");
    require(sendmemory, "braidAllToAllGlobal", "sendmemory");
    comm->comm.all_to_all(sendmemory->memory, recvbuff, count, data_type(datatype), stream);
  });
}

braidResult_t braidMoeShapeDefaults(braidMoeShape_t* shape) {
  return guarded([&] {
    require(shape, "braidMoeShapeDefaults", "shape");
    const braid::MoeShape defaults;
    *shape = braidMoeShape_t{};
    shape->datatype = shape->dispatch_datatype = static_cast<braidDataType_t>(defaults.type);
    shape->index_datatype = static_cast<braidDataType_t>(defaults.index_type);
    shape->expert_alignment = defaults.expert_alignment;
    shape->layout = static_cast<braidMoeLayout_t>(defaults.layout);
  });
}

braidResult_t braidMoeBufferCreate(braidComm_t comm, const braidMoeShape_t* shape, braidMoeBuffer_t* buffer) {
  return guarded([&] {
    clear_output(buffer);
    require(comm, "braidMoeBufferCreate", "comm");
    require(shape, "braidMoeBufferCreate", "shape");
    require(buffer, "braidMoeBufferCreate", "buffer");
    braid::MoeShape cpp;
    cpp.hidden = shape->hidden;
    cpp.type = data_type(shape->datatype);
    // Out-of-range values pass through: MoeBuffer::create refuses them inside the ranks' exchange of shapes, so every
    // rank fails at once (NOTE [a refused shape in the allgather]).
    if (shape->dispatch_datatype != shape->datatype) cpp.dispatch_type = data_type(shape->dispatch_datatype);
    cpp.index_type = data_type(shape->index_datatype);
    cpp.max_tokens = shape->max_tokens;
    cpp.top_k = shape->top_k;
    cpp.experts = shape->experts;
    cpp.expert_alignment = shape->expert_alignment;
    cpp.capacity_rows = shape->capacity_rows;
    cpp.layout = static_cast<braid::MoeLayout>(shape->layout);
    cpp.max_sms = shape->max_sms;
    cpp.low_latency = shape->low_latency != 0;
    *buffer = new braidMoeBuffer{braid::MoeBuffer::create(comm->comm, cpp)};
  });
}

braidResult_t braidMoeBufferFree(braidMoeBuffer_t buffer) {
  return guarded([&] { delete buffer; });
}

braidResult_t braidMoeCapacityRows(braidMoeBuffer_t buffer, size_t* rows) {
  return guarded([&] {
    require(buffer, "braidMoeCapacityRows", "buffer");
    require(rows, "braidMoeCapacityRows", "rows");
    *rows = buffer->buffer.capacity_rows();
  });
}

braidResult_t braidMoeDispatch(braidMoeBuffer_t buffer, const void* x, const float* x_scales, const void* topk_idx,
                               const float* topk_weights, size_t num_tokens, const int64_t* num_tokens_device,
                               braidStream_t stream, braidMoeDispatchOutput_t* output) {
  return guarded([&] {
    require(buffer, "braidMoeDispatch", "buffer");
    require(output, "braidMoeDispatch", "output");
    *output = dispatch_output(
        buffer->buffer.dispatch(x, x_scales, topk_idx, topk_weights, num_tokens, num_tokens_device, stream));
  });
}

braidResult_t braidMoeRedispatch(braidMoeBuffer_t buffer, uint64_t handle, const void* x, const float* x_scales,
                                 braidStream_t stream, braidMoeDispatchOutput_t* output) {
  return guarded([&] {
    require(buffer, "braidMoeRedispatch", "buffer");
    require(output, "braidMoeRedispatch", "output");
    *output = dispatch_output(buffer->buffer.redispatch(braid::MoeHandle{handle}, x, x_scales, stream));
  });
}

braidResult_t braidMoeCopyExpertCounts(braidMoeBuffer_t buffer, int64_t* host_counts, braidStream_t stream) {
  return guarded([&] {
    require(buffer, "braidMoeCopyExpertCounts", "buffer");
    require(host_counts, "braidMoeCopyExpertCounts", "host_counts");
    buffer->buffer.copy_expert_counts(host_counts, stream);
  });
}

braidResult_t braidMoeCombine(braidMoeBuffer_t buffer, const void* y, void* out, int weighted, braidStream_t stream) {
  return guarded([&] {
    require(buffer, "braidMoeCombine", "buffer");
    if (weighted != 0 && weighted != 1) {
      braid::raise_invalid_argument("braidMoeCombine", "weighted", "is {}; 0 or 1", weighted);
    }
    buffer->buffer.combine(y, out, weighted == 1, stream);
  });
}

braidResult_t braidFusedMatmulCreate(braidComm_t comm, braidFusedMatmul_t* fused) {
  return guarded([&] {
    clear_output(fused);
    require(comm, "braidFusedMatmulCreate", "comm");
    require(fused, "braidFusedMatmulCreate", "fused");
    *fused = new braidFusedMatmul{braid::FusedMatmul::create(comm->comm)};
  });
}

braidResult_t braidFusedMatmulFree(braidFusedMatmul_t fused) {
  return guarded([&] { delete fused; });
}

braidResult_t braidFusedMatmulReserve(braidFusedMatmul_t fused, size_t bytes) {
  return guarded([&] {
    require(fused, "braidFusedMatmulReserve", "fused");
    fused->fused.reserve(bytes);
  });
}

braidResult_t braidFusedMatmulWorkspaceBytes(braidFusedMatmul_t fused, size_t* bytes) {
  return guarded([&] {
    require(fused, "braidFusedMatmulWorkspaceBytes", "fused");
    require(bytes, "braidFusedMatmulWorkspaceBytes", "bytes");
    *bytes = fused->fused.workspace_bytes();
  });
}

braidResult_t braidAllGatherMatmul(braidFusedMatmul_t fused, const void* a_shard, size_t rows, size_t k, const void* b,
                                   braidLayout_t b_layout, size_t n, void* out, void* a_gathered,
                                   braidDataType_t type, braidStream_t stream) {
  return guarded([&] {
    require(fused, "braidAllGatherMatmul", "fused");
    fused->fused.all_gather_matmul(a_shard, rows, k, b, static_cast<braid::Layout>(b_layout), n, out, a_gathered,
                                   data_type(type), stream);
  });
}

braidResult_t braidMatmulReduceScatter(braidFusedMatmul_t fused, const void* a, size_t m, size_t k, const void* b,
                                       braidLayout_t b_layout, size_t n, void* out, braidDataType_t type,
                                       braidRedOp_t op, braidStream_t stream) {
  return guarded([&] {
    require(fused, "braidMatmulReduceScatter", "fused");
    fused->fused.matmul_reduce_scatter(a, m, k, b, static_cast<braid::Layout>(b_layout), n, out, data_type(type),
                                       reduce_op(op), stream);
  });
}

}  // extern "C"
