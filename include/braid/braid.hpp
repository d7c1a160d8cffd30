// braid — C++ API: communicators and symmetric memory for GPUs that share a host over NVLink.
//
//   braid::Communicator comm = braid::Communicator::init(braid::Rendezvous::from_env());
//   braid::SymmetricMemory mem = comm.alloc(1 << 20, {.contiguous_view = true});
//   // mem.local(), mem.peer(r), mem.device_peers() (for kernels), mem.view() ([world × view_stride()])
//
// Every call that fails throws braid::Error (braid/error.hpp). Calls leave the caller's current CUDA device as
// they found it: make comm.device() current before launching work for the communicator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "braid/error.hpp"
#include "braid/types.hpp"

namespace braid {

namespace detail {
struct CommState;
struct SymmetricAllocation;
struct Registration;
struct ExportedRange;
class PeerMapping;
struct TestAccess;
}  // namespace detail
namespace collectives {
struct CollectiveContext;
}  // namespace collectives

class StoreServer;

// Where and how the ranks of a job meet.
struct Rendezvous {
  int rank = -1;
  int size = 0;
  int local_rank = -1;  // rank among this host's ranks; -1: same as rank (one host)
  int local_size = 0;   // ranks on this host; 0: same as size
  std::string store_host = "127.0.0.1";
  int store_port = 0;
  bool serve_store = false;  // this rank serves the store at store_host:store_port (binds all interfaces
                             // unless store_host is a loopback address)
  std::string job_id;        // names host-local sockets; empty: derived when the communicator is made
  std::string source = "explicit";  // convention that produced it: braid-run, torchrun, openmpi, mpich,
                                    // slurm, explicit

  // From the environment, in this order: braid-run's BRAID_* variables; torchrun's RANK/WORLD_SIZE/
  // LOCAL_RANK/MASTER_ADDR/MASTER_PORT; Open MPI's OMPI_COMM_WORLD_*; MPICH's PMI_*; Slurm's SLURM_*.
  // BRAID_STORE_ADDR overrides the store address of any convention. Throws kInvalidArgument naming the
  // missing or malformed variable.
  static Rendezvous from_env();

  // Explicit: every rank (process or thread) names the same store "host:port"; rank 0 serves it when
  // rank0_serves_store (then the port must be free), otherwise someone else does (see StoreHost).
  static Rendezvous at_store(const std::string& store_address, int rank, int size, bool rank0_serves_store);
};

// A store served by this process until destroyed: for ranks that are threads of one process, or for a
// custom launcher. Pass address() to Rendezvous::at_store(..., rank0_serves_store = false). With
// BRAID_JOB_SECRET set in this process, it serves only clients that prove they know that secret (set it alike
// in every process of the job); clients of this host that run as another user are closed whatever the secret
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

struct CommOptions {
  int device = -1;         // CUDA device ordinal; -1: BRAID_DEVICE, else the local rank
  double timeout_s = 0.0;  // bound on every wait for a peer, in (0, 1e6] s; 0: BRAID_TIMEOUT_S
  std::string algorithms;  // algorithm overrides in BRAID_ALGO's syntax ("allreduce=ll,..."); empty: BRAID_ALGO
  std::string backend;     // "auto", "cuda" or "nccl" (see BRAID_BACKEND); empty: BRAID_BACKEND
  std::string nccl_library;  // the NCCL the NCCL backend loads (path or name); empty: BRAID_NCCL_LIBRARY
};

// What a rank knows of a peer.
struct PeerInfo {
  int rank = -1;
  std::string host;        // host name the peer reported
  bool same_host = false;
  int device = -1;         // the peer's CUDA ordinal in this process's numbering (-1: not visible here)
  std::string pci_bus_id;  // the peer's GPU
  bool p2p = false;        // this rank's GPU can map the peer's memory (cudaDeviceCanAccessPeer)
  bool native_atomics = false;  // P2P atomics are native (NVLink); false for PCIe peers
  int performance_rank = -1;    // cudaDevP2PAttrPerformanceRank (lower is faster); -1 when not P2P
};

struct AllocOptions {
  bool contiguous_view = false;  // also map every rank's memory into one [world × view_stride()] range
};

class SymmetricMemory;
class MoeBuffer;
class RegisteredBuffer;
class ExportedHandle;
class GlobalMemory;

// Counters of a communicator's registered buffers (tests and diagnostics).
struct RegistrationStats {
  uint64_t buffers = 0;        // registrations alive
  uint64_t exchanges = 0;      // host exchanges made by first uses of a registered buffer at an address
  uint64_t cache_hits = 0;     // uses that found the peers' mappings cached (no host exchange)
  uint64_t peer_mappings = 0;  // peers' allocations mapped here now
  uint64_t nccl_registered = 0;  // NCCL backend: ranges NCCL has registered (ncclCommRegister) now
};

// A group of ranks, one GPU each, on one host. Movable, not copyable; symmetric memory made from it
// stays valid after it is destroyed (teardown in any order).
//
// Ordering (NCCL's rule): a communicator's calls that take a stream (collectives, all-to-all(v), send/recv,
// put/get, MoE dispatch and combine) run on the GPU in the order they were made, whatever stream each names:
// a call's work starts after the previous call's work is done, and work the caller enqueues on a call's
// stream after it still follows it. An event is recorded after each call; a call waits on it when it names
// another stream than the previous call, and every eager call does once a graph holding this communicator's
// calls has been captured (calls on one stream, with no such graph, add no wait). Inside a CUDA graph capture
// the captured calls are ordered the same way, and every replay of the graph runs after the communicator's
// calls made before it was launched and before the calls made after it was launched. A communicator is driven
// by one host thread at a time.
class Communicator {
 public:
  // Collective over the ranks of `rendezvous`. Backend: CUDA (symmetric memory) where every rank is on one host
  // with every pair P2P-reachable; otherwise, or when asked (options.backend, BRAID_BACKEND), NCCL, loaded at run
  // time (BRAID_NCCL_LIBRARY), which serves the collectives and all-to-all(v) (symmetric memory, MoE, device-count
  // all-to-all and global memory need the CUDA backend: kUnsupported). Refuses two ranks on one GPU
  // (kInvalidArgument) and, with backend "cuda", ranks it cannot serve (kPeerUnreachable). The ranks meet at the
  // rendezvous' store, proving BRAID_JOB_SECRET where it is set (braid-run sets one): a store that refuses this
  // rank, or that does not know the secret, fails init with kRemoteError.
  static Communicator init(const Rendezvous& rendezvous, const CommOptions& options = {});

  Communicator(Communicator&&) noexcept;
  Communicator& operator=(Communicator&&) noexcept;
  ~Communicator();

  int rank() const;
  int size() const;
  int device() const;
  double timeout_s() const;
  const PeerInfo& peer(int rank) const;
  const std::vector<PeerInfo>& peers() const;
  // A line per peer: host, GPU, P2P, native atomics.
  std::string describe() const;
  // "cuda" (symmetric memory between the GPUs of one host) or "nccl" (see init).
  const char* backend() const;
  // Whether NVLink multicast serves all-reduce, reduce and all-gather: only with BRAID_ENABLE_MULTICAST=1 and
  // every rank's GPU able (docs/multicast.md); false everywhere else.
  bool uses_multicast() const;
  // The NCCL backend's ncclComm_t (for programs that also call NCCL on the same ranks); null on the CUDA backend.
  void* nccl_communicator() const;

  // Collective: every rank asks for the same number of bytes, in the same order (kMismatch otherwise).
  // bytes > 0. The memory is zeroed.
  SymmetricMemory alloc(size_t bytes, const AllocOptions& options = {});

  // Host-side barrier over the store (setup and tests; collectives never use it).
  void barrier();
  // Host-side allgather of small byte strings over the store (e.g. to share an NCCL unique id); collective.
  std::vector<std::string> host_allgather(const std::string& mine);

  // ---- Collectives (stream-ordered, CUDA-graph capturable; NCCL's argument order) ----
  // Every rank calls them in the same order with the same count, datatype, op and root. Any device buffer
  // works; in-place where NCCL allows it (recv == send, or send at recv's own rank slot for all_gather and
  // reduce_scatter). Errors of arguments are raised before anything is enqueued (kInvalidArgument naming the
  // argument): null buffers a call uses, and, unless BRAID_CHECK_POINTERS=off, buffers that are not device memory
  // this rank's GPU can use. A device-side failure (a peer that never arrives) is recorded and raised by the next
  // call or by check().
  //
  // Agreement: beyond the LL sizes the algorithm may depend on the buffers (symmetric memory and registered
  // buffers run zero copy). Ranks that choose different kernels for one call (buffers of different kinds,
  // symmetric buffers at unequal offsets, a call in place on some ranks where the one-shot all-reduce runs zero
  // copy) compare their plans at the call's first barrier, or while they wait for a peer that sits in one, and
  // fail on every rank with kMismatch naming both plans (raised by the next call or check(); the communicator is
  // then unusable) instead of exchanging wrong data. Counts, datatypes, ops and roots are part of the plan where
  // a barrier kernel runs on either side. The first use of a registered buffer at an address is such a barrier
  // too (see register_buffer): a buffer registered on some ranks only fails the call with kMismatch on every
  // rank, raised by the call itself on the ranks that registered it. Calls of LL sizes (small ones: the
  // selection table's LL rows, docs/collectives.md) run the same LL kernels whatever the buffers and look up no
  // buffer, so any mix of buffer kinds gives the right answer there. LL kernels compare no plans: ranks that
  // break the rule above at LL sizes (different counts, datatypes, ops or collectives) are not told so; a rank
  // left waiting for lines that never come fails with kTimeout, and results may be wrong, as with NCCL.
  void all_reduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op, Stream stream);
  void reduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op, int root, Stream stream);
  void reduce_scatter(const void* send, void* recv, size_t recv_count, DataType type, ReduceOp op, Stream stream);
  void all_gather(const void* send, void* recv, size_t send_count, DataType type, Stream stream);
  void broadcast(const void* send, void* recv, size_t count, DataType type, int root, Stream stream);

  // ---- All-to-all (stream-ordered, CUDA-graph capturable) ----
  // send holds size() blocks of `count` elements: block q goes to rank q, which receives it as its block
  // rank(). send and recv must not overlap (NCCL's ncclAlltoAll rule). Buffers from comm.alloc() take the zero-copy
  // paths; every rank must then pass its buffers at the same offsets in the same allocations.
  //
  // Data a kernel refuses (below) is not written, the call still completes on every rank, and the communicator
  // stays usable: check(), after the stream has reached the call, raises it once. Collectives do not raise it
  // (a rank throwing at a call's entry would leave its peers waiting in that call). The receiver reports
  // overflow and count mismatches, the sender negative counts.
  void all_to_all(const void* send, void* recv, size_t count, DataType type, Stream stream);
  // MPI_Alltoallv's shape, counts and displacements in elements, host arrays of size() entries: this rank sends
  // send_counts[q] elements at send + send_displs[q] to rank q and receives recv_counts[q] elements from rank q at
  // recv + recv_displs[q]. Null displacements: packed in rank order. recv_counts[rank()] must equal
  // send_counts[rank()] (kInvalidArgument at the call). recv_counts[q] must equal rank q's send_counts[rank()];
  // where it does not, nothing from q is written and check() raises kMismatch naming both counts. send and recv
  // must not overlap.
  void all_to_allv(const void* send, const size_t* send_counts, const size_t* send_displs, void* recv,
                   const size_t* recv_counts, const size_t* recv_displs, DataType type, Stream stream);
  // The same with the send counts in device memory (int64 elements, size() entries; routing decided on the GPU,
  // no host round trip, capturable). send_displs: device array, or null for packed. send must be a device
  // buffer even if every count turns out zero (the host cannot see them), and only its start is checked against
  // recv. What arrives is packed in rank order into recv, which holds recv_capacity elements; the counts received
  // are written to the device array recv_counts[size()] and their offsets to recv_displs[size()] (device, may be
  // null). A total above recv_capacity writes nothing into recv (counts and offsets are still written); a
  // negative send count or displacement sends nothing to that rank (which receives a count of 0): check()
  // raises kInvalidArgument with the figures.
  void all_to_allv_device(const void* send, const int64_t* send_counts, const int64_t* send_displs, void* recv,
                          size_t recv_capacity, int64_t* recv_counts, int64_t* recv_displs, DataType type,
                          Stream stream);

  // ---- Point to point (stream-ordered, CUDA-graph capturable) ----
  // NCCL's group of ncclSend/ncclRecv: every op of the batch is in flight together (a send to q and a receive from
  // q in one batch never deadlock). The k-th send this rank makes to q (counting across batches in call order)
  // matches the k-th receive q makes from this rank; their byte sizes must be equal (a mismatch writes nothing of
  // that pair and check() raises kMismatch). Only the ranks named take part (not collective over the
  // communicator). A send to self must be matched by a receive from self in the same batch, of the same byte size
  // (kInvalidArgument at the call otherwise). Ops of count 0 still take part (the pair exchanges its sizes); a
  // batch of none is a no-op. Errors of arguments name the op ("ops[2].peer") and are raised before anything is
  // enqueued. As with NCCL, batches that depend on each other across ranks (a send in one batch waiting for a
  // receive the peer makes only in a later batch) may deadlock once a message outgrows the FIFOs.
  void send(const void* buffer, size_t count, DataType type, int peer, Stream stream);  // a batch of one
  void recv(void* buffer, size_t count, DataType type, int peer, Stream stream);        // a batch of one
  void send_recv(const PointToPoint* ops, size_t count, Stream stream);

  // ---- User buffers (zero copy without symmetric allocation) ----
  // Registers [pointer, pointer + bytes) of this rank's GPU: local and cheap (nothing is exchanged). The first
  // collective that passes a registered buffer at a given address exchanges mappings with the peers (collective:
  // every rank must pass registered buffers there, registered and deregistered in step, as with
  // ncclCommRegister) and caches them; later calls with that address make no host exchange and move data
  // straight between the users' buffers. A rank that passes another kind of buffer to that first call, or
  // whose mappings for the address are cached from an earlier registration, makes the call fail on every rank
  // with kMismatch (the ranks meet at a barrier before the exchange; the first use waits for the
  // communicator's earlier calls to finish on the GPU). A buffer inside a registered range hits it. cudaMalloc
  // memory (legacy CUDA IPC) and VMM memory made with POSIX-fd handles work, sub-ranges too. Refused naming the
  // argument: null, zero length, a range past its allocation's end, host or managed memory, another GPU's memory
  // (kInvalidArgument); memory that cannot be shared (kUnsupported). Thread-safe.
  RegisteredBuffer register_buffer(void* pointer, size_t bytes);
  // Deregisters (also done when the last copy of the handle goes, and allowed after the communicator is
  // destroyed): forgets the cached mappings and unmaps the peers' memory no other registration uses, after
  // this GPU's work completes. Enqueued collectives that use the buffer must have completed on every rank.
  void deregister(RegisteredBuffer& buffer);
  RegistrationStats registration_stats();

  // ---- Exported memory of every rank (one-sided) ----
  // Collective: gathers every rank's exported range and maps the peers' here (fds travel over this host's
  // sockets, so VMM memory needs no further permission). The result outlives the communicator.
  GlobalMemory import_global(const ExportedHandle& mine);
  // One-sided copies into or out of rank `peer`'s range at byte `offset` (copy engines, stream-ordered; the
  // caller orders them against the peer's use, e.g. with barrier() or a collective).
  void put(const GlobalMemory& memory, int peer, size_t offset, const void* source, size_t bytes, Stream stream);
  void get(const GlobalMemory& memory, int peer, size_t offset, void* destination, size_t bytes, Stream stream);
  // All-to-all reading the peers' send ranges one-sided: after an entry barrier every rank pulls block rank()
  // of each peer's range (count elements a block) into recv with copy engines (SM loads where a peer's range is
  // another GPU's cudaMalloc memory of this process), then an exit barrier. Every range must hold
  // size() * count elements.
  void all_to_all(const GlobalMemory& send, void* recv, size_t count, DataType type, Stream stream);

  // Raises (braid::Error) a failure that a collective's kernel recorded: a wait that timed out (kTimeout, naming
  // the collective, the wait and the peer; the communicator is then unusable), or bad data a kernel refused
  // (kMismatch, kInvalidArgument: raised once, the communicator stays usable). Does not synchronise: it sees
  // what has completed so far.
  void check();

 private:
  friend class MoeBuffer;  // builds on the communicator's collective context (signal pad, error words)
  friend struct detail::TestAccess;  // the tests' hooks into the state (src/comm/test_hooks.hpp), not installed
  explicit Communicator(std::shared_ptr<detail::CommState> state);
  // The collective context of a CUDA-backend communicator, shared with it (an NCCL-backend one is refused with
  // kUnsupported naming `function`): what MoeBuffer builds on. Private: braid's own code only.
  std::shared_ptr<collectives::CollectiveContext> cuda_context(const char* function) const;
  std::shared_ptr<detail::CommState> state_;
};

// One symmetric allocation: the same size on every rank, every rank's copy mapped here.
class SymmetricMemory {
 public:
  SymmetricMemory() = default;  // empty
  explicit operator bool() const { return impl_ != nullptr; }

  size_t bytes() const;
  int world_size() const;
  int rank() const;
  void* local() const;
  void* peer(int rank) const;           // this process's mapping of rank's copy (local() for own rank)
  void* const* peers() const;           // host array [world]
  void* const* device_peers() const;    // device array [world], for kernels
  void* view() const;                   // contiguous view, or nullptr when not asked for
  size_t view_stride() const;           // bytes between consecutive ranks in view()

  // Unmaps and releases this rank's mappings (local; peers keep theirs). Also done by the destructor
  // of the last copy. Safe after the communicator is destroyed.
  void reset();

 private:
  friend class Communicator;
  explicit SymmetricMemory(std::shared_ptr<detail::SymmetricAllocation> impl);
  std::shared_ptr<detail::SymmetricAllocation> impl_;
};

// A user buffer registered with one communicator (Communicator::register_buffer). Copies share the
// registration; the last copy's destruction, reset() of it, or Communicator::deregister releases it.
class RegisteredBuffer {
 public:
  RegisteredBuffer() = default;
  explicit operator bool() const { return impl_ != nullptr; }
  void* data() const;
  size_t bytes() const;
  void reset() { impl_.reset(); }

 private:
  friend class Communicator;
  std::shared_ptr<detail::Registration> impl_;
};

// Device memory of this process described for other processes of this host: blob() is an opaque, versioned byte
// string that import_handle() maps elsewhere. It stays importable while this handle (or a copy) lives: for VMM
// memory the handle keeps the file descriptor importers take (with pidfd_getfd, which needs ptrace permission
// over this process: same user, Yama ptrace_scope ≤ 1 with a parent/child relation, or 0).
class ExportedHandle {
 public:
  ExportedHandle() = default;
  explicit operator bool() const { return impl_ != nullptr; }
  const std::string& blob() const;
  void* data() const;
  size_t bytes() const;
  void reset() { impl_.reset(); }

 private:
  friend ExportedHandle export_handle(const void* pointer, size_t bytes, int device);
  friend class Communicator;
  std::shared_ptr<detail::ExportedRange> impl_;
};

// Exports [pointer, pointer + bytes) of device `device` (-1: the current device). Refused as register_buffer
// refuses.
ExportedHandle export_handle(const void* pointer, size_t bytes, int device = -1);

// Another process's exported range, mapped here. Stays mapped while a copy lives.
class ImportedMemory {
 public:
  ImportedMemory() = default;
  explicit operator bool() const { return mapping_ != nullptr; }
  void* data() const;                 // the range here
  size_t bytes() const;
  uint64_t exporter_address() const;  // where the range lies in the exporter's address space
  int exporter_pid() const;
  void reset() { mapping_.reset(); }

 private:
  friend ImportedMemory import_handle(const std::string& blob, int device);
  friend class GlobalMemory;
  std::shared_ptr<detail::PeerMapping> mapping_;
};

// Maps an export_handle() blob of another process of this host on `device` (-1: the current device). Refused
// (kInvalidArgument naming 'blob'): empty, truncated, damaged, another format version, another host or boot.
ImportedMemory import_handle(const std::string& blob, int device = -1);

// Every rank's exported range, mapped here (Communicator::import_global).
class GlobalMemory {
 public:
  GlobalMemory() = default;
  explicit operator bool() const { return !peers_.empty(); }
  int world_size() const { return static_cast<int>(peers_.size()); }
  int rank() const { return rank_; }
  void* peer(int rank) const;        // rank's range here (own rank: the exported buffer itself)
  size_t bytes(int rank) const;      // rank's range length
  void* const* peers() const { return peers_.data(); }

 private:
  friend class Communicator;
  int rank_ = -1;
  std::vector<void*> peers_;
  std::vector<size_t> bytes_;
  ExportedHandle own_;
  std::vector<std::shared_ptr<detail::PeerMapping>> mappings_;
};

}  // namespace braid
