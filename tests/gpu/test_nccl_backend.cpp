// braid's NCCL backend (src/backends/nccl) on every rank (threads or braid-run processes), against the host
// reference of collective_reference.hpp:
//   - the unique id made on rank 0 and shared with comm.host_allgather, one NcclBackend per rank;
//   - all_reduce, reduce, reduce_scatter, all_gather, broadcast: float32 and bfloat16 sum and int32 max (the
//     rootless, opless collectives once per type) × counts {1, 7, 4097, 1M+3} × out of place, in place, and out of
//     place offset by one element × roots {0, n-1};
//   - all_to_all with the same types and counts; all_to_allv with uneven per-pair counts (zero included, a rank
//     that sends nothing, a rank that receives nothing, one large pair), packed (null) and explicit displacements
//     with gaps in reversed rank order;
//   - lazy registration of cudaMalloc'd buffers: one ncclCommRegister per key (a cache hit makes no NCCL call,
//     threads racing on one key make one), forget deregisters once, results identical registered and not,
//     BRAID_NCCL_REGISTER=no never registers, and a backend destroyed with ranges still registered.
// Every call gets fresh random inputs (a seed from rank 0, shared) and poisoned outputs (0xA5) with guard bytes;
// afterwards the outputs must match the reference and every other byte must be as it was.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backends/nccl/nccl_backend.hpp"
#include "braid/braid.hpp"
#include "collective_reference.hpp"
#include "world.hpp"

namespace braid::testing {
namespace {

using detail::NcclBackend;
using detail::NcclLibrary;
using detail::NcclRegisterMode;

constexpr size_t kMaxReportedCases = 8;
constexpr size_t kGuardBytes = 256;
constexpr size_t kOneMiPlus3 = (size_t(1) << 20) + 3;  // elements
const std::vector<size_t> kCounts = {1, 7, 4097, kOneMiPlus3};

// NCCL for a test, or the reason there is none (the test is then reported skipped, never passed).
std::shared_ptr<NcclLibrary> load_nccl(std::string& reason) {
  try {
    return NcclLibrary::load();
  } catch (const Error& error) {
    reason = error.what();
    return nullptr;
  }
}

#define REQUIRE_NCCL(library)                                               \
  std::string nccl_skip_reason;                                             \
  const std::shared_ptr<NcclLibrary> library = load_nccl(nccl_skip_reason); \
  if (library == nullptr) GTEST_SKIP() << "NCCL cannot be loaded here: " << nccl_skip_reason

// One NcclBackend per rank of comm: rank 0 makes the unique id, host_allgather hands it to every rank.
std::unique_ptr<NcclBackend> make_backend(Communicator& comm, const std::shared_ptr<NcclLibrary>& library,
                                          NcclRegisterMode mode) {
  const std::string mine = comm.rank() == 0 ? NcclBackend::make_unique_id(*library) : std::string();
  const std::vector<std::string> ids = comm.host_allgather(mine);
  return std::make_unique<NcclBackend>(library, comm.rank(), comm.size(), comm.device(), ids.at(0), mode, comm.timeout_s());
}

// ---- The rooted and reducing collectives (Batch from collective_reference.hpp) ----

void launch_nccl(NcclBackend& nccl, const Case& c, const void* send, void* recv, cudaStream_t stream) {
  switch (c.collective) {
    case Collective::kAllReduce: nccl.all_reduce(send, recv, c.count, c.type, c.op, stream); return;
    case Collective::kReduce: nccl.reduce(send, recv, c.count, c.type, c.op, c.root, stream); return;
    case Collective::kReduceScatter: nccl.reduce_scatter(send, recv, c.count, c.type, c.op, stream); return;
    case Collective::kAllGather: nccl.all_gather(send, recv, c.count, c.type, stream); return;
    case Collective::kBroadcast: nccl.broadcast(send, recv, c.count, c.type, c.root, stream); return;
  }
  throw std::logic_error("launch_nccl: collective outside the enum");
}

struct TypeOp {
  DataType type;
  ReduceOp op;
};
constexpr TypeOp kTypeOps[] = {{DataType::kFloat32, ReduceOp::kSum},
                               {DataType::kBFloat16, ReduceOp::kSum},
                               {DataType::kInt32, ReduceOp::kMax}};

struct Variant {
  bool in_place;
  bool aligned;
};
constexpr Variant kVariants[] = {{false, true}, {true, true}, {false, false}};

std::vector<Case> nccl_matrix(int world) {
  std::vector<Case> cases;
  for (Collective collective : kAllCollectives) {
    for (const TypeOp& type_op : kTypeOps) {
      for (size_t count : kCounts) {
        for (const Variant& variant : kVariants) {
          std::vector<int> roots = {0};
          if (has_root(collective) && world > 1) roots.push_back(world - 1);
          for (int root : roots) {
            cases.push_back(Case{collective, type_op.type, is_reducing(collective) ? type_op.op : ReduceOp::kSum, count,
                                 root, variant.in_place, variant.aligned, 0});
          }
        }
      }
    }
  }
  return cases;
}

// Runs cases one at a time on one rank: poison and inputs uploaded, the NCCL call, synchronise, check(), read
// back and checked against the reference. Keeps what each case left in recv when asked (to compare runs).
class NcclCaseRunner {
 public:
  NcclCaseRunner(NcclBackend& nccl, const Arenas& arenas, cudaStream_t stream, const char* label)
      : nccl_(nccl), arenas_(arenas), stream_(stream), label_(label) {}
  ~NcclCaseRunner() {
    if (failed_ > 0) {
      ADD_FAILURE() << label_ << ": rank " << nccl_.rank() << ": " << failed_ << " of " << ran_ << " case(s) failed"
                    << (failed_ > kMaxReportedCases ? " (the first ones are reported above)" : "");
    }
  }
  NcclCaseRunner(const NcclCaseRunner&) = delete;
  NcclCaseRunner& operator=(const NcclCaseRunner&) = delete;

  // False when the call threw: the communicator may be unusable and the caller should stop.
  bool run(const Case& c, std::vector<unsigned char>* kept_recv = nullptr) {
    Batch batch(nccl_.rank(), nccl_.size());
    if (!batch.add(c, arenas_.send_capacity, arenas_.recv_capacity)) {
      throw std::logic_error("case does not fit the arenas: " + describe(c));
    }
    batch.initial_images(initial_send_, initial_recv_);
    upload(arenas_, initial_send_, initial_recv_, stream_);
    ++ran_;
    try {
      launch_nccl(nccl_, c, batch.send_pointer(0, arenas_.send, arenas_.recv),
                  batch.recv_pointer(0, arenas_.send, arenas_.recv), stream_);
      cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize after the NCCL call");
      nccl_.check();
    } catch (const Error& error) {
      fail(std::string(label_) + ": rank " + std::to_string(nccl_.rank()) + ": " + describe(c) + " threw (" +
           error_code_name(error.code()) + "): " + error.what());
      return false;
    }
    send_.resize(initial_send_.size());
    recv_.resize(initial_recv_.size());
    download(arenas_, send_, recv_, stream_);
    size_t failed = 0;
    std::vector<std::string> lines = batch.check(initial_send_, initial_recv_, send_.data(), recv_.data(), 1, &failed);
    if (failed > 0) fail(std::string(label_) + ": rank " + std::to_string(nccl_.rank()) + ": " + lines.at(0));
    if (kept_recv != nullptr) *kept_recv = recv_;
    return true;
  }

  size_t ran() const { return ran_; }

 private:
  void fail(const std::string& line) {
    if (failed_++ < kMaxReportedCases) ADD_FAILURE() << line;
  }

  NcclBackend& nccl_;
  Arenas arenas_;
  cudaStream_t stream_;
  const char* label_;
  size_t ran_ = 0;
  size_t failed_ = 0;
  std::vector<unsigned char> initial_send_, initial_recv_, send_, recv_;
};

TEST(NcclBackend, CollectivesMatchTheReference) {
  SKIP_WHERE_RANKS_SHARE_GPUS();
  REQUIRE_NCCL(library);
  with_communicator([&](Communicator& comm) {
    std::unique_ptr<NcclBackend> nccl = make_backend(comm, library, NcclRegisterMode::kNo);
    std::vector<Case> cases = nccl_matrix(comm.size());
    seed_cases(cases, shared_seed(comm));
    size_t send_capacity = 0, recv_capacity = 0;
    capacities(cases, comm.size(), send_capacity, recv_capacity);
    DeviceBuffer send(send_capacity), recv(recv_capacity);
    StreamHandle stream;
    {
      NcclCaseRunner runner(*nccl, Arenas{send.get(), recv.get(), send_capacity, recv_capacity}, stream.get(),
                            "nccl collectives");
      for (const Case& c : cases) {
        if (!runner.run(c)) break;
      }
      if (comm.rank() == 0) {
        std::printf("[nccl] NCCL %s (%s): %zu case(s) on %d rank(s)\n", library->version().c_str(),
                    library->path().c_str(), runner.ran(), comm.size());
      }
    }
    nccl.reset();  // before the buffers it may still know of
  });
}

// ---- All-to-all(v): a reference of its own (data is moved, not reduced: every byte is known exactly) ----

// Bytes of element i that rank `from` sends to rank `to` (any bit pattern: nothing is computed on it).
void element_bytes(uint64_t seed, int from, int to, size_t i, size_t element, unsigned char* out) {
  const uint64_t bits = mix64(seed ^ mix64((static_cast<uint64_t>(from) << 32) | static_cast<uint32_t>(to)) + i);
  std::memcpy(out, &bits, element);
}

// One all-to-all(v) call as every rank makes it: counts[s][d] elements from rank s to rank d.
struct VPlan {
  DataType type = DataType::kFloat32;
  std::vector<std::vector<size_t>> counts;
  bool uniform = false;          // all_to_all(count = counts[0][0]) rather than all_to_allv
  bool explicit_displs = false;  // blocks in reversed rank order with gaps; else null (packed in rank order)
  uint64_t seed = 0;
  std::string name;
};

// Element offsets of each peer's block in one rank's buffer, and the buffer's extent in elements.
std::vector<size_t> displacements(const std::vector<size_t>& counts, bool explicit_displs, size_t& extent) {
  const int world = static_cast<int>(counts.size());
  std::vector<size_t> displs(world);
  size_t next = 0;
  if (!explicit_displs) {
    for (int peer = 0; peer < world; ++peer) {
      displs[peer] = next;
      next += counts[peer];
    }
  } else {
    constexpr size_t kGap = 3;  // elements left poisoned between blocks
    for (int peer = world - 1; peer >= 0; --peer) {
      next += kGap;
      displs[peer] = next;
      next += counts[peer];
    }
  }
  extent = next;
  return displs;
}

// Runs plans one at a time on one rank and checks every byte of both buffers (guards included).
void run_v_plans(NcclBackend& nccl, const std::vector<VPlan>& plans, const char* label) {
  const int me = nccl.rank(), world = nccl.size();
  struct Layout {
    std::vector<size_t> send_counts, recv_counts, send_displs, recv_displs;
    size_t send_extent = 0, recv_extent = 0;
  };
  auto layout_of = [&](const VPlan& p) {
    Layout l;
    for (int peer = 0; peer < world; ++peer) {
      l.send_counts.push_back(p.counts[me][peer]);
      l.recv_counts.push_back(p.counts[peer][me]);
    }
    l.send_displs = displacements(l.send_counts, p.explicit_displs, l.send_extent);
    l.recv_displs = displacements(l.recv_counts, p.explicit_displs, l.recv_extent);
    return l;
  };
  size_t send_capacity = 0, recv_capacity = 0;
  for (const VPlan& p : plans) {
    const Layout l = layout_of(p);
    send_capacity = std::max(send_capacity, l.send_extent * datatype_size(p.type) + 2 * kGuardBytes);
    recv_capacity = std::max(recv_capacity, l.recv_extent * datatype_size(p.type) + 2 * kGuardBytes);
  }
  DeviceBuffer send(send_capacity), recv(recv_capacity);
  StreamHandle stream;
  size_t failed = 0;
  for (const VPlan& p : plans) {
    const Layout l = layout_of(p);
    const size_t element = datatype_size(p.type);
    const size_t send_span = l.send_extent * element + 2 * kGuardBytes;
    const size_t recv_span = l.recv_extent * element + 2 * kGuardBytes;
    std::vector<unsigned char> send_image(send_span, kPoison), recv_image(recv_span, kPoison);
    std::vector<unsigned char> expected_recv(recv_span, kPoison);
    for (int peer = 0; peer < world; ++peer) {
      for (size_t i = 0; i < l.send_counts[peer]; ++i) {
        element_bytes(p.seed, me, peer, i, element, &send_image[kGuardBytes + (l.send_displs[peer] + i) * element]);
      }
      for (size_t i = 0; i < l.recv_counts[peer]; ++i) {
        element_bytes(p.seed, peer, me, i, element, &expected_recv[kGuardBytes + (l.recv_displs[peer] + i) * element]);
      }
    }
    const Arenas arenas{send.get(), recv.get(), send_capacity, recv_capacity};
    upload(arenas, send_image, recv_image, stream.get());
    unsigned char* send_data = static_cast<unsigned char*>(send.get()) + kGuardBytes;
    unsigned char* recv_data = static_cast<unsigned char*>(recv.get()) + kGuardBytes;
    const std::string what = std::string(label) + ": rank " + std::to_string(me) + ": " + p.name + " (" +
                             datatype_name(p.type) + (p.explicit_displs ? ", explicit displacements" : "") + ")";
    try {
      if (p.uniform) {
        nccl.all_to_all(send_data, recv_data, p.counts[0][0], p.type, stream.get());
      } else {
        nccl.all_to_allv(send_data, l.send_counts.data(), p.explicit_displs ? l.send_displs.data() : nullptr,
                         recv_data, l.recv_counts.data(), p.explicit_displs ? l.recv_displs.data() : nullptr, p.type,
                         stream.get());
      }
      cuda_check(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize after the NCCL call");
      nccl.check();
    } catch (const Error& error) {
      ADD_FAILURE() << what << " threw (" << error_code_name(error.code()) << "): " << error.what();
      return;
    }
    std::vector<unsigned char> send_after(send_span), recv_after(recv_span);
    download(arenas, send_after, recv_after, stream.get());
    const bool send_ok = send_after == send_image;
    size_t wrong = 0, first = recv_span;
    for (size_t b = 0; b < recv_span; ++b) {
      if (recv_after[b] != expected_recv[b] && wrong++ == 0) first = b;
    }
    if ((!send_ok || wrong > 0) && failed++ < kMaxReportedCases) {
      std::string where = "none";
      if (wrong > 0) {
        where = "byte " + std::to_string(first) + " of the recv span";
        if (first >= kGuardBytes && first < kGuardBytes + l.recv_extent * element) {
          const size_t index = (first - kGuardBytes) / element;
          for (int peer = 0; peer < world; ++peer) {
            if (index >= l.recv_displs[peer] && index < l.recv_displs[peer] + l.recv_counts[peer]) {
              where += " (element " + std::to_string(index - l.recv_displs[peer]) + " from rank " +
                       std::to_string(peer) + ")";
            }
          }
        }
      }
      ADD_FAILURE() << what << ": " << wrong << " wrong recv byte(s), first at " << where
                    << (send_ok ? "" : "; the send buffer changed");
    }
  }
  if (failed > 0) ADD_FAILURE() << label << ": rank " << me << ": " << failed << " of " << plans.size() << " failed";
}

std::vector<VPlan> uniform_plans(int world, uint64_t seed) {
  std::vector<VPlan> plans;
  for (DataType type : {DataType::kFloat32, DataType::kBFloat16, DataType::kInt32}) {
    for (size_t count : kCounts) {
      VPlan p;
      p.type = type;
      p.counts.assign(world, std::vector<size_t>(world, count));
      p.uniform = true;
      p.seed = mix64(seed + plans.size());
      p.name = "all_to_all count " + std::to_string(count);
      plans.push_back(p);
    }
  }
  return plans;
}

std::vector<VPlan> uneven_plans(int world, uint64_t seed) {
  std::vector<VPlan> plans;
  auto add = [&](const std::string& name, DataType type, const std::function<size_t(int, int, uint64_t)>& count) {
    for (bool explicit_displs : {false, true}) {
      VPlan p;
      p.type = type;
      p.seed = mix64(seed + plans.size());
      p.counts.assign(world, std::vector<size_t>(world, 0));
      for (int s = 0; s < world; ++s) {
        for (int d = 0; d < world; ++d) p.counts[s][d] = count(s, d, mix64(p.seed ^ (uint64_t(s) * 131 + d)));
      }
      p.explicit_displs = explicit_displs;
      p.name = "all_to_allv " + name;
      plans.push_back(p);
    }
  };
  // Random uneven counts, a quarter of them zero.
  for (DataType type : {DataType::kFloat32, DataType::kBFloat16, DataType::kInt32}) {
    add("random uneven", type, [](int, int, uint64_t r) { return r % 4 == 0 ? size_t(0) : size_t(r >> 8) % 5000; });
  }
  // Rank 0 sends nothing, the last rank receives nothing, nobody sends to itself.
  add("silent sender, deaf receiver, no self", DataType::kFloat32, [world](int s, int d, uint64_t r) {
    if (s == 0 || d == world - 1 || s == d) return size_t(0);
    return 1 + size_t(r % 777);
  });
  // Everything zero.
  add("all zero", DataType::kInt32, [](int, int, uint64_t) { return size_t(0); });
  // One large pair (the last rank to rank 0, or to itself on one rank), the rest small.
  add("one large pair", DataType::kBFloat16, [world](int s, int d, uint64_t r) {
    if (s == world - 1 && d == 0) return kOneMiPlus3;
    return size_t(r % 9);
  });
  return plans;
}

TEST(NcclBackend, AllToAllAndAllToAllvMatchTheReference) {
  SKIP_WHERE_RANKS_SHARE_GPUS();
  REQUIRE_NCCL(library);
  if (!library->has_all_to_all() && !library->has_send_recv()) {
    GTEST_SKIP() << "NCCL " << library->version() << " has neither ncclAlltoAll nor ncclSend/ncclRecv";
  }
  with_communicator([&](Communicator& comm) {
    std::unique_ptr<NcclBackend> nccl = make_backend(comm, library, NcclRegisterMode::kNo);
    const uint64_t seed = shared_seed(comm);
    run_v_plans(*nccl, uniform_plans(comm.size(), seed), "all_to_all");
    if (library->has_send_recv()) {
      run_v_plans(*nccl, uneven_plans(comm.size(), mix64(seed)), "all_to_allv");
    } else {
      // Without ncclSend/ncclRecv all_to_allv is refused, naming what is missing.
      const std::vector<size_t> zero(comm.size(), 0);
      EXPECT_THROW(nccl->all_to_allv(nullptr, zero.data(), nullptr, nullptr, zero.data(), nullptr, DataType::kInt32,
                                     nullptr),
                   Error);
    }
  });
}

// ---- Lazy registration ----

TEST(NcclBackend, RegistrationIsLazyCachedAndForgotten) {
  SKIP_WHERE_RANKS_SHARE_GPUS();
  REQUIRE_NCCL(library);
  if (!library->has_register()) {
    GTEST_SKIP() << "NCCL " << library->version() << " (" << library->path()
                 << ") cannot register buffers (ncclCommRegister, 2.19+)";
  }
  with_communicator([&](Communicator& comm) {
    // The same cases on buffers registered with NCCL and on buffers that are not: integer sums and float max, so
    // that the two runs must agree bit for bit whatever algorithm NCCL picks for each.
    std::vector<Case> cases;
    for (size_t count : {size_t(4097), kOneMiPlus3}) {
      cases.push_back(Case{Collective::kAllReduce, DataType::kInt32, ReduceOp::kSum, count, 0, false, true, 0});
      cases.push_back(Case{Collective::kAllReduce, DataType::kFloat32, ReduceOp::kMax, count, 0, true, true, 0});
      cases.push_back(Case{Collective::kReduceScatter, DataType::kInt32, ReduceOp::kSum, count, 0, false, true, 0});
      cases.push_back(Case{Collective::kAllGather, DataType::kBFloat16, ReduceOp::kSum, count, 0, false, true, 0});
      cases.push_back(
          Case{Collective::kBroadcast, DataType::kFloat32, ReduceOp::kSum, count, comm.size() - 1, false, true, 0});
    }
    seed_cases(cases, shared_seed(comm));
    size_t send_capacity = 0, recv_capacity = 0;
    capacities(cases, comm.size(), send_capacity, recv_capacity);
    // Declared before the backends: freed after them.
    DeviceBuffer send(send_capacity), recv(recv_capacity), plain_send(send_capacity), plain_recv(recv_capacity);
    DeviceBuffer extra(size_t(1) << 20);
    StreamHandle stream;
    const std::string at = "rank " + std::to_string(comm.rank()) + ": ";

    std::unique_ptr<NcclBackend> registered = make_backend(comm, library, NcclRegisterMode::kYes);
    std::unique_ptr<NcclBackend> plain = make_backend(comm, library, NcclRegisterMode::kNo);
    EXPECT_EQ(registered->registered_count(), 0u) << at;

    // First call per key registers; later calls hit the cache and make no NCCL call.
    EXPECT_TRUE(registered->ensure_registered(1, send.get(), send_capacity)) << at;
    EXPECT_EQ(registered->register_calls(), 1u) << at;
    EXPECT_TRUE(registered->ensure_registered(2, recv.get(), recv_capacity)) << at;
    EXPECT_EQ(registered->register_calls(), 2u) << at;
    for (int i = 0; i < 10; ++i) {
      EXPECT_TRUE(registered->ensure_registered(1, send.get(), send_capacity)) << at;
      EXPECT_TRUE(registered->ensure_registered(2, recv.get(), recv_capacity)) << at;
    }
    EXPECT_EQ(registered->register_calls(), 2u) << at << "a cache hit called ncclCommRegister";
    EXPECT_EQ(registered->registered_count(), 2u) << at;

    // Threads racing on one new key: one registration, every caller told it is registered.
    {
      std::vector<std::thread> threads;
      std::vector<int> answers(8, -1);
      for (int t = 0; t < 8; ++t) {
        threads.emplace_back([&, t] { answers[t] = registered->ensure_registered(3, extra.get(), extra.bytes()); });
      }
      for (std::thread& thread : threads) thread.join();
      for (int answer : answers) EXPECT_EQ(answer, 1) << at;
      EXPECT_EQ(registered->register_calls(), 3u) << at << "racing threads registered one key more than once";
      EXPECT_EQ(registered->registered_count(), 3u) << at;
    }

    // BRAID_NCCL_REGISTER=no: never registered, no NCCL call.
    EXPECT_FALSE(plain->ensure_registered(1, plain_send.get(), send_capacity)) << at;
    EXPECT_FALSE(plain->ensure_registered(2, plain_recv.get(), recv_capacity)) << at;
    EXPECT_EQ(plain->register_calls(), 0u) << at;
    EXPECT_EQ(plain->registered_count(), 0u) << at;

    // Results: each case on the registered buffers and on the plain ones, both against the reference, and the
    // two outputs identical.
    {
      NcclCaseRunner on_registered(*registered, Arenas{send.get(), recv.get(), send_capacity, recv_capacity},
                                   stream.get(), "registered buffers");
      NcclCaseRunner on_plain(*plain, Arenas{plain_send.get(), plain_recv.get(), send_capacity, recv_capacity},
                              stream.get(), "unregistered buffers");
      std::vector<unsigned char> registered_out, plain_out;
      for (const Case& c : cases) {
        if (!on_registered.run(c, &registered_out) || !on_plain.run(c, &plain_out)) break;
        EXPECT_TRUE(registered_out == plain_out) << at << describe(c) << ": registered and unregistered outputs differ";
      }
    }
    EXPECT_EQ(registered->register_calls(), 3u) << at << "collectives must not register by themselves";

    // Forget: deregistered once; again (or an unknown key) is a no-op; a forgotten key registers afresh.
    registered->forget_registered(2);
    EXPECT_EQ(registered->deregister_calls(), 1u) << at;
    EXPECT_EQ(registered->registered_count(), 2u) << at;
    registered->forget_registered(2);
    registered->forget_registered(12345);
    EXPECT_EQ(registered->deregister_calls(), 1u) << at;
    EXPECT_TRUE(registered->ensure_registered(2, recv.get(), recv_capacity)) << at;
    EXPECT_EQ(registered->register_calls(), 4u) << at;
    EXPECT_EQ(registered->registered_count(), 3u) << at;
    {
      NcclCaseRunner again(*registered, Arenas{send.get(), recv.get(), send_capacity, recv_capacity}, stream.get(),
                           "registered again");
      again.run(cases.front());
    }
    plain->forget_registered(1);  // never registered: nothing to deregister
    EXPECT_EQ(plain->deregister_calls(), 0u) << at;

    // Destroyed with three ranges still registered: the destructor deregisters them; NCCL stays usable.
    registered.reset();
    plain.reset();
    std::unique_ptr<NcclBackend> after = make_backend(comm, library, NcclRegisterMode::kTry);
    EXPECT_TRUE(after->ensure_registered(1, send.get(), send_capacity)) << at;
    NcclCaseRunner runner(*after, Arenas{send.get(), recv.get(), send_capacity, recv_capacity}, stream.get(),
                          "after a destroyed registered backend");
    runner.run(cases.front());
  });
}

}  // namespace
}  // namespace braid::testing
