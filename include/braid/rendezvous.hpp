// braid — C++ API, rendezvous: where and how the ranks of a job meet (part of braid/braid.hpp, which includes
// it; the bootstrap layer implements it).
#pragma once

#include <memory>
#include <string>

namespace braid {

class StoreServer;

// Where and how the ranks of a job meet.
struct Rendezvous {
  int rank = -1;
  int size = 0;
  int local_rank = -1;  // rank among this host's ranks; the device where neither CommOptions::device nor BRAID_DEVICE
                        // names one (modulo the GPUs under BRAID_ALLOW_SHARED_GPU=1); negative: same as rank
  int local_size = 0;   // ranks on this host, as the launcher gave it (from_env checks it; init does not read it)
  std::string store_host = "127.0.0.1";
  int store_port = 0;
  bool serve_store = false;  // this rank serves the store at store_host:store_port (binds all interfaces
                             // unless store_host is a loopback address)
  std::string job_id;        // namespaces the job's keys in the store, so communicators of jobs that share a store
                             // never mix (it names no socket). from_env(): BRAID_JOB_ID where set, else derived
                             // from the launcher's job variables (torchrun, Open MPI, MPICH, Slurm), or, where they
                             // name no job, from the job's address (torchrun: MASTER_ADDR, 127.0.0.1 where unset,
                             // and MASTER_PORT, or BRAID_STORE_ADDR where MASTER_PORT is unset; Open MPI, MPICH,
                             // Slurm: the store's host and port). braid-run sets BRAID_JOB_ID, and its variables
                             // without it derive none. Empty (as at_store makes it, or braid-run's variables
                             // without BRAID_JOB_ID): the fixed namespace "job"
  std::string source = "explicit";  // convention that produced it: braid-run, torchrun, openmpi, mpich,
                                    // slurm, explicit

  // From the environment: braid-run's BRAID_* variables wherever BRAID_RANK is set (an empty one is refused as no
  // integer; BRAID_WORLD_SIZE and BRAID_STORE_ADDR must be set too, else kInvalidArgument naming the missing one),
  // otherwise the first convention, in this order, whose rank and size variables are both set: torchrun's
  // RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE/MASTER_ADDR/MASTER_PORT; Open MPI's OMPI_COMM_WORLD_*; MPICH's PMI_*;
  // Slurm's SLURM_* (docs/config.md has each one's variables).
  // BRAID_STORE_ADDR overrides the store address of any convention. Throws kInvalidArgument naming the missing
  // or malformed variable (where no convention has both, one whose rank or size alone is set is named). Local
  // rank and size default to rank and size. Under torchrun, MASTER_PORT may be missing only where
  // BRAID_STORE_ADDR is set, and MASTER_ADDR only where BRAID_STORE_ADDR is set or every rank is taken to be on this
  // host (LOCAL_WORLD_SIZE equal to WORLD_SIZE, or LOCAL_WORLD_SIZE unset; without BRAID_STORE_ADDR the store is
  // then at 127.0.0.1). BRAID_JOB_ID names the job under any convention where it is set and not empty.
  // Unknown BRAID_* names in the environment are reported once, as warnings on stderr (unless BRAID_LOG_LEVEL is
  // error).
  static Rendezvous from_env();

  // Explicit: every rank (process or thread) names the same store "host:port"; rank 0 serves it when
  // rank0_serves_store (then the port must be free), otherwise someone else does (see StoreHost). Port 0 is refused
  // (kInvalidArgument naming store_address: every rank must know the port; for a free port picked for you, make a
  // StoreHost with port 0 and pass its address()), and so are size < 1 and rank outside [0, size) (naming them).
  static Rendezvous at_store(const std::string& store_address, int rank, int size, bool rank0_serves_store);
};

// A store served by this process until destroyed: for ranks that are threads of one process, or for a
// custom launcher. Pass address() to Rendezvous::at_store(..., rank0_serves_store = false). It listens on every
// address `bind_host` resolves to ("localhost": 127.0.0.1, and ::1 where the resolver lists it; "0.0.0.0": every
// IPv4 interface; "" or "::": every interface of both families, for "::" through one IPv6 socket that takes IPv4
// too where the system allows it, as Linux does by default), so that no other process can hold one of them;
// throws kSystemError naming the address where one is taken. `port` 0 picks a free port; outside [0, 65535]
// throws kInvalidArgument naming port. With
// BRAID_JOB_SECRET set in this process (before braid's first call: braid takes its BRAID_* settings once,
// docs/config.md), it serves only clients that prove they know that secret (set it alike in every process of the
// job); clients of this host that run as another user are closed whatever the secret
// (docs/security.md). Throws kInvalidArgument naming BRAID_JOB_SECRET for a secret under 16 bytes.
class StoreHost {
 public:
  explicit StoreHost(const std::string& bind_host = "127.0.0.1", int port = 0);
  ~StoreHost();
  StoreHost(const StoreHost&) = delete;
  StoreHost& operator=(const StoreHost&) = delete;
  std::string address() const;  // "host:port"

 private:
  std::string host_;
  std::unique_ptr<StoreServer> server_;
};

}  // namespace braid
