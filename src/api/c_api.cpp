// The C API: thin wrappers that turn braid::Error into codes and keep the message per thread.
#include "braid/braid.h"

#include <string>

#include "braid/braid.hpp"
#include "core/error.hpp"

// braidSend/braidRecv pass a braidDataType_t on as a braid::DataType: the values must agree one for one.
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

struct braidComm {
  braid::Communicator comm;
};
struct braidSymmetricMemory {
  braid::SymmetricMemory memory;
};

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
  }
}

template <typename T>
void require(const T* pointer, const char* function, const char* argument) {
  if (pointer == nullptr) braid::raise_invalid_argument(function, argument, "is NULL");
}

}  // namespace

extern "C" {

const char* braidGetErrorString(braidResult_t result) {
  return braid::error_code_name(static_cast<braid::ErrorCode>(result));
}

const char* braidGetLastError(void) { return t_last_error.c_str(); }

braidResult_t braidCommInitFromEnv(braidComm_t* comm, int device) {
  return guarded([&] {
    require(comm, "braidCommInitFromEnv", "comm");
    *comm = nullptr;
    braid::CommOptions options;
    options.device = device;
    *comm = new braidComm{braid::Communicator::init(braid::Rendezvous::from_env(), options)};
  });
}

braidResult_t braidCommInitRank(braidComm_t* comm, const char* store_address, int rank, int size,
                                int rank0_serves_store, int device) {
  return guarded([&] {
    require(comm, "braidCommInitRank", "comm");
    require(store_address, "braidCommInitRank", "store_address");
    *comm = nullptr;
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
    require(comm, "braidSymmetricAlloc", "comm");
    require(memory, "braidSymmetricAlloc", "memory");
    *memory = nullptr;
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
    comm->comm.send(buffer, count, static_cast<braid::DataType>(datatype), peer, stream);
  });
}

braidResult_t braidRecv(braidComm_t comm, void* buffer, size_t count, braidDataType_t datatype, int peer,
                        braidStream_t stream) {
  return guarded([&] {
    require(comm, "braidRecv", "comm");
    comm->comm.recv(buffer, count, static_cast<braid::DataType>(datatype), peer, stream);
  });
}

}  // extern "C"
