// Rendezvous from launcher environments: every convention, precedence, store address choice, and
// the errors for missing or malformed variables.
#include <gtest/gtest.h>

#include <string>

#include "bootstrap/rendezvous.hpp"
#include "bootstrap/store.hpp"
#include "braid/braid.hpp"

namespace braid {
namespace {

// Runs `body` expecting Error(kInvalidArgument) whose message contains every one of `needles`.
template <typename Body>
void expect_invalid(Body body, std::initializer_list<std::string> needles) {
  try {
    body();
    ADD_FAILURE() << "expected braid::Error(kInvalidArgument)";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument) << error.what();
    for (const std::string& needle : needles) {
      EXPECT_NE(std::string(error.what()).find(needle), std::string::npos)
          << "message lacks '" << needle << "': " << error.what();
    }
  }
}

void expect_invalid_env(const Environment& env, std::initializer_list<std::string> needles) {
  expect_invalid([&] { rendezvous_from_environment(env); }, needles);
}

Environment torchrun_env() {
  return {{"RANK", "3"},           {"WORLD_SIZE", "8"},        {"LOCAL_RANK", "1"},
          {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29500"}};
}

Environment open_mpi_single_host_env(const std::string& jobid) {
  return {{"OMPI_COMM_WORLD_RANK", "2"},
          {"OMPI_COMM_WORLD_SIZE", "4"},
          {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
          {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
          {"OMPI_MCA_ess_base_jobid", jobid}};
}

Environment slurm_single_node_env(const std::string& job, const std::string& step) {
  return {{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"},   {"SLURM_LOCALID", "1"},
          {"SLURM_NNODES", "1"}, {"SLURM_JOB_ID", job}, {"SLURM_STEP_ID", step}};
}

TEST(Rendezvous, BraidRun) {
  Rendezvous r = rendezvous_from_environment({{"BRAID_RANK", "5"},
                                              {"BRAID_WORLD_SIZE", "8"},
                                              {"BRAID_LOCAL_RANK", "1"},
                                              {"BRAID_LOCAL_SIZE", "4"},
                                              {"BRAID_STORE_ADDR", "10.0.0.1:4242"},
                                              {"BRAID_JOB_ID", "job-17"}});
  EXPECT_EQ(r.rank, 5);
  EXPECT_EQ(r.size, 8);
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.local_size, 4);
  EXPECT_EQ(r.store_host, "10.0.0.1");
  EXPECT_EQ(r.store_port, 4242);
  EXPECT_FALSE(r.serve_store);  // braid-run serves the store, even for rank 0
  EXPECT_EQ(r.job_id, "job-17");
  EXPECT_EQ(r.source, "braid-run");
}

TEST(Rendezvous, BraidRunLocalDefaultsAndRequiredStore) {
  Rendezvous r = rendezvous_from_environment(
      {{"BRAID_RANK", "0"}, {"BRAID_WORLD_SIZE", "2"}, {"BRAID_STORE_ADDR", "127.0.0.1:5000"}});
  EXPECT_EQ(r.local_rank, 0);
  EXPECT_EQ(r.local_size, 2);
  EXPECT_FALSE(r.serve_store);
  expect_invalid_env({{"BRAID_RANK", "0"}, {"BRAID_WORLD_SIZE", "2"}}, {"BRAID_STORE_ADDR"});
  expect_invalid_env({{"BRAID_RANK", "0"}, {"BRAID_STORE_ADDR", "127.0.0.1:5000"}}, {"BRAID_WORLD_SIZE"});
}

TEST(Rendezvous, Torchrun) {
  Rendezvous r = rendezvous_from_environment(torchrun_env());
  EXPECT_EQ(r.rank, 3);
  EXPECT_EQ(r.size, 8);
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.local_size, 2);
  EXPECT_EQ(r.store_host, "node0");
  EXPECT_EQ(r.store_port, 29501);  // torchrun's own store holds MASTER_PORT
  EXPECT_FALSE(r.serve_store);
  EXPECT_EQ(r.job_id, "torchrun-node0-29500");
  EXPECT_EQ(r.source, "torchrun");
}

TEST(Rendezvous, TorchrunRankZeroServesAndRunId) {
  Environment env = torchrun_env();
  env["RANK"] = "0";
  env["LOCAL_RANK"] = "0";
  env["TORCHELASTIC_RUN_ID"] = "abc123";
  Rendezvous r = rendezvous_from_environment(env);
  EXPECT_TRUE(r.serve_store);
  EXPECT_EQ(r.job_id, "torchrun-abc123");
  // torchrun's static default run id "none" is shared by every job, so it is not used.
  env["TORCHELASTIC_RUN_ID"] = "none";
  EXPECT_EQ(rendezvous_from_environment(env).job_id, "torchrun-node0-29500");
}

TEST(Rendezvous, TorchrunDefaults) {
  Rendezvous r = rendezvous_from_environment({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1234"}});
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.local_size, 2);
  EXPECT_EQ(r.store_host, "127.0.0.1");
  EXPECT_EQ(r.store_port, 1235);
  expect_invalid_env({{"RANK", "1"}, {"WORLD_SIZE", "2"}}, {"MASTER_PORT"});
  // Without MASTER_ADDR the store is on this host: a job of several hosts must name it.
  Environment several_hosts = torchrun_env();
  several_hosts.erase("MASTER_ADDR");
  expect_invalid_env(several_hosts, {"MASTER_ADDR", "LOCAL_WORLD_SIZE=2", "WORLD_SIZE=8"});
  several_hosts["BRAID_STORE_ADDR"] = "node0:7000";
  EXPECT_EQ(rendezvous_from_environment(several_hosts).store_host, "node0");
}

TEST(Rendezvous, TorchrunPortOffset) {
  Environment env = torchrun_env();
  env["BRAID_STORE_PORT_OFFSET"] = "5";
  EXPECT_EQ(rendezvous_from_environment(env).store_port, 29505);
  env["MASTER_PORT"] = "65535";
  expect_invalid_env(env, {"MASTER_PORT", "BRAID_STORE_PORT_OFFSET"});
  // 0 would take the launcher's own port.
  env["MASTER_PORT"] = "29500";
  env["BRAID_STORE_PORT_OFFSET"] = "0";
  expect_invalid_env(env, {"BRAID_STORE_PORT_OFFSET=0", "MASTER_PORT=29500"});
  // Offsets are bounded before they are added (no overflow), and the sum must be a port.
  env["BRAID_STORE_PORT_OFFSET"] = "2147483647";
  expect_invalid_env(env, {"BRAID_STORE_PORT_OFFSET"});
  env["BRAID_STORE_PORT_OFFSET"] = "-29499";
  EXPECT_EQ(rendezvous_from_environment(env).store_port, 1);
  env["BRAID_STORE_PORT_OFFSET"] = "-29500";
  expect_invalid_env(env, {"MASTER_PORT=29500", "BRAID_STORE_PORT_OFFSET=-29500"});
}

TEST(Rendezvous, BraidRunBeatsTorchrun) {
  Environment env = torchrun_env();
  env["BRAID_RANK"] = "6";
  env["BRAID_WORLD_SIZE"] = "7";
  env["BRAID_STORE_ADDR"] = "h:1";
  Rendezvous r = rendezvous_from_environment(env);
  EXPECT_EQ(r.source, "braid-run");
  EXPECT_EQ(r.rank, 6);
  EXPECT_EQ(r.size, 7);
}

TEST(Rendezvous, ASetBraidRankSelectsBraidRunEvenBesideTorchrun) {
  Environment env = torchrun_env();
  env["BRAID_RANK"] = "6";
  expect_invalid_env(env, {"BRAID_WORLD_SIZE"});
  env["BRAID_RANK"] = "";
  env["BRAID_WORLD_SIZE"] = "7";
  env["BRAID_STORE_ADDR"] = "h:1";
  expect_invalid_env(env, {"BRAID_RANK"});
}

TEST(Rendezvous, TorchrunBeatsMpiAndSlurm) {
  Environment env = torchrun_env();
  env.merge(open_mpi_single_host_env("1234"));
  env.merge(slurm_single_node_env("55", "0"));
  EXPECT_EQ(rendezvous_from_environment(env).source, "torchrun");
}

TEST(Rendezvous, StoreAddrOverridesEveryConvention) {
  Environment torchrun = torchrun_env();
  torchrun["BRAID_STORE_ADDR"] = "store.example:7000";
  Rendezvous r = rendezvous_from_environment(torchrun);
  EXPECT_EQ(r.store_host, "store.example");
  EXPECT_EQ(r.store_port, 7000);
  EXPECT_FALSE(r.serve_store);
  EXPECT_EQ(r.job_id, "torchrun-node0-29500");
  // With the override, torchrun's MASTER_PORT is not needed: the store's address names the job.
  torchrun.erase("MASTER_PORT");
  r = rendezvous_from_environment(torchrun);
  EXPECT_EQ(r.store_host, "store.example");
  EXPECT_EQ(r.store_port, 7000);
  EXPECT_EQ(r.job_id, "torchrun-store.example-7000");

  Environment mpi = open_mpi_single_host_env("99");
  mpi["OMPI_COMM_WORLD_RANK"] = "0";
  mpi["OMPI_COMM_WORLD_LOCAL_RANK"] = "0";
  mpi["MASTER_ADDR"] = "ignored";
  mpi["MASTER_PORT"] = "1000";
  mpi["BRAID_STORE_ADDR"] = "store.example:7000";
  r = rendezvous_from_environment(mpi);
  EXPECT_EQ(r.store_host, "store.example");
  EXPECT_EQ(r.store_port, 7000);
  EXPECT_TRUE(r.serve_store);  // rank 0 still serves it under MPI

  mpi["BRAID_STORE_ADDR"] = "nonsense";
  expect_invalid_env(mpi, {"BRAID_STORE_ADDR"});
}

TEST(Rendezvous, OpenMpiSingleHostDerivedPort) {
  Rendezvous r = rendezvous_from_environment(open_mpi_single_host_env("3141"));
  EXPECT_EQ(r.rank, 2);
  EXPECT_EQ(r.size, 4);
  EXPECT_EQ(r.local_rank, 2);
  EXPECT_EQ(r.local_size, 4);
  EXPECT_EQ(r.store_host, "127.0.0.1");
  EXPECT_GE(r.store_port, 20000);
  EXPECT_LT(r.store_port, 60000);
  EXPECT_FALSE(r.serve_store);
  EXPECT_EQ(r.job_id, "openmpi-3141");
  EXPECT_EQ(r.source, "openmpi");

  // Stable: every rank (and every run of the same job) derives the same port.
  EXPECT_EQ(rendezvous_from_environment(open_mpi_single_host_env("3141")).store_port, r.store_port);
  Environment rank0 = open_mpi_single_host_env("3141");
  rank0["OMPI_COMM_WORLD_RANK"] = "0";
  rank0["OMPI_COMM_WORLD_LOCAL_RANK"] = "0";
  Rendezvous r0 = rendezvous_from_environment(rank0);
  EXPECT_EQ(r0.store_port, r.store_port);
  EXPECT_TRUE(r0.serve_store);
  // Another job gets another port.
  EXPECT_NE(rendezvous_from_environment(open_mpi_single_host_env("2718")).store_port, r.store_port);
}

TEST(Rendezvous, OpenMpiPmixNamespace) {
  Environment env = open_mpi_single_host_env("x");
  env.erase("OMPI_MCA_ess_base_jobid");
  env["PMIX_NAMESPACE"] = "prterun-host-1234@1";
  EXPECT_EQ(rendezvous_from_environment(env).job_id, "openmpi-prterun-host-1234@1");
  env.erase("PMIX_NAMESPACE");
  expect_invalid_env(env, {"OMPI_MCA_ess_base_jobid", "BRAID_STORE_ADDR"});
}

TEST(Rendezvous, OpenMpiMultiHostUsesMaster) {
  Environment env = open_mpi_single_host_env("3141");
  env["OMPI_COMM_WORLD_SIZE"] = "8";
  env["MASTER_ADDR"] = "head";
  env["MASTER_PORT"] = "6000";
  Rendezvous r = rendezvous_from_environment(env);
  EXPECT_EQ(r.store_host, "head");
  EXPECT_EQ(r.store_port, 6001);
  EXPECT_EQ(r.size, 8);
  EXPECT_EQ(r.local_size, 4);
}

TEST(Rendezvous, MultiHostWithoutAddressFails) {
  Environment env = open_mpi_single_host_env("3141");
  env["OMPI_COMM_WORLD_SIZE"] = "8";
  expect_invalid_env(env, {"openmpi", "BRAID_STORE_ADDR", "MASTER_ADDR"});

  Environment slurm = slurm_single_node_env("55", "0");
  slurm["SLURM_NTASKS"] = "8";
  slurm["SLURM_NNODES"] = "2";
  slurm["SLURM_TASKS_PER_NODE"] = "4(x2)";
  expect_invalid_env(slurm, {"slurm", "BRAID_STORE_ADDR"});
}

TEST(Rendezvous, Mpich) {
  Rendezvous r = rendezvous_from_environment({{"PMI_RANK", "1"},
                                              {"PMI_SIZE", "2"},
                                              {"MPI_LOCALRANKID", "1"},
                                              {"MPI_LOCALNRANKS", "2"},
                                              {"PMI_KVSNAME", "kvs_77_0"}});
  EXPECT_EQ(r.rank, 1);
  EXPECT_EQ(r.size, 2);
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.local_size, 2);
  EXPECT_EQ(r.store_host, "127.0.0.1");
  EXPECT_GE(r.store_port, 20000);
  EXPECT_LT(r.store_port, 60000);
  EXPECT_FALSE(r.serve_store);
  EXPECT_EQ(r.job_id, "mpich-kvs_77_0");
  EXPECT_EQ(r.source, "mpich");
}

TEST(Rendezvous, MpichWithoutLocalSizeNeedsAddress) {
  // Without MPI_LOCALNRANKS braid cannot tell that the job is on one host.
  expect_invalid_env({{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}, {"PMI_KVSNAME", "kvs"}},
                     {"MPI_LOCALNRANKS", "BRAID_STORE_ADDR"});
}

TEST(Rendezvous, SlurmSingleNode) {
  Rendezvous r = rendezvous_from_environment(slurm_single_node_env("4242", "3"));
  EXPECT_EQ(r.rank, 1);
  EXPECT_EQ(r.size, 4);
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.local_size, 4);
  EXPECT_EQ(r.store_host, "127.0.0.1");
  EXPECT_GE(r.store_port, 20000);
  EXPECT_LT(r.store_port, 60000);
  EXPECT_FALSE(r.serve_store);
  EXPECT_EQ(r.job_id, "slurm-4242.3");
  EXPECT_EQ(r.source, "slurm");
  EXPECT_EQ(rendezvous_from_environment(slurm_single_node_env("4242", "3")).store_port, r.store_port);
  EXPECT_NE(rendezvous_from_environment(slurm_single_node_env("4243", "3")).store_port, r.store_port);
}

TEST(Rendezvous, SlurmLocalSize) {
  Environment env = slurm_single_node_env("1", "0");
  env["SLURM_NTASKS"] = "8";
  env["SLURM_NNODES"] = "2";
  env["MASTER_ADDR"] = "head";
  env["MASTER_PORT"] = "100";
  env["SLURM_TASKS_PER_NODE"] = "4(x2)";
  EXPECT_EQ(rendezvous_from_environment(env).local_size, 4);
  env["SLURM_TASKS_PER_NODE"] = "5,3";
  env["SLURM_NODEID"] = "1";  // this node's field, not the first
  EXPECT_EQ(rendezvous_from_environment(env).local_size, 3);
  env["SLURM_NTASKS_PER_NODE"] = "4";  // explicit wins
  EXPECT_EQ(rendezvous_from_environment(env).local_size, 4);
}

TEST(Rendezvous, MalformedIntegerNamesVariable) {
  Environment mpi = open_mpi_single_host_env("1");
  mpi["OMPI_COMM_WORLD_RANK"] = "x";
  expect_invalid_env(mpi, {"OMPI_COMM_WORLD_RANK='x' is not an integer"});
  expect_invalid_env({{"BRAID_RANK", "1a"}, {"BRAID_WORLD_SIZE", "2"}, {"BRAID_STORE_ADDR", "h:1"}},
                     {"BRAID_RANK='1a'"});
  Environment torchrun = torchrun_env();
  torchrun["MASTER_PORT"] = "http";
  expect_invalid_env(torchrun, {"MASTER_PORT='http'"});
  torchrun = torchrun_env();
  torchrun["WORLD_SIZE"] = "99999999999";
  expect_invalid_env(torchrun, {"WORLD_SIZE='99999999999'"});
}

TEST(Rendezvous, OutOfRangeNamesVariable) {
  Environment torchrun = torchrun_env();
  torchrun["RANK"] = "8";
  expect_invalid_env(torchrun, {"RANK=8"});
  torchrun = torchrun_env();
  torchrun["WORLD_SIZE"] = "0";
  expect_invalid_env(torchrun, {"WORLD_SIZE=0"});
  torchrun = torchrun_env();
  torchrun["LOCAL_RANK"] = "2";
  expect_invalid_env(torchrun, {"LOCAL_RANK=2"});
  expect_invalid_env({{"BRAID_RANK", "-1"}, {"BRAID_WORLD_SIZE", "2"}, {"BRAID_STORE_ADDR", "h:1"}},
                     {"BRAID_RANK=-1"});
  Environment slurm = slurm_single_node_env("1", "0");
  slurm["SLURM_LOCALID"] = "4";
  expect_invalid_env(slurm, {"SLURM_LOCALID=4"});
}

TEST(Rendezvous, NothingSet) {
  expect_invalid_env({{"HOME", "/root"}, {"PATH", "/bin"}},
                     {"BRAID_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"});
  // Half a convention is not a convention; where no whole one is set, the missing half is named.
  expect_invalid_env({{"RANK", "0"}}, {"RANK is set but WORLD_SIZE is not"});
  expect_invalid_env({{"PMI_SIZE", "2"}}, {"PMI_SIZE is set but PMI_RANK is not"});
  // A whole convention wins over half of an earlier one.
  Environment slurm_and_half_torchrun = {
      {"RANK", "0"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_NNODES", "1"}, {"SLURM_JOB_ID", "7"}};
  EXPECT_EQ(rendezvous_from_environment(slurm_and_half_torchrun).source, "slurm");
}

TEST(Rendezvous, JobIdOverride) {
  Environment env = torchrun_env();
  env["BRAID_JOB_ID"] = "mine";
  EXPECT_EQ(rendezvous_from_environment(env).job_id, "mine");
  // Empty is unset, as every launcher variable: the launcher's job id stays.
  const std::string derived = rendezvous_from_environment(torchrun_env()).job_id;
  env["BRAID_JOB_ID"] = "";
  EXPECT_EQ(rendezvous_from_environment(env).job_id, derived);
  EXPECT_FALSE(derived.empty());
}

TEST(Rendezvous, AtStore) {
  Rendezvous r0 = Rendezvous::at_store("127.0.0.1:29999", 0, 4, true);
  EXPECT_EQ(r0.rank, 0);
  EXPECT_EQ(r0.size, 4);
  EXPECT_EQ(r0.local_rank, 0);
  EXPECT_EQ(r0.local_size, 4);
  EXPECT_EQ(r0.store_host, "127.0.0.1");
  EXPECT_EQ(r0.store_port, 29999);
  EXPECT_TRUE(r0.serve_store);
  EXPECT_EQ(r0.source, "explicit");
  Rendezvous r3 = Rendezvous::at_store("127.0.0.1:29999", 3, 4, true);
  EXPECT_FALSE(r3.serve_store);
  EXPECT_EQ(r3.local_rank, 3);
  EXPECT_FALSE(Rendezvous::at_store("127.0.0.1:29999", 0, 4, false).serve_store);
}

TEST(Rendezvous, AtStoreValidates) {
  expect_invalid([] { Rendezvous::at_store("127.0.0.1:1", 4, 4, true); }, {"'rank'"});
  expect_invalid([] { Rendezvous::at_store("127.0.0.1:1", -1, 4, true); }, {"'rank'"});
  expect_invalid([] { Rendezvous::at_store("127.0.0.1:1", 0, 0, true); }, {"'size'"});
  expect_invalid([] { Rendezvous::at_store("no-port", 0, 1, true); }, {"'store_address'"});
  expect_invalid([] { Rendezvous::at_store("127.0.0.1:0", 0, 1, true); }, {"'store_address'", "port 0"});
}

TEST(Rendezvous, StoreHostRefusesPortsOutsideTheRange) {
  expect_invalid([] { StoreHost host("127.0.0.1", 65536); }, {"StoreHost", "'port'", "65536"});
  expect_invalid([] { StoreHost host("127.0.0.1", -1); }, {"StoreHost", "'port'"});
}

}  // namespace
// Rank 0 binds the loopback alias the others dial (binding 127.0.0.1 for 127.0.1.1 or ::1 would leave the others
// refused until the timeout); other hosts bind every interface.
TEST(Rendezvous, TheStoreBindsTheLoopbackAliasTheRanksDial) {
  EXPECT_EQ(store_bind_host("127.0.1.1"), "127.0.1.1");
  EXPECT_EQ(store_bind_host("127.0.0.1"), "127.0.0.1");
  EXPECT_EQ(store_bind_host("::1"), "::1");
  EXPECT_EQ(store_bind_host("[::1]"), "::1");
  EXPECT_EQ(store_bind_host("localhost"), "localhost");
  EXPECT_EQ(store_bind_host("node0"), "");
  EXPECT_EQ(store_bind_host("10.1.2.3"), "");
  StoreServer server(store_bind_host("127.0.1.1"), 0);
  StoreClient client("127.0.1.1", server.port(), 2.0);
  client.set("k", "v");
  EXPECT_EQ(client.get("k", 1.0), "v");
}

}  // namespace braid
