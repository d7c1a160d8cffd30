// braid — the GEMMs of tensor-parallel layers fused with their collective, the communication hidden under the GEMM:
//
//   braid::FusedMatmul fused = braid::FusedMatmul::create(comm);
//   fused.all_gather_matmul(x_shard, rows, k, w, braid::Layout::kTransposed, n, y, nullptr, type, stream);
//   fused.matmul_reduce_scatter(h, m, k, w2, braid::Layout::kTransposed, n, y_shard, type, ReduceOp::kSum, stream);
//
// The GEMMs run through cuBLASLt, loaded at run time (BRAID_CUBLASLT_LIBRARY, else libcublasLt.so.13): libbraid never
// links it. On GPUs of compute capability 9.0 (H100, H200) a GEMM may instead run on braid's own Hopper GEMM kernel,
// where that kernel takes the shape (B Layout::kTransposed, k and n multiples of 8, among its limits) and
// BRAID_GEMM_TUNING is on. Each GEMM shape a call cuts picks its candidate by timing where it runs: its first runs
// outside a capture try cuBLASLt's first algorithms (up to 4) and braid's kernel where it is offered, 3 timed runs of
// each where there are two or more (at most 15 runs, between CUDA events that later runs read; nothing waits), and its
// first run after those have completed keeps the fastest; runs before that, captured ones included, take cuBLASLt's
// first (BRAID_GEMM_TUNING=cublaslt: cuBLASLt's candidates alone; off: cuBLASLt's first always). Results may differ in
// the last bit between a shape's runs before it settles, and between ranks. The communication moves through the copy
// engines into a symmetric workspace, beside the GEMMs, which leave 4 multiprocessors to it; ranks meet at
// single-element all-reduces of the communicator on a side stream.
#pragma once

#include <cstddef>
#include <memory>

#include "braid/braid.hpp"
#include "braid/types.hpp"

namespace braid {

namespace detail {
struct FusedMatmulState;
}  // namespace detail

// How a K x N matrix B is stored (dense, row-major either way).
enum class Layout : int {
  kRowMajor = 0,    // [K, N]
  kTransposed = 1,  // [N, K]: B's transpose (a torch Linear layer's weight, y = x W^T)
};

// What a FusedMatmul holds, for every call: a cuBLASLt handle and its 32 MiB workspace, a side stream and events
// of this rank's GPU, and a symmetric workspace (from comm.alloc) that grows to the largest call so far that uses it
// (calls with k of 0 and calls in one launch use none); with BRAID_MATMUL_REDUCE_SCATTER=epilogue or engines, or
// BRAID_ALL_GATHER_MATMUL=loads, also an exchange area (from comm.alloc) that the calls in one launch grow likewise.
// Movable, not copyable; it holds a handle of its own on the communicator's state, so it may outlive comm. Its calls
// are stream-ordered and CUDA-graph capturable, and their meetings are calls of the communicator, in its order
// (braid.hpp, Ordering). Its calls run one after the other on the GPU in the order they were made: a call waits for
// the previous one where it names another stream, both eager or both in one capture. Two FusedMatmuls never
// interfere; graphs of one FusedMatmul's calls must not run concurrently with its other calls (use a FusedMatmul
// for each). Where any two of the communicator's ranks share a GPU (BRAID_ALLOW_SHARED_GPU=1), every rank's call
// runs on the caller's stream alone, and an eager call meets its peers on the host (synchronising its stream, then
// barrier()): the same results, nothing hidden. A call in one launch (BRAID_MATMUL_REDUCE_SCATTER=epilogue or
// engines, BRAID_ALL_GATHER_MATMUL=loads, below) is one launch there too, on an equal share of the GPU's
// multiprocessors for each of its ranks (with engines, of all but 4, and its side stream and meeting on the GPU as
// where ranks have a GPU each), and its ranks wait for each other on the GPU. Where ranks share a GPU as threads of
// one process, the legacy default stream is refused (kInvalidArgument naming `stream` and the call, whatever the
// call's sizes), as by every call of the communicator.
//
// Every call is collective: every rank makes it with the same shapes, layout, datatype and op (ranks that do not are
// not detected: their results are undefined, as with NCCL's collectives). Datatypes: kBFloat16 and kFloat16 (A, B and
// the outputs alike); products accumulate in float32. Every matrix is dense and row-major (leading dimension = its
// columns) in this rank's GPU memory, which must be 16-byte aligned, and no output may overlap an input or another
// output. Arguments are checked before anything is enqueued (kInvalidArgument naming the argument; a matrix of no
// elements is not checked and may be null; with BRAID_CHECK_POINTERS=off, where memory lies is not checked); a call
// whose workspace must grow allocates collectively, which a graph capture refuses (kInvalidArgument naming `stream`:
// make the call once eagerly before capturing it, or call reserve()). A growth keeps the workspace (and exchange
// area) that graphs captured before it use until the FusedMatmul is destroyed, so those graphs stay valid; a graph
// of its calls must not run after the FusedMatmul is destroyed.
class FusedMatmul {
 public:
  // Local (no peer takes part). comm must use the CUDA backend (kUnsupported otherwise). kUnsupported where
  // cuBLASLt cannot be loaded (naming the libraries tried), where the library loaded lacks a function braid calls
  // (naming the library and the function), or where BRAID_CUBLASLT_LIBRARY is set but empty. kInvalidArgument naming
  // the variable where BRAID_GEMM_TUNING, BRAID_MATMUL_REDUCE_SCATTER or BRAID_ALL_GATHER_MATMUL holds a value not
  // among its choices (docs/config.md).
  static FusedMatmul create(Communicator& comm);
  FusedMatmul(FusedMatmul&&) noexcept;
  FusedMatmul& operator=(FusedMatmul&&) noexcept;
  ~FusedMatmul();

  // out[M, N] = all_gather(a_shard) [M, K] x B, M = rows * size(): rank q's a_shard [rows, K] holds rows
  // [q * rows, (q + 1) * rows) of the gathered A. b is B (K x N, stored as `b_layout` says). a_gathered: null, or
  // [M, K] that receives the gathered A. The GEMM of this rank's rows starts at once; the other ranks' rows are
  // multiplied once the copy engines have brought them. Each output element is one GEMM's (cuBLASLt's or braid's
  // kernel, float32 accumulation rounded once) for a block of rows.
  // BRAID_ALL_GATHER_MATMUL=loads (set alike on every rank): where every rank's GPU has compute capability 9.0 and
  // BRAID_GEMM_TUNING is on (agreed once, on the host through the communicator's store, at the first call of either
  // kind that asks for one launch and meets the conditions below, on a stream not being captured), and b_layout is
  // kTransposed, rows a multiple of 128, k and n multiples of 8, M, K, N and the kernel's tile count below 2^30,
  // and size() from 2 to 8, the call is instead one launch of braid's Hopper GEMM: it multiplies this rank's rows
  // first while it copies them into every peer's exchange area (a symmetric allocation of its own, grown like the
  // workspace) and into a_gathered, and each load of a peer's rows waits until they have arrived; each output
  // element is that kernel's (float32 accumulation rounded once). Its waits for the peers are bounded and end as
  // matmul_reduce_scatter's below do.
  // rows or n of 0: nothing is enqueued (after the checks), so a_gathered is not written either; k of 0: out is
  // zeroed on `stream` (cudaMemsetAsync, after the wait for the previous call where one applies, above), and nothing
  // else is enqueued.
  void all_gather_matmul(const void* a_shard, size_t rows, size_t k, const void* b, Layout b_layout, size_t n,
                         void* out, void* a_gathered, DataType type, Stream stream);

  // out[M / size(), N] = block rank() of op over the ranks of (a [M, K] x B), blocks of M / size() rows: the
  // reduce-scatter of every rank's product. M must divide by size(). op: kSum or kAvg. Each rank first multiplies
  // the blocks its peers own, in chunks, and the copy engines move each chunk to its owner as soon as it is done;
  // its own block's GEMM adds the peers' chunks (their sum, on more than 2 ranks) as the GEMM's C matrix, so a
  // result is this rank's product in float32 plus the peers' products rounded to the datatype (and, beyond 2
  // ranks, summed in float32 and rounded once), times 1 / size() for kAvg, rounded once.
  // BRAID_MATMUL_REDUCE_SCATTER=epilogue (set alike on every rank): where every rank's GPU has compute capability 9.0
  // and BRAID_GEMM_TUNING is on (agreed as all_gather_matmul's above), and b_layout is kTransposed, M / size() a
  // multiple of 128, k and n multiples of 8, M, K, N and the kernel's tile count below 2^30, and size() from 2 to
  // 8, the call is instead one launch of braid's Hopper GEMM: the peers' rows, rounded to the datatype, go from its
  // epilogue into their owners' exchange area (a symmetric allocation of its own, grown like the workspace), and
  // each rank adds those it received to its own product in float32, times 1 / size() for kAvg, rounded once. Its
  // waits for the peers are bounded by the communicator's timeout and end on its failure (abort, revocation, a
  // peer's exit): the launch ends, and the next all_gather_matmul or
  // matmul_reduce_scatter of this FusedMatmul (whatever its sizes), or the communicator's next call that takes a
  // stream, raises kTimeout naming the wait and the peer, or the failure (the counters do not raise it, nor does a
  // reserve() that does not grow; one that grows meets the peers on the store, which raises as
  // Communicator::alloc does).
  // BRAID_MATMUL_REDUCE_SCATTER=engines (set alike on every rank), under the same conditions: one launch of braid's
  // Hopper GEMM on all multiprocessors but 4 that computes the peers' rows first and stores them, rounded to the
  // datatype, in this rank's exchange area; a side stream forked from `stream` (joined back before the call ends) meets
  // the peers (a single-element all-reduce of the communicator), then, for each peer and chunk of its block (1024 rows,
  // the last fewer; more where a block would have more than 16), waits on the GPU until the GEMM has stored the chunk
  // and has the copy engines copy it into its owner's exchange area, then raises a flag there. Each rank's own tiles
  // wait for every peer's flag for their chunk and add what arrived to the product in float32, times 1 / size() for
  // kAvg, rounded once. Its waits are bounded and end on a failure as the epilogue's do (the gate's wait, for this
  // rank's own GEMM, names this rank); where a peer never joins, the meeting may give up first (kTimeout naming
  // all_reduce).
  // m or n of 0: nothing is enqueued (after the checks); k of 0: out is zeroed on `stream` (cudaMemsetAsync,
  // after the wait for the previous call where one applies, above), and nothing else is enqueued.
  void matmul_reduce_scatter(const void* a, size_t m, size_t k, const void* b, Layout b_layout, size_t n, void* out,
                             DataType type, ReduceOp op, Stream stream);

  // Grows the symmetric workspace to exactly `bytes` now where it holds less (collective: every rank calls it with
  // the same value; where it already holds `bytes` or more, returns at once and meets no peer).
  // all_gather_matmul needs M * K elements' bytes, matmul_reduce_scatter 2 * M * N (calls with k of 0 and calls in
  // one launch need none); a call that needs more grows it
  // (to a multiple of 2 MiB). Not inside a graph capture. The exchange area of the calls in one launch is not the
  // workspace: their calls grow it (a graph capture refuses that too: make the call once eagerly first). A workspace
  // that graphs captured before use is kept, not freed, when this grows it (see above).
  void reserve(size_t bytes);
  // The symmetric workspace's bytes on each rank now.
  size_t workspace_bytes() const;
  // The matmul_reduce_scatter calls this FusedMatmul has run as one launch of braid's Hopper GEMM with the
  // reduce-scatter in its epilogue (BRAID_MATMUL_REDUCE_SCATTER=epilogue or engines, where every rank can), captured
  // ones counted once at capture.
  unsigned long long epilogue_reduce_scatters() const;
  // The all_gather_matmul calls this FusedMatmul has run as one launch of braid's Hopper GEMM with the all-gather
  // under its loads (BRAID_ALL_GATHER_MATMUL=loads, where every rank can), captured ones counted once at capture.
  unsigned long long all_gathers_under_loads() const;

 private:
  explicit FusedMatmul(std::unique_ptr<detail::FusedMatmulState> state);
  std::unique_ptr<detail::FusedMatmulState> state_;
};

}  // namespace braid
