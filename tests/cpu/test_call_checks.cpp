// The one argument check of every call (collectives/call_checks.hpp), as far as it runs without a GPU: the
// checks that refuse a call before any pointer is asked about. Buffers here are never looked at by CUDA: each
// case is refused (or is a no-op) before that.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>

#include "braid/types.hpp"
#include "collectives/call_checks.hpp"
#include "core/error.hpp"

namespace braid::collectives {
namespace {

constexpr CallPlace kPlace{1, 4, 0};  // rank 1 of 4 on GPU 0

// Runs `call` expecting kInvalidArgument whose message names `argument` (quoted, as raise_invalid_argument
// writes it) and `function`.
void expect_refused(const std::function<void()>& call, const std::string& argument, const char* function,
                    const std::string& what) {
  try {
    call();
    ADD_FAILURE() << what << ": accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument) << what << ": " << error.what();
    EXPECT_NE(std::string(error.what()).find("'" + argument + "'"), std::string::npos) << what << ": " << error.what();
    EXPECT_NE(std::string(error.what()).find(function), std::string::npos) << what << ": " << error.what();
  }
}

CollectiveCall call_of(Collective collective, size_t count, const void* send = nullptr, void* recv = nullptr) {
  return CollectiveCall{"test_call", collective, send, recv, count, DataType::kFloat32, ReduceOp::kSum, 0};
}

const Collective kCollectives[] = {Collective::kAllReduce, Collective::kReduce,    Collective::kReduceScatter,
                                   Collective::kAllGather, Collective::kBroadcast, Collective::kAllToAll};

TEST(CallChecks, ACountOfZeroIsANoOpWithNullBuffers) {
  for (Collective collective : kCollectives) {
    EXPECT_FALSE(validate(call_of(collective, 0), kPlace)) << collective_name(static_cast<unsigned>(collective));
  }
}

TEST(CallChecks, NullBuffersThatTheCallUsesAreNamed) {
  int here = 0;  // a non-null address; refused before CUDA is asked about it, since the other buffer is null
  for (Collective collective : kCollectives) {
    const std::string name = collective_name(static_cast<unsigned>(collective));
    CollectiveCall call = call_of(collective, 7, nullptr, &here);
    call.root = kPlace.rank;  // the root uses both buffers of a reduce and a broadcast
    expect_refused([&] { validate(call, kPlace); }, "send", "test_call", name + " with a null send");
  }
  // Off the root, a broadcast never reads its input and a reduce never writes its output.
  CollectiveCall broadcast = call_of(Collective::kBroadcast, 7, nullptr, nullptr);
  broadcast.root = 0;
  expect_refused([&] { validate(broadcast, kPlace); }, "recv", "test_call", "broadcast off the root, null recv");
  CollectiveCall reduce = call_of(Collective::kReduce, 7, nullptr, nullptr);
  reduce.root = 0;
  expect_refused([&] { validate(reduce, kPlace); }, "send", "test_call", "reduce off the root, null send");
}

TEST(CallChecks, OverlapsAreServedOnlyInPlaceAsNcclTakesIt) {
  // Addresses only compared, never dereferenced: rank 1 of 4, 8 float32 per block (32 bytes).
  static char arena[4096];
  char* base = arena + 1024;
  const size_t block = 8 * sizeof(float);
  auto call = [&](Collective collective, const void* send, void* recv) {
    CollectiveCall c = call_of(collective, 8, send, recv);
    c.root = kPlace.rank;
    return c;
  };
  // In place: accepted.
  for (Collective collective : {Collective::kAllReduce, Collective::kReduce, Collective::kBroadcast, Collective::kAllToAll}) {
    EXPECT_NO_THROW(check_in_place(call(collective, base, base), kPlace)) << collective_name(static_cast<unsigned>(collective));
  }
  EXPECT_NO_THROW(check_in_place(call(Collective::kReduceScatter, base, base + block), kPlace));  // recv = send + 1 block
  EXPECT_NO_THROW(check_in_place(call(Collective::kAllGather, base + block, base), kPlace));      // send = recv + 1 block
  // Apart: accepted.
  EXPECT_NO_THROW(check_in_place(call(Collective::kAllReduce, base, base + block), kPlace));
  EXPECT_NO_THROW(check_in_place(call(Collective::kReduceScatter, base, base + 4 * block), kPlace));
  // Any other overlap: refused naming recv.
  for (Collective collective : kCollectives) {
    const std::string name = collective_name(static_cast<unsigned>(collective));
    expect_refused([&] { check_in_place(call(collective, base, base + 4), kPlace); }, "recv", "test_call",
                   name + " recv 4 bytes past send");
  }
  expect_refused([&] { check_in_place(call(Collective::kReduceScatter, base, base), kPlace); }, "recv", "test_call",
                 "reduce_scatter recv == send off rank 0");
  expect_refused([&] { check_in_place(call(Collective::kAllGather, base, base), kPlace); }, "recv", "test_call",
                 "all_gather send == recv off rank 0");
  // Off the root a reduce writes no output and a broadcast reads no input: their overlaps are not looked at.
  CollectiveCall reduce = call(Collective::kReduce, base, base + 4);
  reduce.root = 0;
  EXPECT_NO_THROW(check_in_place(reduce, kPlace));
  CollectiveCall broadcast = call(Collective::kBroadcast, base, base + 4);
  broadcast.root = 0;
  EXPECT_NO_THROW(check_in_place(broadcast, kPlace));
}

TEST(CallChecks, TypesOpsAndRootsOutsideTheirRangesAreNamed) {
  for (Collective collective : kCollectives) {
    const std::string name = collective_name(static_cast<unsigned>(collective));
    for (int value : {-1, kDataTypeCount, 1000}) {
      CollectiveCall call = call_of(collective, 0);
      call.type = static_cast<DataType>(value);
      expect_refused([&] { validate(call, kPlace); }, "type", "test_call", name + " type " + std::to_string(value));
    }
  }
  for (Collective collective : {Collective::kAllReduce, Collective::kReduce, Collective::kReduceScatter}) {
    const std::string name = collective_name(static_cast<unsigned>(collective));
    CollectiveCall call = call_of(collective, 0);
    call.op = static_cast<ReduceOp>(kReduceOpCount);
    expect_refused([&] { validate(call, kPlace); }, "op", "test_call", name + " op out of range");
    call.op = ReduceOp::kAvg;  // avg on an integer type is served, as NCCL serves it
    call.type = DataType::kInt32;
    EXPECT_NO_THROW(validate(call, kPlace)) << name << " avg on int32";
  }
  // An op is not looked at where the call does not reduce.
  CollectiveCall gather = call_of(Collective::kAllGather, 0);
  gather.op = static_cast<ReduceOp>(kReduceOpCount);
  EXPECT_FALSE(validate(gather, kPlace));
  for (Collective collective : {Collective::kReduce, Collective::kBroadcast}) {
    for (int root : {-1, kPlace.world, kPlace.world + 9}) {
      CollectiveCall call = call_of(collective, 0);
      call.root = root;
      expect_refused([&] { validate(call, kPlace); }, "root", "test_call", "root " + std::to_string(root));
    }
  }
}

TEST(CallChecks, CountsWhoseBytesOverflowNameTheCountArgument) {
  const size_t overflowing = SIZE_MAX / 4 + 1;  // × 4 bytes overflows
  const size_t times_world = SIZE_MAX / (4 * size_t(kPlace.world)) + 1;  // × world × 4 bytes overflows
  const std::pair<Collective, const char*> names[] = {
      {Collective::kAllReduce, "count"},     {Collective::kReduce, "count"},         {Collective::kBroadcast, "count"},
      {Collective::kReduceScatter, "recv_count"}, {Collective::kAllGather, "send_count"}, {Collective::kAllToAll, "count"}};
  for (const auto& [collective, argument] : names) {
    expect_refused([&] { validate(call_of(collective, overflowing), kPlace); }, argument, "test_call", argument);
  }
  for (Collective collective : {Collective::kReduceScatter, Collective::kAllGather, Collective::kAllToAll}) {
    expect_refused([&] { validate(call_of(collective, times_world), kPlace); },
                   collective == Collective::kAllGather ? "send_count" : collective == Collective::kReduceScatter ? "recv_count" : "count",
                   "test_call", "world × count");
  }
  // Block collectives only: the same count is fine where nothing is multiplied by the world.
  EXPECT_EQ(call_of(Collective::kAllReduce, times_world).send_elements(kPlace.world), times_world);
}

TEST(CallChecks, ElementsPerSideFollowTheCollective) {
  const int world = kPlace.world;
  EXPECT_EQ(call_of(Collective::kAllReduce, 5).send_elements(world), 5u);
  EXPECT_EQ(call_of(Collective::kAllReduce, 5).recv_elements(world), 5u);
  EXPECT_EQ(call_of(Collective::kReduceScatter, 5).send_elements(world), 20u);
  EXPECT_EQ(call_of(Collective::kReduceScatter, 5).recv_elements(world), 5u);
  EXPECT_EQ(call_of(Collective::kAllGather, 5).send_elements(world), 5u);
  EXPECT_EQ(call_of(Collective::kAllGather, 5).recv_elements(world), 20u);
  EXPECT_EQ(call_of(Collective::kAllToAll, 5).send_elements(world), 20u);
  EXPECT_EQ(call_of(Collective::kAllToAll, 5).recv_elements(world), 20u);
}

TEST(CallChecks, AllToAllvLaysOutPackedAndDisplacedBlocks) {
  // Nothing moves on this rank (rank 1 sends and receives 0 elements everywhere but the counts are checked):
  // null buffers pass, since no byte goes through them.
  const size_t zeros[4] = {0, 0, 0, 0};
  const AllToAllvCall none =
      validate_all_to_allv("test_call", nullptr, zeros, nullptr, nullptr, zeros, nullptr, DataType::kFloat32, kPlace);
  EXPECT_EQ(none.send_extent, 0u);
  EXPECT_EQ(none.recv_extent, 0u);

  const size_t counts[4] = {3, 0, 2, 5};
  const size_t displs[4] = {100, 0, 10, 20};
  int here = 0;
  // Rank 1's own counts are 0 on both sides; the null recv buffer is refused only because bytes go through it.
  expect_refused([&] { validate_all_to_allv("test_call", nullptr, counts, nullptr, &here, counts, displs,
                                            DataType::kFloat32, kPlace); },
                 "send", "test_call", "null send with 10 elements to move");
  const size_t mine[4] = {0, 4, 0, 0};
  const size_t other[4] = {0, 3, 0, 0};
  expect_refused([&] { validate_all_to_allv("test_call", &here, mine, nullptr, &here, other, nullptr,
                                            DataType::kFloat32, kPlace); },
                 "recv_counts", "test_call", "own send and receive counts differ");
  expect_refused([&] { validate_all_to_allv("test_call", nullptr, nullptr, nullptr, nullptr, zeros, nullptr,
                                            DataType::kFloat32, kPlace); },
                 "send_counts", "test_call", "null send_counts");
  const size_t huge[4] = {0, 0, SIZE_MAX / 4 + 1, 0};
  expect_refused([&] { validate_all_to_allv("test_call", nullptr, huge, nullptr, nullptr, zeros, nullptr,
                                            DataType::kFloat32, kPlace); },
                 "send_counts", "test_call", "count × 4 bytes overflows");
}

TEST(CallChecks, PointToPointOpsAreNamedByIndexInABatch) {
  int here = 0;
  const PointToPoint bad_peer[] = {{PointToPoint::kSend, 0, &here, 0, DataType::kFloat32},
                                   {PointToPoint::kRecv, kPlace.world, &here, 0, DataType::kFloat32}};
  expect_refused([&] { validate_point_to_point("test_call", false, bad_peer, 2, kPlace); }, "ops[1].peer", "test_call",
                 "peer out of range in a batch");
  expect_refused([&] { validate_point_to_point("test_call", true, bad_peer + 1, 1, kPlace); }, "peer", "test_call",
                 "peer out of range in a single op");
  const PointToPoint null_buffer[] = {{PointToPoint::kSend, 0, nullptr, 3, DataType::kFloat32}};
  expect_refused([&] { validate_point_to_point("test_call", false, null_buffer, 1, kPlace); }, "ops[0].buffer",
                 "test_call", "null buffer with 12 bytes");
  const PointToPoint lone_self_send[] = {{PointToPoint::kSend, kPlace.rank, nullptr, 0, DataType::kFloat32}};
  expect_refused([&] { validate_point_to_point("test_call", false, lone_self_send, 1, kPlace); }, "ops", "test_call",
                 "a send to self without a receive from self");
  const PointToPoint empty[] = {{PointToPoint::kSend, 0, nullptr, 0, DataType::kFloat32},
                                {PointToPoint::kRecv, 2, nullptr, 0, DataType::kInt8}};
  const PointToPointBatch batch = validate_point_to_point("test_call", false, empty, 2, kPlace);
  ASSERT_EQ(batch.checked.size(), 2u);
  EXPECT_TRUE(batch.checked[0].send);
  EXPECT_FALSE(batch.checked[1].send);
  EXPECT_EQ(batch.checked[1].peer, 2);
  EXPECT_EQ(batch.checked[1].bytes, 0u);
}

}  // namespace
}  // namespace braid::collectives
