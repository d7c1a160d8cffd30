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
#include "braid/memory.hpp"
#include "braid/moe.hpp"
#include "braid/rendezvous.hpp"
#include "braid/types.hpp"

namespace braid {

namespace detail {
struct CommState;
struct TestAccess;
}  // namespace detail
namespace collectives {
struct CollectiveContext;
}  // namespace collectives

struct CommOptions {
  int device = -1;         // CUDA device ordinal; negative: BRAID_DEVICE, else the local rank (the rank where the
                           // rendezvous has no local rank; modulo the visible GPUs with BRAID_ALLOW_SHARED_GPU=1)
  double timeout_s = 0.0;  // bound on every wait for a peer, in [0.001, 1e6] s; 0: BRAID_TIMEOUT_S (other values:
                           // init fails with kInvalidArgument naming options.timeout_s). On the NCCL backend its
                           // watchdog bounds eager calls only: graph replays of NCCL's calls, and every call with
                           // BRAID_NCCL_WATCHDOG=off, wait unbounded, as NCCL's own do.
  std::string algorithms;  // algorithm overrides in BRAID_ALGO's syntax ("allreduce=ll,..."); empty: BRAID_ALGO
  int max_blocks = 0;      // cap, 1..64, on the thread blocks of every collective and send/recv launch (the SMs
                           // braid's kernels may take beside the caller's); 0: BRAID_MAX_BLOCKS, else no cap.
                           // Not capped: send/recv pairs of at most 256 KiB moved as LL128 lines (up to 8
                           // blocks a pair and direction).
                           // The CUDA backend's kernels only: the NCCL backend does not pass it to NCCL
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
  // A peer on this rank's own GPU (this rank itself, or another with BRAID_ALLOW_SHARED_GPU=1): p2p and
  // native_atomics true, performance_rank 0.
  bool p2p = false;        // this rank's GPU can map the peer's memory (cudaDeviceCanAccessPeer)
  bool native_atomics = false;  // P2P atomics are native (NVLink); false for PCIe peers
  int performance_rank = -1;    // cudaDevP2PAttrPerformanceRank (lower is faster); -1 when not P2P
};

class MoeBuffer;
class FusedMatmul;

// A group of ranks, one GPU each, on one host. Movable, not copyable; symmetric memory made from it
// stays valid after it is destroyed (teardown in any order).
//
// Ordering (NCCL's rule): a communicator's calls that take a stream (collectives, all-to-all(v), send/recv, put/get,
// MoE dispatch and combine) run on the GPU in the order they were made, whatever stream each names: a call's work
// starts after the previous call's work is done, and work the caller enqueues on a call's stream after it still follows
// it. An event is recorded after each call; a call waits on it when it names another stream than the previous call, and
// every eager call does once a graph holding this communicator's calls has been captured (calls on one stream, with no
// such graph, add no wait). Inside a CUDA graph capture the captured calls are ordered the same way, and every replay
// of the graph runs after the communicator's calls made before it was launched and before the calls made after it was
// launched. A communicator is driven by one host thread at a time. The CUDA backend's kernels (collectives,
// all-to-all(v), send/recv, MoE) are programmatic dependent launches that let the next kernel on the stream be
// scheduled before they end: a kernel of yours launched with programmatic stream serialization
// (cudaLaunchAttributeProgrammaticStreamSerialization) right after such a call must call
// cudaGridDependencySynchronize() before it touches the call's buffers, as CUDA asks of any kernel launched so; other
// work on the stream starts after the call's work is done.
class Communicator {
 public:
  // Collective over the ranks of `rendezvous`: at most 16 ranks (more fail with kUnsupported, whatever the backend).
  // Backend: CUDA (symmetric memory) where every rank is on one host with every pair P2P-reachable; otherwise, or when
  // asked (options.backend, BRAID_BACKEND), NCCL, loaded at run time (BRAID_NCCL_LIBRARY), which serves the
  // collectives, all_to_all and all_to_allv (host counts), send/recv/send_recv, and register_buffer (the buffer is
  // registered with NCCL on its first use, see BRAID_NCCL_REGISTER); symmetric memory, MoE, all_to_allv_device,
  // import_global and all_to_all on GlobalMemory need the CUDA backend (kUnsupported). The CUDA backend needs every
  // GPU to offer virtual memory management with POSIX-fd handles: a GPU without them fails init on every rank with
  // kUnsupported naming its rank (no fallback to NCCL). Refuses two ranks on one GPU of a job on one host
  // (kInvalidArgument; a job over several hosts runs on NCCL, whose own check applies) unless
  // BRAID_ALLOW_SHARED_GPU=1 (see docs/shared-gpu.md; every rank of a communicator where some ranks share a GPU as
  // threads of one process, and so its context, then refuses the legacy default stream, nullptr or
  // cudaStreamLegacy, in every call that takes a stream, whatever its sizes: kInvalidArgument naming stream and the
  // call; ranks sharing a GPU as processes of their own take it) and, with backend "cuda", ranks it cannot serve
  // (kPeerUnreachable). The ranks meet at the rendezvous' store, proving BRAID_JOB_SECRET where it is set (braid-run
  // sets one): a store that refuses this rank, or that does not know the secret, fails init with kRemoteError.
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
  // A first line for this rank (rank, size, GPU and its PCI bus id), then a line per other rank: host, GPU, P2P,
  // native atomics, performance rank.
  std::string describe() const;
  // "cuda" (symmetric memory between the GPUs of one host) or "nccl" (see init).
  const char* backend() const;
  // Whether NVLink multicast serves all-reduce, reduce and all-gather: only with BRAID_ENABLE_MULTICAST=1 and
  // every rank's GPU able (docs/multicast.md); false everywhere else.
  bool uses_multicast() const;
  // The NCCL backend's ncclComm_t (for programs that also call NCCL on the same ranks); null on the CUDA backend.
  void* nccl_communicator() const;

  // Collective: every rank asks for the same number of bytes, in the same order (kMismatch otherwise).
  // bytes > 0: a rank asking for 0 raises kInvalidArgument naming bytes, once the ranks have exchanged their sizes,
  // so its peers raise kMismatch at once. The memory is zeroed.
  SymmetricMemory alloc(size_t bytes, const AllocOptions& options = {});

  // Host-side barrier over the store (setup and tests; collectives never use it).
  void barrier();
  // Host-side allgather of small byte strings over the store (e.g. to share an NCCL unique id); collective.
  std::vector<std::string> host_allgather(const std::string& mine);

  // ---- Collectives (stream-ordered, CUDA-graph capturable; NCCL's argument order) ----
  // Every rank calls them in the same order with the same count, datatype, op and root. Any buffer of this rank's
  // GPU works. In place as NCCL takes it: recv == send (all_reduce; reduce and broadcast on the root); recv == send
  // + rank() * recv_count elements (reduce_scatter: the output is this rank's block of the input); send == recv +
  // rank() * send_count elements (all_gather: the input is this rank's block of the output). Buffers that overlap in
  // any other way are refused (kInvalidArgument naming recv) on a rank whose call uses both (not on a non-root of
  // reduce or broadcast). reduce reads send on every rank and writes recv on the
  // root only: a non-root's recv is never written and may be null. broadcast reads send on the root only (a non-root's
  // may be null) and writes recv on every rank. A count of 0 moves nothing: after the checks of the datatype, op and
  // root the call returns without enqueuing or waiting for anything, and its buffers may be null. ReduceOp::kAvg is the
  // sum divided by size() once, at the end (types.hpp: reduction_supported). Half, bfloat16 and fp8 accumulate in
  // float32 and round once, except beyond 2 ranks in reduce's chain, reduce-scatter's copy-engine pairs and
  // all-reduce's (BRAID_ALGO=allreduce=copyengine), which round a partial result to the datatype after each peer, as
  // NCCL's ring does (docs/collectives.md says where the table takes them). On the NCCL backend NCCL computes the
  // reductions, with its own rounding and its own avg. Errors of arguments are raised before anything is enqueued
  // (kInvalidArgument naming the argument): null buffers a call uses, and, unless BRAID_CHECK_POINTERS=off, buffers
  // that are neither device memory of this rank's GPU nor managed memory (host memory, and another GPU's memory even
  // where peer access would let this GPU use it). A device-side failure (a peer that never arrives) is recorded and
  // raised by every later call that takes a stream and by check() (see check()).
  //
  // Agreement: beyond the LL sizes the algorithm may depend on the buffers (symmetric memory and registered
  // buffers run zero copy). Ranks that choose different kernels for one call (buffers of different kinds,
  // symmetric buffers at unequal offsets, an all-to-all in place on some ranks only, which runs staged or swaps
  // there (except an eager one that announces its buffers, see register_buffer: it runs one kernel on every rank), an
  // all-reduce beyond 64 MiB on 2 ranks in place on one rank only, whose copy engines there first push as
  // chunk pairs into the peer's pipeline area where the other pushes into the peer's output, a reduce-scatter on
  // 2 ranks beyond 64 MiB, or beyond 128 MiB where every peer maps the
  // input (symmetric or registered, whole 16-byte rank blocks), in place on one rank only, which takes the copy-engine pairs where the other pushes into its peer's mapped output)
  // compare their plans at the call's first barrier, or while they wait for a peer that sits in one, and fail
  // on every rank with kMismatch naming both plans (raised by the next call or check(); the communicator is
  // then unusable) instead of exchanging wrong data. The copy engines' copies of a plan that pushes into the peers'
  // buffers (the copy-engine rows on buffers every peer maps: symmetric memory, or registered buffers of other
  // processes) are enqueued behind that barrier and run even where it fails: a rank on such a plan writes its data
  // into each peer's memory where its plan placed the peer's buffer (for symmetric memory, the peer's allocation at
  // this rank's offset), whatever that peer passed. After such a kMismatch, treat the peers' symmetric memory and
  // registered buffers as overwritten. Counts, datatypes, ops and roots are part of the plan where
  // a barrier kernel runs on either side. The first use of a registered buffer at an address is such a barrier
  // too (see register_buffer): a buffer registered on some ranks only fails the call with kMismatch on every
  // rank, raised by the call itself on the ranks that registered it. Calls of LL sizes (small ones: the
  // selection table's LL and LL128 rows, docs/collectives.md) and reduce at every size (no reduce kernel reads or
  // writes a peer's input or output) run the same kernels whatever the buffers and look up no buffer, so any
  // mix of buffer kinds gives the right answer there. LL and LL128 calls send their plan to every peer and
  // compare, and answer a peer that announces another plan at a barrier: ranks that break the rule above at LL
  // sizes (different counts, datatypes, ops or collectives) fail on every rank with kMismatch too, unless one
  // side runs a pipelined (FIFO) kernel, which compares no plan with an LL call: there a rank left waiting fails
  // with kTimeout. Where every rank runs a pipelined kernel other than all-to-all(v) and send/recv (whose pieces
  // carry their sizes), no plan is compared: different ops, or datatypes of one size, give wrong data and no
  // error, and different counts end in kTimeout on the rank left waiting, as in NCCL.
  void all_reduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op, Stream stream);
  void reduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op, int root, Stream stream);
  void reduce_scatter(const void* send, void* recv, size_t recv_count, DataType type, ReduceOp op, Stream stream);
  void all_gather(const void* send, void* recv, size_t send_count, DataType type, Stream stream);
  void broadcast(const void* send, void* recv, size_t count, DataType type, int root, Stream stream);

  // ---- All-to-all (stream-ordered, CUDA-graph capturable) ----
  // send holds size() blocks of `count` elements: block q goes to rank q, which receives it as its block
  // rank(). In place when recv == send (every block is replaced by the one its rank sent here; the NCCL backend
  // hands NCCL a copy of the input made on `stream`, with memory from the stream's pool, since NCCL's own
  // all-to-all in place races); a recv that overlaps send without being it is kInvalidArgument. Out of place and
  // beyond the LL sizes, a call whose send and recv are each from comm.alloc() or a registered buffer
  // (register_buffer) takes the zero-copy paths; every rank must then pass buffers of the same kinds, symmetric
  // ones at the same offsets in the same allocations. In place the call runs the staged paths (announcing kernels
  // under BRAID_EAGER_ZERO_COPY swap blocks in pairs, see register_buffer), except on 2 ranks where the copy
  // engines serve it (beyond 64 MiB, or at any size where BRAID_ALGO names them) on buffers every peer maps (see
  // register_buffer; not registered cudaMalloc memory of ranks that are threads): there the engines swap the two
  // blocks that change places: where a block fits in the pipeline area (BRAID_PIPELINE_BYTES), each rank pushes its
  // block into the peer's area and copies the peer's out of its own; otherwise each rank swaps half of them through
  // its own area. So a call in place on some ranks
  // only fails with kMismatch where the others run zero copy, or, on buffers no peer maps, move their blocks through the copy
  // engines (2 ranks beyond 64 MiB, 3 or 4 ranks beyond 32 MiB; see Agreement above).
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
  // where it does not, nothing from q is written and the receiving rank's check() raises kMismatch naming both
  // counts (the NCCL backend does not detect it: as with NCCL, the result is then undefined). send and recv must
  // not overlap: the range from send to the furthest end of its non-empty blocks and the one from recv to the
  // furthest end of its non-empty blocks are disjoint (kInvalidArgument naming recv; all_to_allv is never in place).
  void all_to_allv(const void* send, const size_t* send_counts, const size_t* send_displs, void* recv,
                   const size_t* recv_counts, const size_t* recv_displs, DataType type, Stream stream);
  // The same with the send counts in device memory (int64 elements, size() entries; routing decided on the GPU,
  // no host round trip, capturable). send_displs: device array, or null for packed. send must be a device
  // buffer even if every count turns out zero (the host cannot see them), and only its start is checked against
  // recv. What arrives is packed in rank order into recv, which holds recv_capacity elements; the counts received
  // are written to the device array recv_counts[size()] and their offsets to recv_displs[size()] (device, may be
  // null). A total above recv_capacity (a total past 64 bits of bytes included) writes nothing into recv (counts
  // and offsets are still written); a send count or displacement that is negative, or whose bytes (a
  // displacement's with its count) 64 bits do not hold, sends nothing to that rank (which receives a count of 0):
  // check() raises kInvalidArgument with the figures.
  void all_to_allv_device(const void* send, const int64_t* send_counts, const int64_t* send_displs, void* recv,
                          size_t recv_capacity, int64_t* recv_counts, int64_t* recv_displs, DataType type,
                          Stream stream);

  // ---- Point to point (stream-ordered, CUDA-graph capturable) ----
  // NCCL's group of ncclSend/ncclRecv: every op of the batch is in flight together (a send to q and a receive from
  // q in one batch never deadlock). The k-th send this rank makes to q (counting across batches in call order)
  // matches the k-th receive q makes from this rank; their byte sizes must be equal (a mismatch writes nothing of
  // that pair and the receiving rank's check() raises kMismatch; the NCCL backend does not detect it; above 64 MiB, where a pair moves in chunks through the copy engines
  // (32 MiB on 2 ranks with the default BRAID_PIPELINE_BYTES), sizes whose chunk counts differ also leave the
  // longer side waiting until it fails with kTimeout, and the communicator is unusable, and so do sizes on both
  // sides of 64 MiB (each side picks chunks or FIFOs from its own size); on NVLink hosts a pair of at
  // most 256 KiB moves as one message of LL128 lines, so sizes on both sides of 256 KiB leave the receiver waiting
  // until it fails with kTimeout too). Only the ranks named take part (not collective over the
  // communicator). A send to self must be matched by a receive from self in the same batch, of the same byte size
  // (kInvalidArgument at the call otherwise). Ops of count 0 still take part (the pair exchanges its sizes); a
  // batch of none is a no-op. Errors of arguments name the op in send_recv ("ops[2].peer"; "ops" where the sends
  // to self and receives from self do not pair up) and the parameter in send and recv ("peer"), and are raised
  // before anything is enqueued. As with NCCL, batches that depend on each other across ranks (a send in one batch waiting for a
  // receive the peer makes only in a later batch) may deadlock once a message outgrows the FIFOs, or once a third
  // message in lines to one peer waits for the first to be received.
  void send(const void* buffer, size_t count, DataType type, int peer, Stream stream);  // a batch of one
  void recv(void* buffer, size_t count, DataType type, int peer, Stream stream);        // a batch of one
  // `op_count` ops at `ops` (each op's count is in elements); ops may be null when op_count is 0.
  void send_recv(const PointToPoint* ops, size_t op_count, Stream stream);

  // ---- User buffers (zero copy without symmetric allocation) ----
  // Registers [pointer, pointer + bytes) of this rank's GPU: local and cheap (nothing is exchanged). The first
  // collective that passes a registered buffer at a given address (beyond the calls that look up no buffer: see
  // Agreement above) exchanges mappings with the peers (collective: every rank must pass registered buffers there,
  // registered and deregistered in step, as with ncclCommRegister) and caches them; later calls with that address
  // make no host exchange and move data straight between the users' buffers. A rank that passes another kind of
  // buffer to that first call, or whose mappings for the address are cached from an earlier registration, makes the
  // call fail on every rank with kMismatch (the ranks meet at a barrier before the exchange; the first use waits for
  // the communicator's earlier calls to finish on the GPU). A buffer inside a registered range hits it. cudaMalloc
  // memory (legacy CUDA IPC) and VMM memory made with POSIX-fd handles work, sub-ranges too. Refused naming the
  // argument: null, zero length, a range past its allocation's end, host or managed memory, another GPU's memory
  // (kInvalidArgument); memory that cannot be shared, cudaMallocAsync memory of any pool among it (kUnsupported).
  // Thread-safe.
  //
  // Automatic registration (on unless BRAID_AUTO_REGISTER=0): in a call captured into a CUDA graph, beyond the LL
  // sizes, a buffer the call's zero-copy paths would use (docs/registration.md lists them per collective; reduce
  // uses none) that is neither symmetric nor registered on this rank has the peers' buffers mapped at capture time
  // without register_buffer. Every rank runs one barrier announcing the exchange and one host exchange of the
  // buffer's allocation (identified by its CUDA buffer id, so memory freed and allocated again at an address is
  // mapped anew); the replays then take the paths of registered buffers, with no host call. The graph holds the
  // peers' mappings until it (and every executable graph made from it) is destroyed. A rank whose memory cannot be
  // shared (neither cudaMalloc memory nor VMM memory with POSIX-fd handles: managed memory, cudaMallocAsync
  // memory of any pool, whatever its handle types; a range across two VMM allocations; host memory where
  // BRAID_CHECK_POINTERS=off, which otherwise refuses it) makes that call staged on every rank. A rank that passes a symmetric or registered buffer to that call, or runs
  // it eagerly, makes it fail on every rank with kMismatch. Eager calls of unregistered buffers are staged and
  // exchange nothing (but see BRAID_EAGER_ZERO_COPY below for buffers of VMM memory).
  //
  // Freeing: the peers map a cudaMalloc buffer through CUDA IPC, and CUDA leaves a cudaFree of memory that
  // another process still has open undefined. So free a registered cudaMalloc buffer only after every rank has
  // deregistered it, and a cudaMalloc buffer of an automatically registered call only after every rank has
  // destroyed the graphs that use it (PyTorch keeps a captured graph's memory pool until then). VMM memory has no
  // such rule: a peer's mapping keeps the allocation alive. But deregister any buffer before other memory is
  // mapped or allocated at its address: a registration does not notice that, and calls would move the bytes of
  // the peers' old mappings.
  //
  // With BRAID_EAGER_ZERO_COPY=1 (every rank alike; the CUDA backend, more than one rank), registering also
  // exposes the range: each peer's helper thread maps it (VMM memory with POSIX-fd handles; cudaMalloc memory only
  // where the ranks are threads of one process; where the ranks are processes, the peer takes the allocation's fd
  // with pidfd_getfd, which needs ptrace permission over the owner: the same user, and Yama's ptrace_scope 0 or
  // CAP_SYS_PTRACE; a peer without it does not map the range, which stays unexposed, logged at info) and answers, and the call returns once every peer answered or
  // the timeout passed (where a peer did not answer, the exposure is then withdrawn from every peer, which may
  // wait the timeout once more: up to twice the timeout in all; a range some peer did not map stays registered,
  // unexposed; after abort() it raises
  // kAborted, and after a revocation or a peer's exit that fatal failure, registering nothing). Eager all_gather,
  // reduce_scatter, all_reduce and all_to_all calls whose buffers are not symmetric memory then announce at their
  // entry barrier where their buffers lie (all_gather its output, reduce_scatter its input, all_reduce and
  // all_to_all both) instead of exchanging them, at the sizes where that pays (all_gather from 8 MiB of output,
  // reduce_scatter 16 to 256 MiB of input, all_reduce 8 to 128 MiB, all_to_all 4 to 128 MiB of output): zero
  // copy where every rank's are exposed and 16-byte aligned, staged otherwise (an all_to_all runs zero copy where
  // every rank's output is exposed and no rank runs in place, or where some rank runs in place and every rank's
  // input and output are exposed). Other sizes, and a reduce_scatter whose rank blocks are not multiples of 16
  // bytes, take the staged paths without announcing. Where every rank is a process of its own, an eager all_gather
  // whose output, reduce_scatter whose input or output, or all_reduce or all_to_all whose input and output are
  // 256 MiB or more first gathers every rank's announcement of each such buffer on the host, through memory the
  // ranks' processes share (the calling thread waits until every peer's has reached the same call, within the
  // timeout; kMismatch where the ranks' calls differ), and takes the paths of buffers every peer maps (as for
  // symmetric buffers: the copy engines where the table takes them, for an all_reduce or an all_to_all of 2 ranks
  // in place too) where every rank's buffer is exposed and every rank runs in place or none
  // does, as above otherwise. No eager call then exchanges a registered buffer's mappings
  // (eager calls of the other collectives, and of these four at other sizes, stage registered buffers), so ranks
  // need not register alike and no eager call fails with kMismatch for it; captured calls are unchanged
  // (docs/registration.md). A buffer of 4 MiB or more that such a call announces, that no exposed registration
  // holds (a registration some peer could not map counts as none), but that whole VMM allocations with POSIX-fd
  // handles back (one, or several mapped side by side as PyTorch's expandable segments grow) is exposed at that
  // first use as registering would; each later use first checks that its allocations still lie where they were
  // found, and where not withdraws the old exposure (after this rank's calls end; kTimeout where they do not within
  // the timeout) and exposes the buffer anew. A buffer some peer could not map stays staged and is remembered, not
  // offered again, while its allocations lie where they were. Memory unmapped while exposed or remembered stays
  // allocated until that check, this rank's next such exposure, or the communicator's destruction. At most 1024
  // such buffers, exposed or remembered, live at once on a communicator; beyond that such buffers stay staged.
  RegisteredBuffer register_buffer(void* pointer, size_t bytes);
  // Deregisters `buffer`, which this communicator registered (kInvalidArgument naming buffer where it is empty or
  // another communicator's; kInvalidArgument too on a moved-from communicator: after the communicator is gone,
  // the last copy's destruction or reset() releases a registration): forgets the cached mappings and unmaps the
  // peers' memory no other registration uses; where it unmaps a peer's allocation it first waits for all of this
  // GPU's work (cudaDeviceSynchronize), and otherwise waits for nothing on the GPU. Enqueued collectives that use the buffer must have completed on every rank.
  // An exposed range (BRAID_EAGER_ZERO_COPY=1) is first withdrawn: this waits until this rank's calls of the
  // communicator have ended on the GPU, then until every peer has unmapped it; kTimeout where either takes longer
  // than the timeout, kAborted after abort(), the fatal failure after a revocation or a peer's exit (the
  // registration is gone all the same in each case). Then the memory may be freed; where it raised, a peer may
  // still have the range mapped, so free cudaMalloc memory only once the communicator is destroyed.
  void deregister(RegisteredBuffer& buffer);
  RegistrationStats registration_stats();

  // ---- Exported memory of every rank (one-sided) ----
  // Collective: gathers every rank's exported range and maps the peers' here (fds travel over this host's
  // sockets, so VMM memory needs no further permission). The result outlives the communicator. CUDA backend only
  // (kUnsupported). `mine` must be this process's export of this rank's GPU: an empty or foreign one is refused
  // (kInvalidArgument naming mine) after the ranks exchange their exports, so every rank fails at once (the
  // others kMismatch naming that rank). A peer's blob this rank cannot map fails this rank alone.
  GlobalMemory import_global(const ExportedHandle& mine);
  // One-sided copies into or out of rank `peer`'s range at byte `offset` (copy engines, stream-ordered; the
  // caller orders them against the peer's use, e.g. with barrier() or a collective). kInvalidArgument naming
  // memory (empty), peer (out of [0, memory.world_size())), offset (past the range's end) or bytes (offset + bytes
  // past it), then source (destination) where it is null. bytes 0: after the checks of memory, peer and offset,
  // the call returns without enqueuing or waiting for anything (as a collective of count 0), and source
  // (destination) may be null.
  void put(const GlobalMemory& memory, int peer, size_t offset, const void* source, size_t bytes, Stream stream);
  void get(const GlobalMemory& memory, int peer, size_t offset, void* destination, size_t bytes, Stream stream);
  // All-to-all reading the peers' send ranges one-sided: after an entry barrier every rank pulls block rank()
  // of each peer's range (count elements a block) into recv with copy engines where the table takes the copy
  // engines (SM loads below that size, and at every size where a peer's range is another rank's cudaMalloc
  // memory of this process, ranks as threads), then an exit barrier; BRAID_ALGO's "alltoall=" steers it. Every
  // range must hold size() * count elements (kInvalidArgument naming send, as for send not of this
  // communicator's import_global); recv must not overlap this rank's own range, which the peers read
  // (kInvalidArgument naming recv). count 0: after the checks of type and send, the call returns without
  // enqueuing or waiting for anything, and recv may be null.
  void all_to_all(const GlobalMemory& send, void* recv, size_t count, DataType type, Stream stream);

  // Raises (braid::Error) a failure that a kernel recorded. Two kinds, kept apart:
  //   - fatal: a wait that timed out (kTimeout, naming the collective, the wait and the peer), ranks that
  //     disagreed on a call's plan (kMismatch naming both plans), a peer on this host whose process exited without
  //     destroying its communicator (kRemoteError naming the rank and its pid; noticed within milliseconds, CUDA
  //     backend), abort() (kAborted) or revoke() on any rank (kRevoked). The communicator is then unusable; check()
  //     and every later call that takes a stream (those listed under Ordering above) raise it again, each time.
  //     On the CUDA backend a peer's exit and a revocation also end this rank's host waits (see revoke()).
  //   - refused data (kMismatch, kInvalidArgument; a count mismatch, an overflow, a bad expert id...): the
  //     communicator stays usable; check() raises it once and clears it. Only the first refusal is kept until
  //     then; later ones are dropped.
  // With both pending, the fatal one is raised (the refused data is not reported). Calls raise only the fatal
  // kind at their entry. Does not synchronise: it sees what has completed so far.
  void check();

  // Aborts this rank's use of the communicator, from any thread, also while another thread is inside one of its
  // calls or its kernels run: every wait of those kernels ends (within microseconds once the GPU runs them), a
  // host wait on the store (barrier, host_allgather, a buffer's first exchange, a registration's exposure or
  // withdrawal) or on a peer's fd (symmetric memory across processes) ends with kAborted (the fd wait within
  // 20 ms), and check()
  // and every later call that takes a stream raise kAborted (unless another fatal failure came first).
  // Local: the peers are not told (their waits on this rank end at their timeout, or when they abort too; a kernel
  // of this rank queued before the abort answers a peer's barrier with its stopped plan: kMismatch there), and
  // their kernels may still write into this rank's memory, which stays mapped until the communicator and its
  // allocations are destroyed. On the NCCL backend it calls ncclCommAbort once the calls into NCCL that other
  // threads are making have returned, waiting at most 2 s for them (a call still inside NCCL then, blocked on a
  // peer, is aborted under, which ends its wait with an error). Then destroy the communicator. Idempotent; never
  // throws.
  void abort() noexcept;

  // Revokes the communicator for every rank, from any rank and any thread (MPI's MPI_Comm_revoke): within about
  // 10 ms every rank's waits on the GPU end, and check() and every later call that takes a stream raise kRevoked on
  // every rank (a rank where another fatal failure came first raises that one). In the same 10 ms every rank's
  // host waits end too, now and later, with the error its calls raise: waits on the store (barrier,
  // host_allgather, alloc, a buffer's first exchange, a registration's exposure or withdrawal) and on a peer's fd
  // (within 20 ms more when receiving one, 50 ms when sending one). A peer's process exit ends them the same way
  // (kRemoteError); abort() after either makes them raise kAborted.
  // For the survivors of a failure to agree that the communicator is over before they make a new one (shrink()
  // still works: it makes its own store connection). Works after a fatal failure too. CUDA backend only:
  // kUnsupported on the NCCL backend (abort every rank there).
  void revoke();

  // A new communicator of the ranks not in `excluded`, made by them alone (the excluded ranks do not call it; dead
  // ones cannot): collective over the survivors, which pass the same list in the same order of their shrink calls.
  // Ranks keep their order (a survivor's new rank counts the survivors below it), their GPUs and this
  // communicator's options; it runs on a backend chosen as at init. Works on a failed, aborted or revoked
  // communicator (it uses only its store), so survivors revoke, then shrink. The store must still serve: where the
  // process that served it has exited or destroyed every communicator that served it, init fails with the store's
  // error after the timeout (an excluded rank that still serves it leaves the shrink working). This communicator, and
  // its symmetric memory, stay as they are until destroyed. kInvalidArgument naming `excluded` for a rank out of
  // range, a repeat, or this rank itself.
  Communicator shrink(const std::vector<int>& excluded) const;

 private:
  friend class MoeBuffer;  // builds on the communicator's collective context (signal pad, error words)
  friend class FusedMatmul;  // keeps a handle of its own on the communicator's state
  friend struct detail::TestAccess;  // the tests' hooks into the state (not installed)
  explicit Communicator(std::shared_ptr<detail::CommState> state);
  // The collective context of a CUDA-backend communicator, shared with it (an NCCL-backend one is refused with
  // kUnsupported naming `function`): what MoeBuffer builds on. Private: braid's own code only.
  std::shared_ptr<collectives::CollectiveContext> cuda_context(const char* function) const;
  std::shared_ptr<detail::CommState> state_;
};

}  // namespace braid
