// braid's own GEMM for Hopper GPUs (compute capability 9.0): D = alpha * A x B^T + beta * C, with B given as
// [n, k] (a Linear weight, the fused calls' Layout::kTransposed), bf16 or fp16 in and out, float32 accumulation.
// The fused calls offer it beside cuBLASLt's candidates and keep whichever runs a shape faster where it runs
// (NOTE [GEMM algorithm choice] in overlap/cublaslt.cpp); NOTE [Hopper GEMM] in matmul_sm90.cu says how it works.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "braid/device/sync_device.hpp"
#include "braid/types.hpp"

namespace braid::kernels {

// What an exchange does with the kernel's rows: the reduce-scatter that its epilogue makes of its product (NOTE
// [reduce-scatter in the epilogue]), the same reduce-scatter with the peers' rows carried by the copy engines (NOTE
// [reduce-scatter by the copy engines]), or the all-gather of A that its loads wait for (NOTE [all-gather under the
// loads]).
enum class Sm90ExchangeKind { kReduceScatter, kAllGather, kEngineReduceScatter };

// An exchange with the kernel's peers: rows are `world` blocks of `block_rows`, block q rank q's. world 0: none.
struct Sm90Exchange {
  Sm90ExchangeKind kind = Sm90ExchangeKind::kReduceScatter;
  int world = 0, rank = 0;
  size_t block_rows = 0;             // a multiple of 128
  uint8_t* local = nullptr;          // this rank's exchange area (symmetric, zeroed when made)
  uint8_t* const* peers = nullptr;   // device array [world]: every rank's exchange area, mapped here
  uint8_t* const* host_peers = nullptr;  // the same addresses, a host array [world]
  size_t received_offset = 0;        // where the received blocks start in an area: kSm90ExchangeFlagsOffset + the
                                     // flag capacity it was made with (at least sm90_exchange_flag_bytes)
  // The communicator's signal pad: its timeout bounds every wait for a peer, which records a timeout in its fatal
  // word; a failure there (or this rank stopped) ends every wait, and the launch then posts nothing a peer reads
  // (NOTE [stopped ranks]). Only error, stopped and timeout_ns are used.
  device::SignalPad pad{};
  // kAllGather: where the gathered A goes too, [world x block_rows, k] row-major, 16-byte aligned; null: nowhere.
  void* gathered = nullptr;
};
// An exchange area: control words, then flags (from kSm90ExchangeFlagsOffset), then world - 1 received blocks of
// block_rows x `columns` elements (from received_offset), where columns is n for a reduce-scatter and k for an
// all-gather; for kEngineReduceScatter then also world - 1 blocks of this rank's products for its peers (from
// sm90_engine_partials_offset). kEngineReduceScatter's words lie among the control words (sm90_engine_ready_offset,
// sm90_engine_arrived_offset), apart from the flags the other kinds stamp.
constexpr size_t kSm90ExchangeFlagsOffset = 4096;
// The flags a call needs; the area's flag capacity must hold them (flags never move while an area lives, so no
// flag of one call lands where another call's rows were).
size_t sm90_exchange_flag_bytes(Sm90ExchangeKind kind, int world, size_t block_rows, size_t columns);
// The area's bytes for a call of `kind`, with `flag_capacity` bytes of flags.
size_t sm90_exchange_bytes(Sm90ExchangeKind kind, int world, size_t block_rows, size_t columns, DataType type,
                           size_t flag_capacity);

// kEngineReduceScatter (NOTE [reduce-scatter by the copy engines]): each peer's block of rows moves in chunks of
// sm90_engine_chunk_rows rows (the last may be shorter), one copy each.
size_t sm90_engine_chunk_rows(size_t block_rows);
size_t sm90_engine_chunks(size_t block_rows);
// The most chunks a block may have (the control words hold two words a chunk and peer).
constexpr size_t kSm90EngineMaxChunks = 16;
// Where, in an area, the ready count of this rank's products for the peer destination + 1 places after it (0: rank
// + 1) and chunk `chunk` lies (written by the GEMM, read and reset by the gate), and the arrived flag of the peer
// slot + 1 places after it (0: rank + 1) for chunk `chunk` (written by that peer's post, reset by the GEMM's last
// block).
size_t sm90_engine_ready_offset(int destination, size_t chunk);
size_t sm90_engine_arrived_offset(int slot, size_t chunk);
// Where this rank's products for the peer destination + 1 places after it start in an area.
size_t sm90_engine_partials_offset(const Sm90Exchange& x, size_t columns, DataType type, int destination);
// What the ready count of a chunk reaches once the GEMM has stored all of its rows (one count a warp and tile).
uint32_t sm90_engine_ready_target(size_t chunk_rows, size_t columns);
// The most ranks an exchange takes (the GPUs of one host; the kernel takes a tensor map of every peer's area).
constexpr int kSm90ExchangeMaxWorld = 8;

struct Sm90Matmul {
  DataType type;  // kBFloat16 or kFloat16, every matrix
  size_t rows, k, n;
  const void* a;  // [rows, k], row-major
  const void* b;  // [n, k], row-major
  const void* c;  // [rows, n], row-major, or null (no C)
  void* d;        // [rows, n], row-major; may be c itself
  float alpha = 1.0f;
  float beta = 0.0f;  // ignored where c is null
  int multiprocessors = 0;  // the thread blocks it runs on (it is persistent); 0: every multiprocessor
  // With an exchange (world >= 2), c must be null, and rows = world x block_rows.
  //   - kReduceScatter: a is [rows, k]; d is [block_rows, n] and receives block `rank` of alpha x the sum over the
  //     ranks of their products (each peer's rounded to the datatype, the sum in float32).
  //   - kAllGather: a is this rank's block of A, [block_rows, k]; d is [rows, n] and receives alpha x the gathered
  //     A (every rank's block, in rank order) x B^T.
  //   - kEngineReduceScatter: as kReduceScatter, where the caller moves the peers' rows: on another stream, forked
  //     from the launch's before the launch (the launch waits for its posts), after every peer's previous call has
  //     ended (a meeting of the ranks), for each peer in the kernel's order (rank + 1 first) and each chunk, a gate,
  //     a copy of the chunk's products into the peer's received block for this rank, and a post
  //     (launch_sm90_engine_gate, launch_sm90_engine_post).
  Sm90Exchange exchange{};
};

// Whether `device`, the current device, runs the kernel: compute capability 9.0, a driver with
// cuTensorMapEncodeTiled, and room for its clusters (the occupancy query, made once a device and datatype).
bool sm90_matmul_available(int device);

// Whether the kernel takes `matmul` (on a device where it is available): bf16 or fp16; rows, k and n in [1, 2^30);
// k and n multiples of 8; a, b, c (if any) and d 16-byte aligned; multiprocessors 0 or at least 2. With an
// exchange also: world in [2, kSm90ExchangeMaxWorld], rank in [0, world), block_rows a multiple of 128 with
// rows = world * block_rows, no c, the exchange's pointers and the pad's error word set, received_offset past the
// flags the call needs, and gathered (if any) 16-byte aligned and only with kAllGather.
bool sm90_matmul_supports(const Sm90Matmul& matmul);

// The most thread blocks of the kernel with an exchange of `kind` that run at once on `device`, the current device
// (whole clusters; 0 where it cannot run): ranks that share a GPU split them, so that all their launches are
// resident.
int sm90_exchange_resident_blocks(int device, DataType type, Sm90ExchangeKind kind);

// Enqueues the GEMM on the current device, which must be `sm90_matmul_available` and run `matmul` (supported).
// Returns the launch's error (cudaSuccess where it was enqueued).
cudaError_t launch_sm90_matmul(const Sm90Matmul& matmul, cudaStream_t stream);

// kEngineReduceScatter's steps around a copy (one thread each; NOTE [reduce-scatter by the copy engines]):
//   - the gate waits until the ready count of (destination, chunk) in x.local reaches `target`, then resets it to 0;
//   - the post stores 1 into the arrived flag of (slot, chunk) in the peer `peer`'s area (x.host_peers), where the
//     rank is not stopped and no failure is recorded (NOTE [stopped ranks]).
// The gate's wait is bounded and ends on a failure as the kernel's waits do. Returns the launch's error.
cudaError_t launch_sm90_engine_gate(const Sm90Exchange& x, int destination, size_t chunk, uint32_t target,
                                    cudaStream_t stream);
cudaError_t launch_sm90_engine_post(const Sm90Exchange& x, int peer, int slot, size_t chunk, cudaStream_t stream);

}  // namespace braid::kernels
