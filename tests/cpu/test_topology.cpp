// The CUDA-backend topology rule, on made-up identities (no GPU needed).
#include <gtest/gtest.h>

#include "comm/topology.hpp"
#include "expect_error.hpp"

namespace braid {
namespace {

std::vector<RankIdentity> ranks_on_one_host(int count) {
  std::vector<RankIdentity> ranks;
  for (int r = 0; r < count; ++r) {
    ranks.push_back({"node1", "boot-a", "0000:0" + std::to_string(r) + ":00.0", r, 100 + r, "pid:[4026531836]"});
  }
  return ranks;
}

TEST(Topology, FullyConnectedRanksOnOneHostAreAccepted) {
  EXPECT_EQ(cuda_backend_topology_problem(ranks_on_one_host(4), {"1111", "1111", "1111", "1111"}), "");
  EXPECT_EQ(cuda_backend_topology_problem(ranks_on_one_host(1), {"1"}), "");
}

TEST(Topology, AMissingP2PPairIsNamedInEitherDirection) {
  std::string problem = cuda_backend_topology_problem(ranks_on_one_host(4), {"1111", "1111", "1110", "1111"});
  EXPECT_NE(problem.find("rank 2 (GPU 0000:02:00.0) cannot reach rank 3 (GPU 0000:03:00.0)"), std::string::npos) << problem;
}

TEST(Topology, RanksOnTwoHostsAreRefused) {
  std::vector<RankIdentity> ranks = ranks_on_one_host(2);
  ranks[1].host = "node2";
  ranks[1].boot_id = "boot-b";
  std::string problem = cuda_backend_topology_problem(ranks, {"11", "11"});
  EXPECT_NE(problem.find("rank 1 is on host 'node2' and rank 0 on host 'node1'"), std::string::npos) << problem;
}

TEST(Topology, SameHostNameWithDifferentBootIdsIsTwoHosts) {
  std::vector<RankIdentity> ranks = ranks_on_one_host(2);
  ranks[1].boot_id = "boot-b";  // two containers named alike on different machines
  EXPECT_NE(cuda_backend_topology_problem(ranks, {"11", "11"}), "");
}

TEST(Topology, TwoRanksOnOneGpuAreRefused) {
  std::vector<RankIdentity> ranks = ranks_on_one_host(3);
  ranks[2].pci_bus_id = ranks[0].pci_bus_id;
  std::string problem = cuda_backend_topology_problem(ranks, {"111", "111", "111"});
  EXPECT_NE(problem.find("ranks 0 and 2 both use GPU 0000:00:00.0"), std::string::npos) << problem;
  EXPECT_NE(problem.find("BRAID_ALLOW_SHARED_GPU=1"), std::string::npos) << problem << ": names the way out";
}

TEST(Topology, SharedGpuLaunchesSeatEveryRankOrAreRefused) {
  EXPECT_EQ(shared_gpu_launch_blocks(64, 132, 2, 0), 32);   // H200: the 64-block cap split
  EXPECT_EQ(shared_gpu_launch_blocks(64, 132, 4, 0), 16);
  EXPECT_EQ(shared_gpu_launch_blocks(8, 132, 2, 0), 8);     // a smaller BRAID_MAX_BLOCKS stays
  EXPECT_EQ(shared_gpu_launch_blocks(64, 40, 4, 0), 10);    // fewer multiprocessors than 64: they are split
  EXPECT_EQ(shared_gpu_launch_blocks(64, 132, 100, 0), 1);  // at least one block a rank
  const std::string message =
      expect_error([] { shared_gpu_launch_blocks(64, 40, 41, 1); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("41 ranks share one GPU"), std::string::npos) << message;
  EXPECT_NE(message.find("GPU 1 has 40 multiprocessors"), std::string::npos) << message;
}

TEST(Topology, ThreadsSharingAGpuAreWarnedOfTooFewHardwareQueues) {
  std::vector<RankIdentity> ranks = ranks_on_one_host(4);
  EXPECT_EQ(most_threads_on_one_gpu(ranks), 1);
  ranks[2].pci_bus_id = ranks[0].pci_bus_id;
  EXPECT_EQ(most_threads_on_one_gpu(ranks), 1) << "two processes on one GPU have a context each";
  ranks[2].pid = ranks[0].pid;
  EXPECT_EQ(most_threads_on_one_gpu(ranks), 2);
  ranks[2].pid_namespace = "pid:[1]";  // the same pid in another namespace: another process
  EXPECT_EQ(most_threads_on_one_gpu(ranks), 1);
  EXPECT_EQ(shared_queue_warning(1, nullptr), "");
  EXPECT_EQ(shared_queue_warning(2, "32"), "");
  const std::string unset = shared_queue_warning(2, nullptr);
  EXPECT_NE(unset.find("8 hardware queues (CUDA_DEVICE_MAX_CONNECTIONS unset)"), std::string::npos) << unset;
  EXPECT_NE(unset.find("CUDA_DEVICE_MAX_CONNECTIONS=32"), std::string::npos) << unset;
  const std::string low = shared_queue_warning(4, "1");
  EXPECT_NE(low.find("4 ranks share one GPU"), std::string::npos) << low;
  EXPECT_NE(low.find("1 hardware queues (CUDA_DEVICE_MAX_CONNECTIONS=1)"), std::string::npos) << low;
}

TEST(Topology, RanksMayShareAGpuWhereAllowed) {
  std::vector<RankIdentity> ranks = ranks_on_one_host(4);
  ranks[2].pci_bus_id = ranks[0].pci_bus_id;
  ranks[3].pci_bus_id = ranks[0].pci_bus_id;
  EXPECT_EQ(cuda_backend_topology_problem(ranks, {"1111", "1111", "1111", "1111"}, true), "");
  EXPECT_NE(cuda_backend_topology_problem(ranks, {"1111", "1101", "1111", "1111"}, true), "") << "P2P still counts";
  EXPECT_EQ(most_ranks_on_one_gpu(ranks), 3);
  EXPECT_EQ(most_ranks_on_one_gpu(ranks_on_one_host(4)), 1);
  ranks[3].host = "node2";  // same bus id on another host: another GPU
  EXPECT_EQ(most_ranks_on_one_gpu(ranks), 2);
}

TEST(Topology, IdentityRoundTripsThroughItsEncoding) {
  RankIdentity identity{"host-x", "boot", "0000:1b:00.0", 3, 4242, "pid:[4026531836]"};
  RankIdentity back = RankIdentity::decode(identity.encode(), 0);
  EXPECT_EQ(back.pid_namespace, identity.pid_namespace);
  EXPECT_EQ(back.host, identity.host);
  EXPECT_EQ(back.boot_id, identity.boot_id);
  EXPECT_EQ(back.pci_bus_id, identity.pci_bus_id);
  EXPECT_EQ(back.device, 3);
  EXPECT_EQ(back.pid, 4242);
  EXPECT_THROW(RankIdentity::decode("only\ntwo", 1), Error);
}

// fd passing checks a rank's process only where the kernel names it as the rank did: same host, same pid
// namespace (a rank in another container of the host has other pids there).
TEST(Topology, PidsAreCheckedOnlyWithinOnePidNamespace) {
  std::vector<RankIdentity> ranks = ranks_on_one_host(4);
  ranks[2].pid_namespace = "pid:[4026532000]";
  ranks[3].boot_id = "boot-b";
  EXPECT_EQ(checkable_pids(ranks, ranks[0]), (std::vector<int>{100, 101, 0, 0}));
  EXPECT_EQ(checkable_pids(ranks, ranks[2]), (std::vector<int>{0, 0, 102, 0}));
  ranks[0].pid_namespace = "unknown";  // /proc/self/ns/pid unreadable: nothing is compared
  EXPECT_EQ(checkable_pids(ranks, ranks[0]), (std::vector<int>{0, 0, 0, 0}));
}

}  // namespace
}  // namespace braid
