// Point-to-point batches (Communicator::send_recv, send, recv; braidSend, braidRecv) on every rank (threads or
// braid-run processes), against a host reference: a ring in one batch, a pair exchanging both ways in one batch,
// sizes 0 .. past the pipeline area over several datatypes (with the table, and forced onto the FIFOs and into
// LL128 lines), several sends to one peer (order kept), sends to self,
// two ranks of the world alone followed by a collective of all, 200 random batches back to back with random
// delays, a CUDA graph replayed 100 times, a size mismatch (kMismatch, the communicator still usable), the NCCL
// backend, pairs through the copy engines (alone, mixed with FIFO pairs, in graphs, a size mismatch), and
// argument errors naming the argument. Inputs are fresh and never zero; outputs are poisoned with
// guard bytes around every buffer, and every byte must be what the reference says afterwards.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "braid/braid.h"
#include "braid/braid.hpp"
#include "collective_reference.hpp"
#include "spin_kernel.hpp"
#include "test_helpers.hpp"
#include "world.hpp"

namespace braid::testing {
namespace {

constexpr size_t kGuardBytes = 256;
constexpr size_t kMaxLines = 8;
constexpr size_t kOneMiBPlus3 = (size_t(1) << 20) + 3;

// `count` elements of `type` from rank `from` to rank `to`; the receiver may say it receives another count.
struct Message {
  int from = 0, to = 0;
  DataType type = DataType::kFloat32;
  size_t count = 0;
  size_t recv_count = SIZE_MAX;  // SIZE_MAX: count (anything else is a mismatch: nothing may arrive)
  bool aligned = true;           // false: buffers start one element past a 256-byte boundary
  size_t received() const { return recv_count == SIZE_MAX ? count : recv_count; }
};
using MessageBatch = std::vector<Message>;

// Batches every rank runs in order. This rank's side of each message has a region of its own, framed by poisoned
// guard bytes: in the send arena where it sends (its input), in the recv arena where it receives. Every rank knows
// every message (a function of the shared seed), so it knows what must arrive where.
class Exchange {
 public:
  Exchange(Communicator& comm, std::vector<MessageBatch> batches, uint64_t seed) : comm_(comm), batches_(std::move(batches)) {
    const int me = comm.rank();
    size_t cursor[2] = {0, 0};  // send, recv
    for (const MessageBatch& batch : batches_) {
      first_of_batch_.push_back(messages_.size());
      for (const Message& m : batch) {
        messages_.push_back(&m);
        for (int side = 0; side < 2; ++side) {
          Region& region = (side == 0 ? send_regions_ : recv_regions_).emplace_back();
          if ((side == 0 ? m.from : m.to) != me) continue;  // not this rank's side: no region
          const size_t element = datatype_size(m.type), count = side == 0 ? m.count : m.received();
          region = Region{cursor[side], cursor[side] + kGuardBytes + (m.aligned ? 0 : element), 0};
          region.end = cursor[side] = (region.data + count * element + kGuardBytes + 255) / 256 * 256;
        }
      }
    }
    send_ = std::make_unique<DeviceBuffer>(std::max<size_t>(cursor[0], 1));
    recv_ = std::make_unique<DeviceBuffer>(std::max<size_t>(cursor[1], 1));
    initial_send_.assign(cursor[0], kPoison);
    initial_recv_.assign(cursor[1], kPoison);
    expected_recv_ = initial_recv_;
    for (size_t i = 0; i < messages_.size(); ++i) {
      const Message& m = *messages_[i];
      const uint64_t key = input_key(mix64(seed + i), m.from);
      if (m.from == me) fill_inputs(m.type, key, 0, m.count, initial_send_.data() + send_regions_[i].data);
      if (m.to == me && m.received() == m.count) fill_inputs(m.type, key, 0, m.count, expected_recv_.data() + recv_regions_[i].data);
    }
  }

  size_t batches() const { return batches_.size(); }
  void* recv_arena() const { return recv_->get(); }
  size_t recv_bytes() const { return initial_recv_.size(); }

  void upload(cudaStream_t stream) const {
    ::braid::testing::upload(arenas(), initial_send_, initial_recv_, stream);
    cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (upload)");
  }

  // This rank's ops of batch b: even ranks list their sends first, odd ranks their receives (only the order
  // among the ops for one peer matters).
  std::vector<PointToPoint> ops(size_t b) const {
    std::vector<PointToPoint> sends, recvs;
    size_t i = first_of_batch_[b];
    for (const Message& m : batches_[b]) {
      char* send = static_cast<char*>(send_->get()) + send_regions_[i].data;
      char* recv = static_cast<char*>(recv_->get()) + recv_regions_[i++].data;
      if (m.from == comm_.rank()) sends.push_back({PointToPoint::kSend, m.to, send, m.count, m.type});
      if (m.to == comm_.rank()) recvs.push_back({PointToPoint::kRecv, m.from, recv, m.received(), m.type});
    }
    std::vector<PointToPoint>& first = comm_.rank() % 2 == 0 ? sends : recvs;
    const std::vector<PointToPoint>& second = comm_.rank() % 2 == 0 ? recvs : sends;
    first.insert(first.end(), second.begin(), second.end());
    return first;
  }

  // Batch b on stream; a rank with no op in it calls nothing.
  void enqueue(size_t b, cudaStream_t stream) const {
    const std::vector<PointToPoint> mine = ops(b);
    if (!mine.empty()) comm_.send_recv(mine.data(), mine.size(), stream);
  }

  // Synchronises and compares both arenas with the reference: a line per wrong region (at most kMaxLines).
  std::vector<std::string> check(cudaStream_t stream) const {
    std::vector<unsigned char> send(initial_send_.size()), recv(initial_recv_.size());
    download(arenas(), send, recv, stream);
    std::vector<std::string> lines;
    for (size_t i = 0; i < messages_.size() && lines.size() < kMaxLines; ++i) {
      for (bool is_send : {true, false}) {
        const Region& region = (is_send ? send_regions_ : recv_regions_)[i];
        const unsigned char* want = (is_send ? initial_send_ : expected_recv_).data();
        const unsigned char* got = (is_send ? send : recv).data();
        const auto first = std::mismatch(want + region.begin, want + region.end, got + region.begin);
        if (first.first == want + region.end) continue;
        const Message& m = *messages_[i];
        const long long offset = static_cast<long long>(first.first - want) - static_cast<long long>(region.data);
        lines.push_back("rank " + std::to_string(comm_.rank()) + ": message " + std::to_string(i) + " (" +
                        std::to_string(m.from) + " -> " + std::to_string(m.to) + ", " + std::to_string(m.count) + " " +
                        datatype_name(m.type) + "): " + (is_send ? "send" : "recv") + " byte " + std::to_string(offset) +
                        " (< 0: a guard) is " + std::to_string(*first.second) + ", expected " + std::to_string(*first.first));
      }
    }
    return lines;
  }

 private:
  struct Region {
    size_t begin = 0, data = 0, end = 0;  // first guard byte, first element, one past the last guard byte
  };
  Arenas arenas() const { return Arenas{send_->get(), recv_->get(), initial_send_.size(), initial_recv_.size()}; }

  Communicator& comm_;
  std::vector<MessageBatch> batches_;
  std::vector<const Message*> messages_;  // numbered across batches
  std::vector<size_t> first_of_batch_;
  std::vector<Region> send_regions_, recv_regions_;  // per message; empty where this rank is not its sender/receiver
  std::unique_ptr<DeviceBuffer> send_, recv_;
  std::vector<unsigned char> initial_send_, initial_recv_, expected_recv_;
};

// Runs the batches back to back (optional per-rank device delays), then checks every byte; check() must be quiet.
void run(Communicator& comm, std::vector<MessageBatch> batches, const std::string& label, bool delays = false) {
  const uint64_t seed = shared_seed(comm);
  const Exchange exchange(comm, std::move(batches), seed);
  StreamHandle stream;
  exchange.upload(stream.get());
  const uint64_t delay_key = mix64(seed ^ (0xDE1A7ull + comm.rank()));
  for (size_t b = 0; b < exchange.batches(); ++b) {
    const uint64_t r = random_bits(delay_key, b);
    if (delays && r % 3 == 0) cuda_check(spin_on_stream(stream.get(), static_cast<uint32_t>((r >> 8) % 20000)), "spin");
    exchange.enqueue(b, stream.get());
  }
  for (const std::string& line : exchange.check(stream.get())) ADD_FAILURE() << label << ": " << line;
  comm.check();
}

// Every rank sends `count` elements to the next rank (and receives from the previous one) in one batch.
MessageBatch ring(int world, DataType type, size_t count, bool aligned = true) {
  MessageBatch batch;
  for (int r = 0; r < world; ++r) batch.push_back({r, (r + 1) % world, type, count, SIZE_MAX, aligned});
  return batch;
}

size_t elements(size_t bytes, DataType type) { return (bytes + datatype_size(type) - 1) / datatype_size(type); }

TEST(SendRecv, RingOverSizesAndDatatypes) {
  with_communicator([](Communicator& comm) {
    std::vector<MessageBatch> batches;
    for (DataType type : {DataType::kInt8, DataType::kBFloat16, DataType::kFloat16, DataType::kFloat32,
                          DataType::kInt64, DataType::kFloat64}) {
      for (size_t count : {size_t(0), size_t(1), size_t(7), size_t(4097), elements(kOneMiBPlus3, type)}) {
        batches.push_back(ring(comm.size(), type, count, batches.size() % 3 != 0));
      }
    }
    run(comm, batches, "ring");
  });
}

// Small pairs go in LL128 lines on NVLink hosts; the same ring forced onto the FIFOs, and forced onto lines (where
// a pair larger than a slot of lines stays on the FIFOs), at sizes around the slot's 256 KiB too.
TEST(SendRecv, RingOverSizesOnTheFifosAndInLines) {
  for (const char* algorithms : {"sendrecv=pipelined", "sendrecv=ll128"}) {
    CommOptions options = test_options();
    options.algorithms = algorithms;
    with_communicator(
        [](Communicator& comm) {
          std::vector<MessageBatch> batches;
          for (DataType type : {DataType::kInt8, DataType::kBFloat16, DataType::kFloat32}) {
            for (size_t bytes : {size_t(0), size_t(1), size_t(7), size_t(481), size_t(30) << 10, (size_t(256) << 10) - 3,
                                 size_t(256) << 10, (size_t(256) << 10) + 5}) {
              batches.push_back(ring(comm.size(), type, elements(bytes, type), batches.size() % 3 != 0));
            }
          }
          run(comm, batches, "ring");
        },
        options);
  }
}

// A send to q and a receive from q in one batch, far beyond what the FIFOs hold, on both ranks at once.
TEST(SendRecv, PairExchangesBothWaysInOneBatch) {
  with_communicator([](Communicator& comm) {
    const int a = 0, b = comm.size() - 1;
    for (size_t bytes : {kOneMiBPlus3, size_t(40) << 20}) {
      run(comm, {{{a, b, DataType::kFloat32, elements(bytes, DataType::kFloat32)}, {b, a, DataType::kInt8, bytes + 5}}},
          "pair exchange");
    }
  });
}

// More bytes than the whole pipeline area (BRAID_PIPELINE_BYTES, 256 MiB by default): many rounds.
TEST(SendRecv, LargerThanThePipelineArea) {
  with_communicator([](Communicator& comm) {
    const char* set = std::getenv("BRAID_PIPELINE_BYTES");
    const size_t area = set != nullptr ? std::strtoull(set, nullptr, 10) : size_t(256) << 20;
    run(comm, {ring(comm.size(), DataType::kUint64, area / 8 + 3, false)}, "larger than the pipeline area");
  });
}

// Pairs of 64 MiB and more go through the copy engines (the selection table's kSendRecv rows): the threshold
// itself, odd and unaligned sizes, a bulk pair in one batch with FIFO pairs and a send to self, two bulk sends to
// one peer in one batch (two launches), bulk pairs both ways at once, with delays on the ranks.
TEST(SendRecv, CopyEnginePairsAloneAndMixedWithFifoPairs) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  with_communicator([](Communicator& comm) {
    const int w = comm.size();
    const size_t mib64 = size_t(64) << 20;
    std::vector<MessageBatch> batches;
    batches.push_back(ring(w, DataType::kUint8, mib64));
    batches.push_back(ring(w, DataType::kFloat32, elements(mib64, DataType::kFloat32) + 7, false));
    MessageBatch mixed = ring(w, DataType::kBFloat16, elements(mib64 + 4096, DataType::kBFloat16) + 1, false);
    for (int r = 0; r < w; ++r) {
      mixed.push_back({(r + 1) % w, r, DataType::kInt8, 4099, SIZE_MAX, false});
      mixed.push_back({r, r, DataType::kFloat32, 4097});
    }
    batches.push_back(mixed);
    MessageBatch twice;
    for (int r = 0; r < w; ++r) {
      twice.push_back({r, (r + 1) % w, DataType::kInt64, elements(mib64, DataType::kInt64) + 3});
      twice.push_back({r, (r + 1) % w, DataType::kInt8, mib64 + 11, SIZE_MAX, false});
    }
    batches.push_back(twice);
    batches.push_back({{0, 1, DataType::kFloat32, elements(size_t(96) << 20, DataType::kFloat32)},
                       {1, 0, DataType::kFloat32, elements(size_t(72) << 20, DataType::kFloat32) + 5}});
    run(comm, batches, "copy-engine pairs", true);
  });
}

// A bulk pair whose receiver expects fewer bytes than sent, within the same chunk count: nothing of it is
// written, check() raises kMismatch naming both sizes on the receiver, and the communicator goes on.
TEST(SendRecv, CopyEngineSizeMismatchIsRefusedAndTheCommunicatorStaysUsable) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  with_communicator([](Communicator& comm) {
    const size_t sent = elements(size_t(80) << 20, DataType::kFloat32), received = sent - 1000;
    try {
      run(comm, {{{1, 0, DataType::kFloat32, sent, received}}}, "bulk mismatch");
      EXPECT_NE(comm.rank(), 0) << "rank 0: no kMismatch for " << received << " elements against " << sent << " sent";
    } catch (const Error& error) {
      EXPECT_EQ(comm.rank(), 0) << error.what();
      EXPECT_EQ(error.code(), ErrorCode::kMismatch) << error.what();
      EXPECT_TRUE(names_number(error.what(), static_cast<long long>(sent) * 4) &&
                  names_number(error.what(), static_cast<long long>(received) * 4))
          << error.what();
    }
    run(comm, {ring(comm.size(), DataType::kFloat32, elements(size_t(64) << 20, DataType::kFloat32))}, "after a bulk mismatch");
  });
}

// The k-th send to a peer meets the peer's k-th receive: sizes differ, so any other pairing is a mismatch.
TEST(SendRecv, SeveralSendsToOnePeerKeepTheirOrder) {
  with_communicator([](Communicator& comm) {
    const int w = comm.size();
    MessageBatch batch;
    for (int r = 0; r < w; ++r) {
      const int next = (r + 1) % w;
      batch.push_back({r, next, DataType::kFloat32, 4097});
      batch.push_back({r, next, DataType::kInt8, 0});
      batch.push_back({r, next, DataType::kBFloat16, elements(kOneMiBPlus3, DataType::kBFloat16), SIZE_MAX, false});
      batch.push_back({r, next, DataType::kInt8, 5001});
      batch.push_back({next, r, DataType::kFloat64, 333});  // and back, in the same batch
    }
    run(comm, {batch, batch}, "several sends to one peer");
  });
}

TEST(SendRecv, SendToSelf) {
  with_communicator([](Communicator& comm) {
    const int w = comm.size();
    MessageBatch mixed = ring(w, DataType::kFloat32, 4097), twice;
    for (int r = 0; r < w; ++r) {
      mixed.push_back({r, r, DataType::kFloat32, 4097, SIZE_MAX, false});
      twice.push_back({r, r, DataType::kInt8, 7});
      twice.push_back({r, r, DataType::kFloat64, elements(kOneMiBPlus3, DataType::kFloat64)});
    }
    run(comm, {mixed, twice}, "send to self");
  });
}

// Two ranks exchange while the others call nothing; then every rank joins an all-reduce, which must be right.
TEST(SendRecv, TwoRanksAloneThenACollectiveOfAll) {
  with_communicator([](Communicator& comm) {
    const int w = comm.size(), a = 0, b = w - 1;
    constexpr size_t n = 4097;
    DeviceBuffer values(n * sizeof(int32_t));
    for (int round = 0; round < 3; ++round) {
      run(comm, {{{a, b, DataType::kInt32, kOneMiBPlus3 / 4}, {b, a, DataType::kBFloat16, 999}}}, "two ranks alone");
      std::vector<int32_t> host(n, comm.rank() + 1);
      cuda_check(cudaMemcpy(values.get(), host.data(), n * sizeof(int32_t), cudaMemcpyHostToDevice), "cudaMemcpy");
      // The legacy stream, except where ranks share a GPU (which refuses it: ranks as threads would share it).
      const bool shared = ranks_share_gpus();
      comm.all_reduce(values.get(), values.get(), n, DataType::kInt32, ReduceOp::kSum,
                      shared ? cudaStreamPerThread : nullptr);
      // NOTE [shared-GPU waits] (world.hpp): the pageable copy below must not wait for the all-reduce itself.
      cuda_check(cudaStreamSynchronize(shared ? cudaStreamPerThread : cudaStreamLegacy), "cudaStreamSynchronize");
      cuda_check(cudaMemcpy(host.data(), values.get(), n * sizeof(int32_t), cudaMemcpyDeviceToHost), "cudaMemcpy");
      EXPECT_EQ(std::count(host.begin(), host.end(), w * (w + 1) / 2), static_cast<long>(n)) << "rank " << comm.rank();
      comm.check();
    }
  });
}

// 200 batches of random messages (random pairs, self included, several per pair, every datatype, 0 .. 2 MiB)
// back to back without synchronising, with random device delays per rank.
TEST(SendRecv, BackToBackRandomBatches) {
  with_communicator([](Communicator& comm) {
    const int w = comm.size();
    const uint64_t key = shared_seed(comm);
    uint64_t draw = 0;
    auto next = [&] { return random_bits(key, draw++); };
    std::vector<MessageBatch> batches(200);
    for (MessageBatch& batch : batches) {
      for (uint64_t m = 1 + next() % (2 * w); m > 0; --m) {
        const DataType type = kAllDataTypes[next() % std::size(kAllDataTypes)];
        const uint64_t size_class = next() % 100, octave = next() % 18, low = next();
        const size_t bytes = size_class < 5 ? 0 : size_class < 7 ? (size_t(2) << 20) + low % 999 : 1 + low % (size_t(1) << octave);
        batch.push_back({static_cast<int>(next() % w), static_cast<int>(next() % w), type, elements(bytes, type),
                         SIZE_MAX, next() % 4 != 0});
      }
    }
    run(comm, batches, "back to back", /*delays=*/true);
  });
}

// A batch captured once and replayed 100 times, the outputs poisoned before each replay: every replay's output
// equals the eager run's (which matched the reference).
TEST(SendRecv, GraphReplaysMatchEager) {
  with_communicator([](Communicator& comm) {
    const int w = comm.size();
    MessageBatch batch = ring(w, DataType::kBFloat16, 100000);
    for (int r = 0; r < w; ++r) {
      batch.push_back({(r + 1) % w, r, DataType::kInt8, 7, SIZE_MAX, false});
      batch.push_back({r, r, DataType::kFloat32, 4097});
      batch.push_back({r, (r + 1) % w, DataType::kInt64, elements(kOneMiBPlus3, DataType::kInt64)});
      batch.push_back({r, (r + 1) % w, DataType::kInt8, (size_t(64) << 20) + 3});  // through the copy engines
    }
    const Exchange exchange(comm, {batch}, shared_seed(comm));
    StreamHandle stream_handle;
    const cudaStream_t stream = stream_handle.get();
    exchange.upload(stream);
    exchange.enqueue(0, stream);
    for (const std::string& line : exchange.check(stream)) ADD_FAILURE() << "eager: " << line;
    std::vector<unsigned char> eager(exchange.recv_bytes()), replay(exchange.recv_bytes());
    cuda_check(cudaMemcpy(eager.data(), exchange.recv_arena(), eager.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
    GraphHandles graph;
    cuda_check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    exchange.enqueue(0, stream);
    cuda_check(cudaStreamEndCapture(stream, &graph.graph), "cudaStreamEndCapture");
    graph.exec = instantiate_on_every_rank(graph.graph, stream);
    size_t wrong = 0;
    for (int i = 0; i < 100; ++i) {
      cuda_check(cudaMemsetAsync(exchange.recv_arena(), kPoison, exchange.recv_bytes(), stream), "cudaMemsetAsync");
      cuda_check(cudaGraphLaunch(graph.exec, stream), "cudaGraphLaunch");
      cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (replay)");  // NOTE [shared-GPU waits]
      cuda_check(cudaMemcpyAsync(replay.data(), exchange.recv_arena(), replay.size(), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
      cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      wrong += replay != eager;
    }
    comm.check();
    EXPECT_EQ(wrong, 0u) << "rank " << comm.rank() << ": replays whose output differs from the eager run";
  });
}

// Rank 1 sends rank 0 another byte size than rank 0 receives: rank 0's check() raises kMismatch naming both sizes,
// nothing of that pair is written, and the next batch works.
TEST(SendRecv, SizeMismatchIsReportedAndTheCommunicatorStaysUsable) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  with_communicator([](Communicator& comm) {
    for (size_t received : {size_t(1000), size_t(5000)}) {  // fewer and more than sent
      try {
        run(comm, {{{1, 0, DataType::kFloat32, 1234, received}, {0, 1, DataType::kInt8, 77}}}, "mismatch");
        EXPECT_NE(comm.rank(), 0) << "rank 0: no kMismatch for " << received << " elements against 1234 sent";
      } catch (const Error& error) {
        EXPECT_EQ(error.code(), ErrorCode::kMismatch) << error.what();
        EXPECT_TRUE(names_number(error.what(), 1234 * 4) && names_number(error.what(), static_cast<long long>(received) * 4)) << error.what();
      }
      run(comm, {ring(comm.size(), DataType::kFloat32, 4097)}, "after a mismatch");
    }
  });
}

TEST(SendRecv, RingOnTheNcclBackend) {
  SKIP_WHERE_RANKS_SHARE_GPUS();
  CommOptions options = test_options();
  options.backend = "nccl";
  with_communicator([](Communicator& comm) {
    const int w = comm.size();
    MessageBatch batch = ring(w, DataType::kBFloat16, elements(kOneMiBPlus3, DataType::kBFloat16));
    for (int r = 0; r < w; ++r) batch.push_back({r, r, DataType::kInt8, 4097});
    run(comm, {ring(w, DataType::kFloat32, 7), batch, batch}, "NCCL backend");
  }, options);
}

// braidSend and braidRecv as two calls (a batch each): a small ring fits the FIFOs, so the sends finish first.
// One rank alone would send to itself outside a batch, which is refused.
TEST(SendRecv, CApiRing) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  for_each_rank([](const RankContext& context) {
    const std::string address = context.rendezvous.store_host + ":" + std::to_string(context.rendezvous.store_port);
    braidComm_t comm = nullptr;
    ASSERT_EQ(braidCommInitRank(&comm, address.c_str(), context.rank, context.world, 0, -1), braidSuccess) << braidGetLastError();
    int device = -1;
    ASSERT_EQ(braidCommDevice(comm, &device), braidSuccess);
    cuda_check(cudaSetDevice(device), "cudaSetDevice");
    constexpr size_t n = 4097;
    const int w = context.world, me = context.rank;
    std::vector<int32_t> host(n, me + 1);
    DeviceBuffer send(n * 4), recv(n * 4);
    cuda_check(cudaMemcpy(send.get(), host.data(), n * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
    StreamHandle stream;  // a stream of the rank's own: ranks that share a GPU share its legacy default stream
    EXPECT_EQ(braidSend(comm, send.get(), n, braidInt32, (me + 1) % w, stream.get()), braidSuccess) << braidGetLastError();
    EXPECT_EQ(braidRecv(comm, recv.get(), n, braidInt32, (me + w - 1) % w, stream.get()), braidSuccess)
        << braidGetLastError();
    cuda_check(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize");
    cuda_check(cudaMemcpy(host.data(), recv.get(), n * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
    EXPECT_EQ(std::count(host.begin(), host.end(), (me + w - 1) % w + 1), static_cast<long>(n)) << "rank " << me;
    EXPECT_EQ(braidRecv(comm, recv.get(), n, braidInt32, w, stream.get()), braidInvalidArgument);
    EXPECT_NE(std::string(braidGetLastError()).find("'peer'"), std::string::npos) << braidGetLastError();
    host_barrier();  // no rank frees (a wait for its whole GPU) while a peer there still waits for a third rank
    EXPECT_EQ(braidCommDestroy(comm), braidSuccess);
  });
}

TEST(SendRecv, ArgumentErrorsNameTheArgument) {
  with_communicator([](Communicator& comm) {
    const int me = comm.rank(), w = comm.size(), next = (me + 1) % w;
    constexpr size_t n = 1024;
    DeviceBuffer buffer(n * 8);
    cuda_check(cudaMemset(buffer.get(), kPoison, buffer.bytes()), "cudaMemset");
    std::vector<float> host(n);
    StreamHandle stream;
    const cudaStream_t st = stream.get();
    void* b = buffer.get();
    const DataType f32 = DataType::kFloat32;
    auto batch = [&](std::vector<PointToPoint> ops) { return [&comm, ops, st] { comm.send_recv(ops.data(), ops.size(), st); }; };
    auto expect = [&](const std::string& what, const char* argument, const std::function<void()>& call) {
      expect_invalid_argument(me, what, {argument}, call);
    };
    expect("send(buffer = null)", "'buffer'", [&] { comm.send(nullptr, n, f32, next, st); });
    expect("recv(buffer = null)", "'buffer'", [&] { comm.recv(nullptr, n, f32, next, st); });
    expect("send(buffer = host memory)", "'buffer'", [&] { comm.send(host.data(), n, f32, next, st); });
    expect("send(peer = -1)", "'peer'", [&] { comm.send(b, n, f32, -1, st); });
    expect("recv(peer = size)", "'peer'", [&] { comm.recv(b, n, f32, w, st); });
    expect("send(type = -1)", "'type'", [&] { comm.send(b, n, static_cast<DataType>(-1), next, st); });
    expect("recv(type = kDataTypeCount)", "'type'", [&] { comm.recv(b, n, static_cast<DataType>(kDataTypeCount), next, st); });
    expect("send(count x 4 overflows)", "'count'", [&] { comm.send(b, SIZE_MAX / 4 + 1, f32, next, st); });
    expect("send to self alone", "'peer'", [&] { comm.send(b, n, f32, me, st); });
    expect("send_recv(ops = null, count = 2)", "'ops'", [&] { comm.send_recv(nullptr, 2, st); });
    const PointToPoint ok{PointToPoint::kSend, next, b, n, f32};
    expect("ops[1].peer = size", "'ops[1].peer'", batch({ok, {PointToPoint::kRecv, w, b, n, f32}}));
    expect("ops[0].kind = 7", "'ops[0].kind'", batch({{static_cast<PointToPoint::Kind>(7), next, b, n, f32}}));
    expect("ops[1].buffer = null", "'ops[1].buffer'", batch({ok, {PointToPoint::kRecv, next, nullptr, n, f32}}));
    expect("ops[0].type = 99", "'ops[0].type'", batch({{PointToPoint::kSend, next, b, n, static_cast<DataType>(99)}}));
    expect("a send to self with no receive from self", "'ops'", batch({ok, {PointToPoint::kSend, me, b, n, f32}}));
    expect("a receive from self of another size", "'ops[1].count'",
           batch({{PointToPoint::kSend, me, b, n, f32}, {PointToPoint::kRecv, me, b, n - 1, f32}}));
    comm.send_recv(nullptr, 0, st);  // an empty batch: nothing to do
    cuda_check(cudaStreamSynchronize(st), "cudaStreamSynchronize");
    std::vector<unsigned char> bytes(buffer.bytes());
    cuda_check(cudaMemcpy(bytes.data(), b, bytes.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
    EXPECT_EQ(std::count(bytes.begin(), bytes.end(), kPoison), static_cast<long>(bytes.size())) << "a refused call wrote";
    run(comm, {ring(w, DataType::kFloat32, 4097)}, "after refused calls");
  });
}

}  // namespace
}  // namespace braid::testing
