// Host-side reference for the collective tests: cases, their inputs, where their buffers lie, what every
// byte must hold afterwards, and a few CUDA helpers. Shared by test_collectives.cpp and
// test_collectives_stress.cpp.
//
// Inputs are a pure function of (case seed, rank, element index), so every rank can compute any rank's input
// and the reference result itself, with no exchange of data. Values are chosen so that the reference is
// well defined:
//   integers        full-width random bits (odd for prod, so products never vanish mod 2^w); the reference
//                   works in unsigned arithmetic of the same width (wrap-around), max/min compare signed
//                   values for signed types;
//   floating types  k * 2^-q with |k| <= 2^q, exactly representable in the type (values in [-1, 1]; for prod
//                   magnitudes in [0.5, 1.5] with a random sign); the reference is computed in double and
//                   compared with a tolerance relative to the sum of magnitudes (sum, avg) or to |result|
//                   (prod); max and min must be exact.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "braid/braid.hpp"

namespace braid::testing {

enum class Collective { kAllReduce, kReduce, kReduceScatter, kAllGather, kBroadcast };
constexpr Collective kAllCollectives[] = {Collective::kAllReduce, Collective::kReduce, Collective::kReduceScatter,
                                          Collective::kAllGather, Collective::kBroadcast};
constexpr DataType kAllDataTypes[] = {DataType::kInt8,   DataType::kUint8,   DataType::kInt32,   DataType::kUint32,
                                      DataType::kInt64,  DataType::kUint64,  DataType::kFloat16, DataType::kBFloat16,
                                      DataType::kFloat32, DataType::kFloat64, DataType::kFloat8E4M3,
                                      DataType::kFloat8E5M2};
constexpr ReduceOp kAllReduceOps[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kAvg};

const char* collective_name(Collective collective);  // "all_reduce", ...
bool is_reducing(Collective collective);             // takes an op
bool has_root(Collective collective);                // reduce, broadcast
std::vector<ReduceOp> supported_ops(DataType type);

constexpr unsigned char kPoison = 0xA5;  // every byte a call must not write holds this before the call

// One collective call, as every rank makes it.
struct Case {
  Collective collective = Collective::kAllReduce;
  DataType type = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;  // reducing collectives only
  size_t count = 0;              // the API's count: recv_count for reduce_scatter, send_count for all_gather
  int root = 0;                  // reduce and broadcast only
  bool in_place = false;         // recv == send, or send/recv at this rank's slot (all_gather, reduce_scatter)
  bool aligned = true;           // false: buffers start one element past a 256-byte boundary
  uint64_t seed = 0;             // of the inputs
};
std::string describe(const Case& c);

// `calls` cases drawn from the shared `seed` (the same on every rank): every collective, datatype and op it
// supports, any root, in place one case in four, misaligned one in three, each with its own input seed;
// `count(type, r1, r2)` turns two random words into the case's count.
std::vector<Case> random_cases(uint64_t seed, int world, size_t calls, size_t (*count)(DataType, uint64_t, uint64_t));

// Elements of the send and recv buffers of a case in a world of `world` ranks.
size_t send_elements(const Case& c, int world);
size_t recv_elements(const Case& c, int world);

// splitmix64's finaliser: a well-mixed 64-bit value of x.
uint64_t mix64(uint64_t x);
// A fresh seed drawn by rank 0 (std::random_device), or the one replay_seed() set, shared with every rank
// (host_allgather). Collective.
uint64_t shared_seed(Communicator& comm);
// From now on shared_seed() gives `seed` (braid_gpu_tests --seed=): a failure's seed, to replay its cases.
void replay_seed(uint64_t seed);

// Element `first + i` (i < count) of `rank`'s input for case c, as raw bytes into out.
void fill_input(const Case& c, int rank, size_t first, size_t count, void* out);

// Host-only pieces of the reference, exposed for its self-test.
uint64_t encode_exact(DataType floating_type, double value);  // throws std::logic_error if not exact
double decode_float(DataType floating_type, uint64_t bits);    // any bit pattern (NaN, inf, subnormals)
uint64_t reduce_integer(DataType integer_type, ReduceOp op, const std::vector<uint64_t>& inputs);  // masked bits
std::string format_element(DataType type, const void* element);  // "1.5 (0x3e00)", "-56 (0xc8)"

// Gives every case its own seed, derived from a test's shared one.
void seed_cases(std::vector<Case>& cases, uint64_t seed);
// Arena capacities (at least 256 bytes each) that hold any one of the cases.
void capacities(const std::vector<Case>& cases, int world, size_t& send_capacity, size_t& recv_capacity);

// A sequence of cases placed one after another in two device arenas (send, recv), each region framed by
// poisoned guard bytes. Knows each case's initial contents and what every byte must hold afterwards.
// Out of place, a case has a send region (send arena) and a recv region (recv arena); in place, one region
// in the recv arena (the larger of its send and recv buffers).
class Batch {
 public:
  static constexpr size_t kGuardBytes = 256;

  Batch(int rank, int world) : rank_(rank), world_(world) {}

  // Appends c when it fits in arenas of these capacities (bytes); false (and nothing added) otherwise.
  bool add(const Case& c, size_t send_capacity, size_t recv_capacity);
  // Bytes of each arena a batch holding only c needs.
  static void need(const Case& c, int world, size_t& send_bytes, size_t& recv_bytes);

  size_t size() const { return placed_.size(); }
  const Case& at(size_t i) const { return placed_[i].c; }
  size_t send_span() const { return send_used_; }  // bytes of each arena in use, guards included
  size_t recv_span() const { return recv_used_; }

  // The pointers to pass for case i, given the arenas' base addresses.
  const void* send_pointer(size_t i, void* send_base, void* recv_base) const;
  void* recv_pointer(size_t i, void* send_base, void* recv_base) const;

  // Initial contents of the spans: poison everywhere, then each case's input (this rank's) in place.
  void initial_images(std::vector<unsigned char>& send, std::vector<unsigned char>& recv) const;

  // Checks spans read back after every case ran, against the initial images: each case's output matches
  // the reference, and every other byte (inputs, guards, a non-root's recv, other ranks' blocks) is as it
  // was. One line per failing case (its index, the case, the first wrong element, expected and got, and
  // how many were wrong), at most max_lines; *failed_cases (optional) counts them all.
  std::vector<std::string> check(const std::vector<unsigned char>& initial_send,
                                 const std::vector<unsigned char>& initial_recv, const unsigned char* send,
                                 const unsigned char* recv, size_t max_lines, size_t* failed_cases = nullptr) const;

  // Where the first differing byte between two spans lies, in words ("case 3 (...): recv[17]").
  std::string locate(bool in_send_arena, size_t byte_offset) const;

 private:
  struct Region {
    size_t begin = 0;  // first guard byte, bytes from the arena base
    size_t data = 0;   // first element
    size_t bytes = 0;  // of the elements
    size_t end = 0;    // one past the last guard byte
  };
  struct Placed {
    Case c;
    bool has_send_region = false;  // out of place
    Region send;                   // send arena
    Region recv;                   // recv arena (in place: the one buffer)
  };
  static Region place(size_t& cursor, size_t elements, const Case& c);
  static std::string where(const Placed& p, bool in_send_arena, size_t byte_offset);  // "recv[12]", "guard byte 1 after send"
  std::string check_case(size_t index, const std::vector<unsigned char>& initial_send,
                         const std::vector<unsigned char>& initial_recv, const unsigned char* send,
                         const unsigned char* recv) const;

  int rank_;
  int world_;
  std::vector<Placed> placed_;
  size_t send_used_ = 0;
  size_t recv_used_ = 0;
};

// Enqueues case c on stream.
void launch(Communicator& comm, const Case& c, const void* send, void* recv, cudaStream_t stream);

// ---- CUDA helpers (throw std::runtime_error; the harness reports it with the rank) ----
void cuda_check(cudaError_t result, const std::string& what);

class DeviceBuffer {  // cudaMalloc'd
 public:
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return pointer_; }
  size_t bytes() const { return bytes_; }

 private:
  void* pointer_ = nullptr;
  size_t bytes_ = 0;
};

class StreamHandle {  // a non-blocking stream of the current device
 public:
  StreamHandle();
  ~StreamHandle();
  StreamHandle(const StreamHandle&) = delete;
  StreamHandle& operator=(const StreamHandle&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// Two device arenas a batch is placed in (cudaMalloc'd, or symmetric memory from comm.alloc()).
struct Arenas {
  void* send = nullptr;
  void* recv = nullptr;
  size_t send_capacity = 0;
  size_t recv_capacity = 0;
};

// Copies the images into the arenas' spans through pinned memory; returns once they have landed (stream
// synchronised before and after).
void upload(const Arenas& arenas, const std::vector<unsigned char>& send, const std::vector<unsigned char>& recv,
            cudaStream_t stream);
// Reads the arenas' spans back (sizes taken from the vectors' sizes) through pinned memory; stream synchronised.
void download(const Arenas& arenas, std::vector<unsigned char>& send, std::vector<unsigned char>& recv,
              cudaStream_t stream);

}  // namespace braid::testing
