/* nccl_check: exercises NCCL's C API (nccl.h only, nothing of braid) and checks every result against a host
 * reference, so the same binary judges the real NCCL and braid's libnccl.so.2 shim.
 *
 * It is linked against a libnccl.so.2 at build time (DT_NEEDED libnccl.so.2, no RPATH); at run time the shim is
 * chosen with LD_PRELOAD=.../libnccl.so.2, the real NCCL with LD_LIBRARY_PATH.
 *
 * Inputs are small integers (or, for collectives that only move data, raw random bits), chosen so that every
 * result is exact in every data type and in every summation order. A correct implementation therefore produces
 * bitwise the same output as any other: each case prints a 64-bit FNV-1a hash of its output, and
 * compare_runs.sh diffs those lines between a shim run and a real-NCCL run.
 *
 *   nccl_check -t N                 one process drives N GPUs: communicators from ncclCommInitAll, then a second
 *                                   pass with communicators from ncclGroupStart + N x ncclCommInitRank + ncclGroupEnd
 *   <launcher> nccl_check --id-file PATH
 *                                   one process per GPU; rank/world/local rank from BRAID_RANK, BRAID_WORLD_SIZE,
 *                                   BRAID_LOCAL_RANK (braid-run) or RANK, WORLD_SIZE, LOCAL_RANK (torchrun-like)
 * Output: one line per case and rank
 *   case <name> dtype <type> count <n> comms <how> rank <r> hash <fnv1a> ok|WRONG ...
 * then "nccl_check: <passed> passed, <failed> failed"; the exit code is 0 only if nothing failed. */
#define _POSIX_C_SOURCE 200809L

#include <nccl.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include "shim_test_common.h"

#define MAX_LOCAL 64
#define GUARD_BYTES 256 /* poisoned bytes after every output buffer: an overrun shows up as a changed guard */
#define POISON 0xA5     /* fixed byte written over every output before each call */
#define GRAPH_REPLAYS 20

/* ------------------------------------------------------------------------------------------------------------
 * Data types. Values are encoded from exact doubles; float16/bfloat16 are converted by hand (C has no such types)
 * with round-to-nearest-even, although every value the program encodes is exactly representable. */
typedef enum { K_INT, K_UINT, K_F16, K_BF16, K_F32, K_F64, K_F8E4M3, K_F8E5M2 } Kind;
typedef struct {
  ncclDataType_t nccl;
  const char* name;
  size_t size;
  Kind kind;
} DType;

static const DType kTypes[] = {
    {ncclInt8, "int8", 1, K_INT},          {ncclUint8, "uint8", 1, K_UINT},     {ncclInt32, "int32", 4, K_INT},
    {ncclUint32, "uint32", 4, K_UINT},     {ncclInt64, "int64", 8, K_INT},      {ncclUint64, "uint64", 8, K_UINT},
    {ncclFloat16, "float16", 2, K_F16},    {ncclBfloat16, "bfloat16", 2, K_BF16}, {ncclFloat32, "float32", 4, K_F32},
    {ncclFloat64, "float64", 8, K_F64},    {ncclFloat8e4m3, "float8e4m3", 1, K_F8E4M3},
    {ncclFloat8e5m2, "float8e5m2", 1, K_F8E5M2},
};
#define NTYPES (sizeof kTypes / sizeof kTypes[0])

static const DType* type_named(const char* name) {
  for (size_t i = 0; i < NTYPES; ++i)
    if (!strcmp(kTypes[i].name, name)) return &kTypes[i];
  return NULL;
}

static int is_float(const DType* t) { return t->kind >= K_F16; }

static uint16_t f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t bexp = (x >> 23) & 0xffu;
  uint32_t mant = x & 0x7fffffu;
  if (bexp == 0xff) return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0));
  const int exp = (int)bexp - 127 + 15;
  if (exp >= 31) return (uint16_t)(sign | 0x7c00u);
  if (exp <= 0) { /* half subnormal */
    if (exp < -10) return (uint16_t)sign;
    mant |= 0x800000u;
    const int shift = 14 - exp;
    uint32_t m = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (m & 1))) ++m;
    return (uint16_t)(sign | m);
  }
  uint32_t h = sign | ((uint32_t)exp << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) ++h; /* a carry into the exponent is still right */
  return (uint16_t)h;
}

static uint16_t f32_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40); /* NaN stays NaN */
  x += 0x7fffu + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}

static void encode(const DType* t, void* dst, double v) {
  switch (t->kind) {
    case K_INT: {
      int64_t x = (int64_t)v; /* little endian: the low bytes are the narrow type's two's complement */
      memcpy(dst, &x, t->size);
      break;
    }
    case K_UINT: {
      uint64_t x = (uint64_t)(int64_t)v;
      memcpy(dst, &x, t->size);
      break;
    }
    case K_F16: {
      uint16_t h = f32_to_f16((float)v);
      memcpy(dst, &h, 2);
      break;
    }
    case K_BF16: {
      uint16_t h = f32_to_bf16((float)v);
      memcpy(dst, &h, 2);
      break;
    }
    case K_F32: {
      float f = (float)v;
      memcpy(dst, &f, 4);
      break;
    }
    case K_F64: memcpy(dst, &v, 8); break;
    case K_F8E4M3:
    case K_F8E5M2: *(uint8_t*)dst = f32_to_fp8((float)v, t->kind == K_F8E5M2); break;
  }
}

/* ------------------------------------------------------------------------------------------------------------
 * The world this process sees: nlocal ranks of an nranks communicator (nlocal == nranks with -t, else 1). */
static struct {
  int nranks, nlocal;
  int rank[MAX_LOCAL], dev[MAX_LOCAL];
  ncclComm_t comm[MAX_LOCAL];
  cudaStream_t stream[MAX_LOCAL];  /* every eager case runs on these (non-blocking, not the default stream) */
  cudaStream_t gstream[MAX_LOCAL]; /* the CUDA graph section captures on these */
  const char* comms;               /* how the communicators were made: initall, group, initrank */
  size_t max_count;
  int passed, failed, skipped;
} W;

static char g_current[256] = "setup"; /* the case being run, named in fatal errors */

#define CUDA_CHECK(call)                                                                                  \
  do {                                                                                                    \
    cudaError_t e_ = (call);                                                                              \
    if (e_ != cudaSuccess) die("%s:%d: %s: %s (in %s)", __FILE__, __LINE__, #call, cudaGetErrorString(e_), \
                               g_current);                                                                \
  } while (0)
/* An NCCL error leaves the ranks out of step (one may wait in a collective the others never join), so it ends
 * the run: the message names the case, and the missing summary line marks the run as failed. */
#define NCCL_CHECK(call)                                                                                         \
  do {                                                                                                           \
    ncclResult_t r_ = (call);                                                                                    \
    if (r_ != ncclSuccess) die("%s returned %d (%s) in %s", #call, (int)r_, ncclGetErrorString(r_), g_current); \
  } while (0)

/* ------------------------------------------------------------------------------------------------------------
 * Cases. */
typedef enum { C_ALLREDUCE, C_REDUCE, C_REDUCESCATTER, C_ALLGATHER, C_BROADCAST, C_ALLTOALL, C_RING, C_PAIR } Coll;
static const char* const kCollNames[] = {"allreduce", "reduce",   "reducescatter", "allgather",
                                         "broadcast", "alltoall", "sendrecv.ring", "sendrecv.pair"};
static const char* const kOpNames[] = {"sum", "prod", "max", "min", "avg"};

typedef struct {
  Coll coll;
  ncclRedOp_t op;
  const DType* type;
  size_t count; /* the count argument of the call (per-rank block for reducescatter, allgather, alltoall) */
  int in_place;
  int root;
  int default_stream; /* run on stream 0 instead of W.stream */
  int config;         /* allreduce through ncclAllReduceConfig (NCCL 2.30+; ncclAllReduce where it is absent) */
  char name[96];
} Case;

static int is_reduction(Coll c) { return c == C_ALLREDUCE || c == C_REDUCE || c == C_REDUCESCATTER; }

/* Value classes. Sums: |x| <= 120/nranks, so every partial sum is an integer of magnitude <= 120, exact in int8
 * and in bfloat16 (8 significant bits); fp8: |x| <= 8/nranks, partial sums <= 8, exact in e5m2 (3 significant
 * bits) up to 8 ranks. Products: x in {1, 2} (and -1, -2 where the type is signed), with at most 6 ranks
 * contributing a 2 to any element, so |product| <= 64. max/min: |x| <= 100 (fp8: <= 8). Values are never 0. */
typedef enum { V_SUM, V_PROD, V_MAXMIN, V_BITS } VClass;

static VClass value_class(const Case* c) {
  if (!is_reduction(c->coll)) return V_BITS; /* data movement: raw random bits show any misplaced byte */
  switch (c->op) {
    case ncclProd: return V_PROD;
    case ncclMax:
    case ncclMin: return V_MAXMIN;
    default: return V_SUM;
  }
}

/* uniform in [0, n) from the top 32 bits of r, by multiplication (no division in this hot loop) */
static inline uint64_t below(uint64_t r, uint64_t n) { return ((r >> 32) * n) >> 32; }

static inline int64_t reduce_value(VClass vc, const DType* t, uint64_t seed, int rank, size_t i) {
  const uint64_t r = rnd64(seed, i);
  const int neg = t->kind != K_UINT && ((r >> 8) & 1);
  const int fp8 = t->kind == K_F8E4M3 || t->kind == K_F8E5M2;
  const int sum_limit = fp8 ? 8 : 120;
  int64_t mag;
  if (vc == V_SUM) {
    const uint64_t k = W.nranks < sum_limit ? (uint64_t)(sum_limit / W.nranks) : 1;
    mag = 1 + (int64_t)below(r, k);
  } else if (vc == V_PROD) {
    const size_t twos = W.nranks < 6 ? (size_t)W.nranks : 6; /* ranks that may contribute a 2 to element i */
    mag = ((r >> 20) & 1) && (twos == (size_t)W.nranks || ((i + (size_t)rank) % (size_t)W.nranks) < twos) ? 2 : 1;
  } else {
    mag = 1 + (int64_t)below(r, fp8 ? 8 : 100);
  }
  return neg ? -mag : mag;
}

static uint64_t rank_seed(uint64_t case_seed, int rank) { return mix64(case_seed ^ (0x51ed2700ULL * (uint64_t)(rank + 1))); }

/* Element j of rank q's input (seed: rank_seed(case seed, q)), encoded into dst. */
static inline void input_elem(const DType* t, VClass vc, uint64_t seed, int q, size_t j, unsigned char* dst) {
  if (vc == V_BITS) {
    const uint64_t r = rnd64(seed, j);
    memcpy(dst, &r, t->size);
  } else {
    encode(t, dst, (double)reduce_value(vc, t, seed, q, j));
  }
}

/* Where input and output sit: elements of the send buffer (out of place) or of the single buffer (in place). */
typedef struct {
  size_t in_elems, out_elems, in_off, out_off, buf_elems;
} Layout;

static Layout layout_of(const Case* c, int r) {
  const size_t n = c->count, N = (size_t)W.nranks;
  Layout L = {n, n, 0, 0, 0};
  switch (c->coll) {
    case C_REDUCESCATTER:
      L.in_elems = N * n;
      if (c->in_place) L.out_off = (size_t)r * n; /* recvbuff == sendbuff + rank * recvcount */
      break;
    case C_ALLGATHER:
      L.out_elems = N * n;
      if (c->in_place) L.in_off = (size_t)r * n; /* sendbuff == recvbuff + rank * sendcount */
      break;
    case C_ALLTOALL: L.in_elems = L.out_elems = N * n; break;
    default: break;
  }
  L.buf_elems = L.out_off + L.out_elems;
  if (c->in_place && L.in_off + L.in_elems > L.buf_elems) L.buf_elems = L.in_off + L.in_elems;
  return L;
}

static int pair_partner(int r) {
  int p = r ^ 1;
  return p < W.nranks ? p : r; /* an odd rank count leaves the last rank exchanging with itself */
}

/* Rank r's expected output (out_elems elements), computed from the regenerated inputs of all ranks. */
static void expected_output(const Case* c, VClass vc, uint64_t seed, int r, unsigned char* out) {
  const DType* t = c->type;
  const size_t n = c->count, N = (size_t)W.nranks, sz = t->size;
  uint64_t* seeds = malloc(sizeof(uint64_t) * N);
  if (!seeds) die("out of host memory");
  for (int q = 0; q < W.nranks; ++q) seeds[q] = rank_seed(seed, q);
  if (is_reduction(c->coll)) {
    const size_t base = c->coll == C_REDUCESCATTER ? (size_t)r * n : 0;
    for (size_t k = 0; k < n; ++k) {
      int64_t acc = reduce_value(vc, t, seeds[0], 0, base + k);
      for (int q = 1; q < W.nranks; ++q) {
        const int64_t v = reduce_value(vc, t, seeds[q], q, base + k);
        switch (c->op) {
          case ncclProd: acc *= v; break;
          case ncclMax: acc = v > acc ? v : acc; break;
          case ncclMin: acc = v < acc ? v : acc; break;
          default: acc += v; break;
        }
      }
      const double result = c->op == ncclAvg ? (double)acc / (double)W.nranks : (double)acc;
      encode(t, out + k * sz, result);
    }
    free(seeds);
    return;
  }
  for (size_t k = 0; k < (c->coll == C_ALLGATHER || c->coll == C_ALLTOALL ? N * n : n); ++k) {
    int q;
    size_t j;
    switch (c->coll) {
      case C_ALLGATHER: q = (int)(k / n), j = k % n; break;
      case C_ALLTOALL: q = (int)(k / n), j = (size_t)r * n + k % n; break;
      case C_BROADCAST: q = c->root, j = k; break;
      case C_RING: q = (r - 1 + W.nranks) % W.nranks, j = k; break;
      default: q = pair_partner(r), j = k; break; /* C_PAIR */
    }
    input_elem(t, vc, seeds[q], q, j, out + k * sz);
  }
  free(seeds);
}

/* Outputs that are the same on every rank are computed once per case, not once per rank (-t N would otherwise
 * pay N times for them). */
static int output_same_on_all_ranks(Coll c) { return c == C_ALLREDUCE || c == C_ALLGATHER || c == C_BROADCAST; }

/* ------------------------------------------------------------------------------------------------------------
 * Issuing the calls. */
/* Functions of NCCL releases newer than this nccl.h, looked up at run time: NULL where the library lacks them. */
typedef ncclResult_t (*AllReduceConfigFn)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                          cudaStream_t, const void*);
static void* newer_function(const char* name) { return dlsym(RTLD_DEFAULT, name); }

static void issue(const Case* c, int l, const void* sendp, void* recvp, cudaStream_t s) {
  const ncclComm_t comm = W.comm[l];
  const ncclDataType_t dt = c->type->nccl;
  const int r = W.rank[l], N = W.nranks;
  const AllReduceConfigFn with_config = c->config ? (AllReduceConfigFn)newer_function("ncclAllReduceConfig") : NULL;
  switch (c->coll) {
    case C_ALLREDUCE:
      if (with_config)
        NCCL_CHECK(with_config(sendp, recvp, c->count, dt, c->op, comm, s, NULL));
      else
        NCCL_CHECK(ncclAllReduce(sendp, recvp, c->count, dt, c->op, comm, s));
      break;
    case C_REDUCE: NCCL_CHECK(ncclReduce(sendp, recvp, c->count, dt, c->op, c->root, comm, s)); break;
    case C_REDUCESCATTER: NCCL_CHECK(ncclReduceScatter(sendp, recvp, c->count, dt, c->op, comm, s)); break;
    case C_ALLGATHER: NCCL_CHECK(ncclAllGather(sendp, recvp, c->count, dt, comm, s)); break;
    case C_BROADCAST: NCCL_CHECK(ncclBroadcast(sendp, recvp, c->count, dt, c->root, comm, s)); break;
    case C_ALLTOALL: NCCL_CHECK(ncclAlltoAll(sendp, recvp, c->count, dt, comm, s)); break;
    case C_RING:
      NCCL_CHECK(ncclSend(sendp, c->count, dt, (r + 1) % N, comm, s));
      NCCL_CHECK(ncclRecv(recvp, c->count, dt, (r - 1 + N) % N, comm, s));
      break;
    case C_PAIR: {
      /* Odd ranks post the receive first: the group must not depend on the order inside it. */
      const int p = pair_partner(r);
      if (r & 1) {
        NCCL_CHECK(ncclRecv(recvp, c->count, dt, p, comm, s));
        NCCL_CHECK(ncclSend(sendp, c->count, dt, p, comm, s));
      } else {
        NCCL_CHECK(ncclSend(sendp, c->count, dt, p, comm, s));
        NCCL_CHECK(ncclRecv(recvp, c->count, dt, p, comm, s));
      }
      break;
    }
  }
}

/* A group is needed when one thread drives several ranks, and always around send/recv (both directions must
 * progress together). A lone collective of a one-GPU process is issued bare: the most common way it is called. */
static int needs_group(const Case* c) { return W.nlocal > 1 || c->coll == C_RING || c->coll == C_PAIR; }

/* Per rank, per case: device buffers and host copies. */
typedef struct {
  Layout L;
  unsigned char *dsend, *dbuf; /* dsend is NULL in place; dbuf holds the output (and in place the input) + guard */
  unsigned char *hin, *hbuf, *hsend, *hexp;
  int exp_owned;
} RankState;

static void alloc_rank(const Case* c, int l, RankState* st) {
  const size_t sz = c->type->size;
  st->L = layout_of(c, W.rank[l]);
  CUDA_CHECK(cudaSetDevice(W.dev[l]));
  CUDA_CHECK(cudaMalloc((void**)&st->dbuf, st->L.buf_elems * sz + GUARD_BYTES));
  st->dsend = NULL;
  /* At least a few bytes, so a count-0 call still gets a valid, distinct send pointer. */
  if (!c->in_place) CUDA_CHECK(cudaMalloc((void**)&st->dsend, st->L.in_elems * sz + 64));
  st->hin = malloc(st->L.in_elems * sz + 1);
  st->hbuf = malloc(st->L.buf_elems * sz + GUARD_BYTES);
  st->hsend = c->in_place ? NULL : malloc(st->L.in_elems * sz + 1);
  st->hexp = NULL;
  st->exp_owned = 0;
  if (!st->hin || !st->hbuf || (!c->in_place && !st->hsend)) die("out of host memory");
}

static void free_rank(int l, RankState* st) {
  CUDA_CHECK(cudaSetDevice(W.dev[l]));
  CUDA_CHECK(cudaFree(st->dbuf));
  if (st->dsend) CUDA_CHECK(cudaFree(st->dsend));
  free(st->hin);
  free(st->hbuf);
  free(st->hsend);
  if (st->exp_owned) free(st->hexp);
}

/* Writes rank l's input (generated from `seed`) and poisons its output, all on stream s. */
static void load_rank(const Case* c, VClass vc, uint64_t seed, int l, RankState* st, cudaStream_t s) {
  const size_t sz = c->type->size;
  const uint64_t rs = rank_seed(seed, W.rank[l]);
  for (size_t j = 0; j < st->L.in_elems; ++j) input_elem(c->type, vc, rs, W.rank[l], j, st->hin + j * sz);
  CUDA_CHECK(cudaSetDevice(W.dev[l]));
  CUDA_CHECK(cudaMemsetAsync(st->dbuf, POISON, st->L.buf_elems * sz + GUARD_BYTES, s));
  unsigned char* in = c->in_place ? st->dbuf + st->L.in_off * sz : st->dsend;
  if (st->L.in_elems) CUDA_CHECK(cudaMemcpyAsync(in, st->hin, st->L.in_elems * sz, cudaMemcpyHostToDevice, s));
}

static void issue_all(const Case* c, RankState* sts, const cudaStream_t* streams) {
  const int group = needs_group(c);
  if (group) NCCL_CHECK(ncclGroupStart());
  for (int l = 0; l < W.nlocal; ++l) {
    RankState* st = &sts[l];
    const size_t sz = c->type->size;
    const void* sendp = c->in_place ? (const void*)(st->dbuf + st->L.in_off * sz) : (const void*)st->dsend;
    void* recvp = st->dbuf + st->L.out_off * sz;
    /* A reduce's non-root ranks pass no receive buffer, as NCCL allows. */
    if (c->coll == C_REDUCE && W.rank[l] != c->root && !c->in_place) recvp = NULL;
    if (!group) CUDA_CHECK(cudaSetDevice(W.dev[l]));
    issue(c, l, sendp, recvp, streams[l]);
  }
  if (group) NCCL_CHECK(ncclGroupEnd());
}

static void read_back(const Case* c, int l, RankState* st, cudaStream_t s) {
  const size_t sz = c->type->size;
  CUDA_CHECK(cudaSetDevice(W.dev[l]));
  CUDA_CHECK(cudaMemcpyAsync(st->hbuf, st->dbuf, st->L.buf_elems * sz + GUARD_BYTES, cudaMemcpyDeviceToHost, s));
  if (!c->in_place && st->L.in_elems)
    CUDA_CHECK(cudaMemcpyAsync(st->hsend, st->dsend, st->L.in_elems * sz, cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
}

static void print_hex(char* out, size_t out_size, const unsigned char* p, size_t bytes) {
  size_t w = 0;
  out[0] = 0;
  for (size_t i = bytes; i-- > 0 && w + 3 < out_size;) w += (size_t)snprintf(out + w, out_size - w, "%02x", p[i]);
}

/* Judges rank l's buffers: output == expected, guard untouched, send buffer untouched (out of place), and a
 * non-root reduce leaves its in-place buffer as it was. Appends what went wrong to `why`; returns 1 if right. */
static int judge(const Case* c, int l, const RankState* st, const unsigned char* expected, char* why, size_t why_size,
                 uint64_t* hash) {
  const size_t sz = c->type->size;
  const int r = W.rank[l];
  const int has_output = !(c->coll == C_REDUCE && r != c->root);
  int ok = 1;
  size_t w = 0;
  why[0] = 0;
  if (has_output) {
    const unsigned char* got = st->hbuf + st->L.out_off * sz;
    *hash = fnv1a(got, st->L.out_elems * sz, FNV_OFFSET);
    if (memcmp(got, expected, st->L.out_elems * sz) != 0) {
      size_t bad = 0, first = 0;
      for (size_t k = 0; k < st->L.out_elems; ++k)
        if (memcmp(got + k * sz, expected + k * sz, sz)) {
          if (!bad++) first = k;
        }
      char g[40], e[40];
      print_hex(g, sizeof g, got + first * sz, sz);
      print_hex(e, sizeof e, expected + first * sz, sz);
      w += (size_t)snprintf(why + w, why_size - w, " %zu of %zu elements differ, first at %zu: got 0x%s expected 0x%s",
                            bad, st->L.out_elems, first, g, e);
      ok = 0;
    }
  } else if (c->in_place) {
    /* NCCL's non-root ranks only read their buffer; it must still hold the rank's input. */
    *hash = fnv1a(st->hbuf, st->L.in_elems * sz, FNV_OFFSET);
    if (memcmp(st->hbuf, st->hin, st->L.in_elems * sz)) {
      w += (size_t)snprintf(why + w, why_size - w, " non-root in-place buffer modified");
      ok = 0;
    }
  } else {
    *hash = FNV_OFFSET; /* non-root, out of place: no output at all */
  }
  if (has_output || c->in_place) {
    const unsigned char* guard = st->hbuf + st->L.buf_elems * sz;
    for (size_t i = 0; i < GUARD_BYTES; ++i)
      if (guard[i] != POISON) {
        w += (size_t)snprintf(why + w, why_size - w, " wrote past the end of the output (guard byte %zu)", i);
        ok = 0;
        break;
      }
  }
  if (!c->in_place && memcmp(st->hsend, st->hin, st->L.in_elems * sz)) {
    w += (size_t)snprintf(why + w, why_size - w, " send buffer modified");
    ok = 0;
  }
  return ok;
}

static void report(const char* name, const DType* t, size_t count, int rank, const char* extra, uint64_t hash,
                   int ok, const char* why) {
  printf("case %s dtype %s count %zu comms %s rank %d%s hash %016llx %s%s\n", name, t ? t->name : "none", count,
         W.comms, rank, extra, (unsigned long long)hash, ok ? "ok" : "WRONG", ok ? "" : why);
  if (ok)
    ++W.passed;
  else
    ++W.failed;
}

static uint64_t case_seed(const char* name, const DType* t, size_t count, int set) {
  char key[256];
  snprintf(key, sizeof key, "%s|%s|%zu|%s|%d", name, t->name, count, W.comms, set);
  return fnv1a(key, strlen(key), FNV_OFFSET);
}

static int power_of_two(int n) { return n > 0 && (n & (n - 1)) == 0; }

static void run_case(Case* c) {
  if (c->count > W.max_count) return;
  snprintf(g_current, sizeof g_current, "case %s dtype %s count %zu", c->name, c->type->name, c->count);
  if (c->op == ncclAvg && is_float(c->type) && !power_of_two(W.nranks)) {
    /* NCCL averages floats as a sum of x * (1/nranks): exact only when 1/nranks is a power of two. Integers divide
       the sum, truncating toward zero: exact for any rank count. */
    if (W.rank[0] == 0)
      printf("case %s dtype %s count %zu comms %s skipped (avg is exact only for a power-of-two rank count)\n",
             c->name, c->type->name, c->count, W.comms);
    ++W.skipped;
    return;
  }
  const VClass vc = value_class(c);
  const uint64_t seed = case_seed(c->name, c->type, c->count, 0);
  RankState sts[MAX_LOCAL];
  cudaStream_t streams[MAX_LOCAL];
  for (int l = 0; l < W.nlocal; ++l) {
    streams[l] = c->default_stream ? (cudaStream_t)0 : W.stream[l];
    alloc_rank(c, l, &sts[l]);
    load_rank(c, vc, seed, l, &sts[l], streams[l]);
  }
  issue_all(c, sts, streams);
  for (int l = 0; l < W.nlocal; ++l) read_back(c, l, &sts[l], streams[l]);

  unsigned char* shared_exp = NULL;
  for (int l = 0; l < W.nlocal; ++l) {
    RankState* st = &sts[l];
    const int r = W.rank[l];
    if (c->coll == C_REDUCE && r != c->root) {
      st->hexp = NULL;
    } else if (output_same_on_all_ranks(c->coll) && shared_exp) {
      st->hexp = shared_exp;
    } else {
      st->hexp = malloc(st->L.out_elems * c->type->size + 1);
      if (!st->hexp) die("out of host memory");
      st->exp_owned = 1;
      expected_output(c, vc, seed, r, st->hexp);
      if (output_same_on_all_ranks(c->coll)) shared_exp = st->hexp;
    }
    char why[512];
    uint64_t hash = FNV_OFFSET;
    const int ok = judge(c, l, st, st->hexp, why, sizeof why, &hash);
    report(c->name, c->type, c->count, r, "", hash, ok, why);
  }
  for (int l = 0; l < W.nlocal; ++l) free_rank(l, &sts[l]);
}

static void make_case(Case* c, Coll coll, ncclRedOp_t op, const DType* t, size_t count, int in_place, int root) {
  memset(c, 0, sizeof *c);
  c->coll = coll, c->op = op, c->type = t, c->count = count, c->in_place = in_place, c->root = root;
  const char* place = in_place ? "inplace" : "outofplace";
  if (is_reduction(coll) && coll == C_REDUCE)
    snprintf(c->name, sizeof c->name, "%s.%s.root%d.%s", kCollNames[coll], kOpNames[op], root, place);
  else if (is_reduction(coll))
    snprintf(c->name, sizeof c->name, "%s.%s.%s", kCollNames[coll], kOpNames[op], place);
  else if (coll == C_BROADCAST)
    snprintf(c->name, sizeof c->name, "%s.root%d.%s", kCollNames[coll], root, place);
  else if (coll == C_ALLGATHER || (coll == C_ALLTOALL && in_place))
    snprintf(c->name, sizeof c->name, "%s.%s", kCollNames[coll], place);
  else
    snprintf(c->name, sizeof c->name, "%s", kCollNames[coll]); /* send/recv: out of place only */
}

/* ------------------------------------------------------------------------------------------------------------
 * CUDA graphs: allreduce, allgather, reducescatter, broadcast and a send/recv ring captured on a non-default
 * stream, replayed GRAPH_REPLAYS times. Between replays the inputs are rewritten, alternating two input sets, and
 * the outputs poisoned: each replay must read the buffers as they are at replay time and write every output.
 * Replays of set 0 must equal the eager run of set 0 bitwise; every replay must equal the host reference. */
#define GRAPH_OPS 5

static void run_graphs(const DType* t, size_t count) {
  if (count > W.max_count) return;
  Case cs[GRAPH_OPS];
  make_case(&cs[0], C_ALLREDUCE, ncclSum, t, count, 0, 0);
  make_case(&cs[1], C_ALLGATHER, ncclSum, t, count, 0, 0);
  make_case(&cs[2], C_REDUCESCATTER, ncclSum, t, count, 0, 0);
  make_case(&cs[3], C_BROADCAST, ncclSum, t, count, 0, W.nranks - 1);
  make_case(&cs[4], C_RING, ncclSum, t, count, 0, 0);
  snprintf(cs[0].name, sizeof cs[0].name, "graph.allreduce.sum");
  snprintf(cs[1].name, sizeof cs[1].name, "graph.allgather");
  snprintf(cs[2].name, sizeof cs[2].name, "graph.reducescatter.sum");
  snprintf(cs[3].name, sizeof cs[3].name, "graph.broadcast.root%d", W.nranks - 1);
  snprintf(cs[4].name, sizeof cs[4].name, "graph.sendrecv.ring");
  snprintf(g_current, sizeof g_current, "graph section dtype %s count %zu", t->name, count);

  static RankState st[GRAPH_OPS][MAX_LOCAL];
  static unsigned char *hin[2][GRAPH_OPS][MAX_LOCAL], *hexp[2][GRAPH_OPS][MAX_LOCAL], *eager[GRAPH_OPS][MAX_LOCAL];
  static int ok[GRAPH_OPS][MAX_LOCAL];
  static char why[GRAPH_OPS][MAX_LOCAL][512];
  uint64_t seeds[2][GRAPH_OPS];
  const size_t sz = t->size;

  /* Buffers, both input sets and both sets' expected outputs. */
  for (int o = 0; o < GRAPH_OPS; ++o) {
    const VClass vc = value_class(&cs[o]);
    for (int s = 0; s < 2; ++s) seeds[s][o] = case_seed(cs[o].name, t, count, s);
    for (int l = 0; l < W.nlocal; ++l) {
      alloc_rank(&cs[o], l, &st[o][l]);
      const Layout* L = &st[o][l].L;
      for (int s = 0; s < 2; ++s) {
        hin[s][o][l] = malloc(L->in_elems * sz + 1);
        hexp[s][o][l] = malloc(L->out_elems * sz + 1);
        if (!hin[s][o][l] || !hexp[s][o][l]) die("out of host memory");
        const uint64_t rs = rank_seed(seeds[s][o], W.rank[l]);
        for (size_t j = 0; j < L->in_elems; ++j) input_elem(t, vc, rs, W.rank[l], j, hin[s][o][l] + j * sz);
        expected_output(&cs[o], vc, seeds[s][o], W.rank[l], hexp[s][o][l]);
      }
      eager[o][l] = malloc(L->out_elems * sz + 1);
      ok[o][l] = 1;
      why[o][l][0] = 0;
    }
  }

  /* (Re)loads input set `set` and poisons the outputs, on the graph streams. */
  #define LOAD_SET(set)                                                                                       \
    for (int o = 0; o < GRAPH_OPS; ++o)                                                                       \
      for (int l = 0; l < W.nlocal; ++l) {                                                                    \
        RankState* s_ = &st[o][l];                                                                            \
        CUDA_CHECK(cudaSetDevice(W.dev[l]));                                                                  \
        CUDA_CHECK(cudaMemsetAsync(s_->dbuf, POISON, s_->L.buf_elems * sz + GUARD_BYTES, W.gstream[l]));      \
        memcpy(s_->hin, hin[set][o][l], s_->L.in_elems * sz);                                                 \
        if (s_->L.in_elems)                                                                                   \
          CUDA_CHECK(cudaMemcpyAsync(s_->dsend, s_->hin, s_->L.in_elems * sz, cudaMemcpyHostToDevice,         \
                                     W.gstream[l]));                                                          \
      }

  /* Judges every op's output against set `set` (and, for set 0, against the eager output). */
  #define JUDGE_SET(set, replay)                                                                              \
    for (int o = 0; o < GRAPH_OPS; ++o)                                                                       \
      for (int l = 0; l < W.nlocal; ++l) {                                                                    \
        RankState* s_ = &st[o][l];                                                                            \
        read_back(&cs[o], l, s_, W.gstream[l]);                                                               \
        char w_[400];                                                                                         \
        uint64_t h_;                                                                                          \
        if (!judge(&cs[o], l, s_, hexp[set][o][l], w_, sizeof w_, &h_)) {                                     \
          if (ok[o][l]) snprintf(why[o][l], sizeof why[o][l], " %s:%s", (replay) < 0 ? "eager" : "replay", w_); \
          ok[o][l] = 0;                                                                                       \
        }                                                                                                     \
        const unsigned char* out_ = s_->hbuf + s_->L.out_off * sz;                                            \
        if ((replay) < 0) {                                                                                   \
          memcpy(eager[o][l], out_, s_->L.out_elems * sz);                                                    \
        } else if ((set) == 0 && memcmp(eager[o][l], out_, s_->L.out_elems * sz)) {                           \
          if (ok[o][l]) snprintf(why[o][l], sizeof why[o][l], " replay %d differs from the eager run", replay); \
          ok[o][l] = 0;                                                                                       \
        }                                                                                                     \
      }

  /* Issues the whole sequence on the graph streams (eagerly, or into the capture). */
  #define ISSUE_SEQUENCE()                                                                                    \
    for (int o = 0; o < GRAPH_OPS; ++o) issue_all(&cs[o], st[o], W.gstream);

  LOAD_SET(0);
  ISSUE_SEQUENCE();
  JUDGE_SET(0, -1);

  cudaGraph_t graph[MAX_LOCAL];
  cudaGraphExec_t exec[MAX_LOCAL];
  for (int l = 0; l < W.nlocal; ++l) {
    CUDA_CHECK(cudaSetDevice(W.dev[l]));
    CUDA_CHECK(cudaStreamBeginCapture(W.gstream[l], cudaStreamCaptureModeGlobal));
  }
  ISSUE_SEQUENCE();
  /* Every capture ends before any graph is instantiated: instantiating is not allowed while another stream of
   * this thread still captures in global mode (one process driving several GPUs). */
  for (int l = 0; l < W.nlocal; ++l) {
    CUDA_CHECK(cudaSetDevice(W.dev[l]));
    CUDA_CHECK(cudaStreamEndCapture(W.gstream[l], &graph[l]));
  }
  for (int l = 0; l < W.nlocal; ++l) {
    CUDA_CHECK(cudaSetDevice(W.dev[l]));
    CUDA_CHECK(cudaGraphInstantiate(&exec[l], graph[l], 0));
  }
  for (int k = 0; k < GRAPH_REPLAYS; ++k) {
    const int set = k & 1;
    LOAD_SET(set);
    for (int l = 0; l < W.nlocal; ++l) {
      CUDA_CHECK(cudaSetDevice(W.dev[l]));
      CUDA_CHECK(cudaGraphLaunch(exec[l], W.gstream[l]));
    }
    JUDGE_SET(set, k);
  }
  #undef LOAD_SET
  #undef JUDGE_SET
  #undef ISSUE_SEQUENCE

  char extra[32];
  snprintf(extra, sizeof extra, " replays %d", GRAPH_REPLAYS);
  for (int o = 0; o < GRAPH_OPS; ++o)
    for (int l = 0; l < W.nlocal; ++l)
      report(cs[o].name, t, count, W.rank[l], extra, fnv1a(eager[o][l], st[o][l].L.out_elems * sz, FNV_OFFSET),
             ok[o][l], why[o][l]);

  for (int l = 0; l < W.nlocal; ++l) {
    CUDA_CHECK(cudaSetDevice(W.dev[l]));
    CUDA_CHECK(cudaGraphExecDestroy(exec[l]));
    CUDA_CHECK(cudaGraphDestroy(graph[l]));
  }
  for (int o = 0; o < GRAPH_OPS; ++o)
    for (int l = 0; l < W.nlocal; ++l) {
      for (int s = 0; s < 2; ++s) {
        free(hin[s][o][l]);
        free(hexp[s][o][l]);
      }
      free(eager[o][l]);
      free_rank(l, &st[o][l]);
    }
}

/* The calls of a non-blocking communicator, looked up: the CPU self-test's mock NCCL has none of them. */
typedef ncclResult_t (*AsyncErrorFn)(ncclComm_t, ncclResult_t*);
typedef ncclResult_t (*InitConfigFn)(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*);
typedef ncclResult_t (*FinalizeFn)(ncclComm_t);

/* Polls ncclCommGetAsyncError until it is not ncclInProgress (at most 60 s); returns the last state. */
static ncclResult_t wait_async(AsyncErrorFn async_error, ncclComm_t comm, double* waited_ms) {
  const double t0 = now_s();
  ncclResult_t state = ncclInProgress;
  while (state == ncclInProgress && now_s() - t0 < 60) {
    if (async_error(comm, &state) != ncclSuccess) return ncclInternalError;
  }
  if (waited_ms) *waited_ms = (now_s() - t0) * 1e3;
  return state;
}

/* A non-blocking init and finalize (config.blocking = 0; one process per rank): each may return ncclInProgress,
 * and ncclCommGetAsyncError says ncclInProgress until it is done; the communicator then serves an all-reduce. The
 * id travels from rank 0 over the communicator already made. Prints "nonblocking" lines, not case lines. */
static void check_nonblocking(void) {
  const AsyncErrorFn async_error = (AsyncErrorFn)newer_function("ncclCommGetAsyncError");
  const InitConfigFn init_config = (InitConfigFn)newer_function("ncclCommInitRankConfig");
  const FinalizeFn finalize_comm = (FinalizeFn)newer_function("ncclCommFinalize");
  if (W.nlocal != 1 || !async_error || !init_config || !finalize_comm) {
    printf("nonblocking: skipped (%s)\n", W.nlocal != 1 ? "one process per rank only" : "no non-blocking calls");
    return;
  }
  snprintf(g_current, sizeof g_current, "non-blocking init");
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  if (W.rank[0] == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  void* id_device = NULL;
  CUDA_CHECK(cudaMalloc(&id_device, sizeof id));
  CUDA_CHECK(cudaMemcpy(id_device, &id, sizeof id, cudaMemcpyHostToDevice));
  NCCL_CHECK(ncclBroadcast(id_device, id_device, sizeof id, ncclChar, 0, W.comm[0], W.stream[0]));
  CUDA_CHECK(cudaStreamSynchronize(W.stream[0]));
  CUDA_CHECK(cudaMemcpy(&id, id_device, sizeof id, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaFree(id_device));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = NULL;
  const ncclResult_t init = init_config(&comm, W.nranks, id, W.rank[0], &config);
  double init_ms = 0, finalize_ms = 0;
  const ncclResult_t ready = init == ncclSuccess || init == ncclInProgress ? wait_async(async_error, comm, &init_ms) : init;
  size_t wrong = (size_t)-1;
  ncclResult_t finalize = ncclInternalError, finalized = ncclInternalError;
  if (ready == ncclSuccess) {
    const size_t n = 4097;
    int32_t host[4097];
    int32_t* values = NULL;
    CUDA_CHECK(cudaMalloc((void**)&values, sizeof host));
    for (size_t i = 0; i < n; ++i) host[i] = W.rank[0] + 1 + (int32_t)i;
    CUDA_CHECK(cudaMemcpy(values, host, sizeof host, cudaMemcpyHostToDevice));
    const ncclResult_t call = ncclAllReduce(values, values, n, ncclInt32, ncclSum, comm, W.stream[0]);
    if (call == ncclSuccess || (call == ncclInProgress && wait_async(async_error, comm, NULL) == ncclSuccess)) {
      CUDA_CHECK(cudaStreamSynchronize(W.stream[0]));
      CUDA_CHECK(cudaMemcpy(host, values, sizeof host, cudaMemcpyDeviceToHost));
      wrong = 0;
      for (size_t i = 0; i < n; ++i) wrong += host[i] != W.nranks * (W.nranks + 1) / 2 + W.nranks * (int32_t)i;
    }
    CUDA_CHECK(cudaFree(values));
    finalize = finalize_comm(comm);
    finalized = finalize == ncclSuccess || finalize == ncclInProgress ? wait_async(async_error, comm, &finalize_ms) : finalize;
  }
  const int ok = (init == ncclSuccess || init == ncclInProgress) && ready == ncclSuccess && wrong == 0 &&
                 (finalize == ncclSuccess || finalize == ncclInProgress) && finalized == ncclSuccess;
  printf("nonblocking: rank %d init returned %d, ready %d after %.1f ms, all-reduce %zu wrong, finalize returned %d, "
         "done %d after %.1f ms: %s\n",
         W.rank[0], init, ready, init_ms, wrong, finalize, finalized, finalize_ms, ok ? "ok" : "WRONG");
  if (ok)
    ++W.passed;
  else
    ++W.failed;
  if (comm != NULL) NCCL_CHECK(ncclCommDestroy(comm));
}

/* ncclCommShrink (one process per rank only: each rank's shrink blocks until the others have joined it): the last
 * rank leaves, the others shrink it out and all-reduce on the child (its size, their ranks in order, the sum of
 * rank + 1 over the survivors). Prints "shrink" lines, not case lines: only the shim is compared with itself here.
 * Skipped where the library has no ncclCommShrink. */
static void check_shrink(void) {
  typedef ncclResult_t (*ShrinkFn)(ncclComm_t, int*, int, ncclComm_t*, ncclConfig_t*, int);
  const ShrinkFn shrink = (ShrinkFn)newer_function("ncclCommShrink");
  if (W.nlocal != 1 || W.nranks < 2 || shrink == NULL) {
    printf("shrink: skipped (%s)\n", shrink == NULL ? "no ncclCommShrink" : "one process per rank, 2 or more ranks");
    return;
  }
  int gone = W.nranks - 1;
  if (W.rank[0] == gone) {
    printf("shrink: rank %d leaves\n", W.rank[0]);
    return;
  }
  snprintf(g_current, sizeof g_current, "ncclCommShrink");
  ncclComm_t child = NULL;
  NCCL_CHECK(shrink(W.comm[0], &gone, 1, &child, NULL, NCCL_SHRINK_DEFAULT));
  int count = -1, rank = -1;
  NCCL_CHECK(ncclCommCount(child, &count));
  NCCL_CHECK(ncclCommUserRank(child, &rank));
  const size_t n = 4097;
  int32_t* values = NULL;
  CUDA_CHECK(cudaMalloc((void**)&values, n * sizeof(int32_t)));
  int32_t host[4097];
  for (size_t i = 0; i < n; ++i) host[i] = W.rank[0] + 1 + (int32_t)i;
  CUDA_CHECK(cudaMemcpy(values, host, sizeof host, cudaMemcpyHostToDevice));
  NCCL_CHECK(ncclAllReduce(values, values, n, ncclInt32, ncclSum, child, W.stream[0]));
  CUDA_CHECK(cudaStreamSynchronize(W.stream[0]));
  CUDA_CHECK(cudaMemcpy(host, values, sizeof host, cudaMemcpyDeviceToHost));
  const int survivors = W.nranks - 1;
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i) wrong += host[i] != survivors * (survivors + 1) / 2 + survivors * (int32_t)i;
  const int ok = count == survivors && rank == W.rank[0] && wrong == 0;
  printf("shrink: rank %d -> child rank %d of %d, all-reduce %zu wrong: %s\n", W.rank[0], rank, count, wrong,
         ok ? "ok" : "WRONG");
  if (ok)
    ++W.passed;
  else
    ++W.failed;
  CUDA_CHECK(cudaFree(values));
  NCCL_CHECK(ncclCommDestroy(child));
}

/* ------------------------------------------------------------------------------------------------------------
 * The suite. */
static const size_t kCounts[] = {0, 1, 7, 4097, (1u << 20) + 3};
#define NCOUNTS (sizeof kCounts / sizeof kCounts[0])
#define BIG_COUNT ((size_t)24 << 20) /* float32 allreduce larger than any internal buffer */

static void check_comm_queries(void) {
  for (int l = 0; l < W.nlocal; ++l) {
    int count = -1, rank = -1, dev = -1;
    snprintf(g_current, sizeof g_current, "comm queries");
    NCCL_CHECK(ncclCommCount(W.comm[l], &count));
    NCCL_CHECK(ncclCommUserRank(W.comm[l], &rank));
    NCCL_CHECK(ncclCommCuDevice(W.comm[l], &dev));
    char why[160];
    snprintf(why, sizeof why, " count %d rank %d device %d, expected %d %d %d", count, rank, dev, W.nranks, W.rank[l],
             W.dev[l]);
    const int ok = count == W.nranks && rank == W.rank[l] && dev == W.dev[l];
    int v[2] = {count, rank};
    report("comm.query", NULL, 0, W.rank[l], "", fnv1a(v, sizeof v, FNV_OFFSET), ok, why);
  }
}

/* The functions of newer NCCL releases on the shim's communicators (api_forwarded.cpp): growing is refused with
 * ncclInvalidUsage; suspend/resume and memory statistics go to the real NCCL's paired communicator, or fail with
 * ncclInvalidUsage and a last error naming the function where the real NCCL lacks them; either way the
 * communicator still serves collectives afterwards (run_suite's cases follow). Only under the shim (its marker
 * symbol): a real NCCL of this nccl.h has none of these functions. Prints "forwarded" lines, not case lines, so
 * that the shim's and NCCL's case lines still compare. */
static void check_forwarded(void) {
  if (!newer_function("braid_nccl_shim_marker")) {
    printf("forwarded: not the shim; skipped\n");
    return;
  }
  typedef ncclResult_t (*GrowFn)(ncclComm_t, int, const ncclUniqueId*, int, ncclComm_t*, ncclConfig_t*);
  typedef ncclResult_t (*UniqueIdFn)(ncclComm_t, ncclUniqueId*);
  typedef ncclResult_t (*SuspendFn)(ncclComm_t, int);
  typedef ncclResult_t (*ResumeFn)(ncclComm_t);
  typedef ncclResult_t (*MemStatsFn)(ncclComm_t, int, uint64_t*);
  const GrowFn grow = (GrowFn)newer_function("ncclCommGrow");
  const UniqueIdFn unique_id = (UniqueIdFn)newer_function("ncclCommGetUniqueId");
  const SuspendFn suspend = (SuspendFn)newer_function("ncclCommSuspend");
  const ResumeFn resume = (ResumeFn)newer_function("ncclCommResume");
  const MemStatsFn mem_stats = (MemStatsFn)newer_function("ncclCommMemStats");
  /* Looked up too: the mock NCCL of the CPU self-test has no ncclGetLastError (and no marker: it never gets here). */
  typedef const char* (*LastErrorFn)(ncclComm_t);
  const LastErrorFn last_error_of = (LastErrorFn)newer_function("ncclGetLastError");
  snprintf(g_current, sizeof g_current, "forwarded functions");
  for (int l = 0; l < W.nlocal; ++l) {
    const ncclComm_t comm = W.comm[l];
    int ok = grow && unique_id && suspend && resume && mem_stats && last_error_of;
    printf("forwarded: rank %d exports %s\n", W.rank[l], ok ? "all five" : "NOT all of them");
    if (!ok) {
      ++W.failed;
      continue;
    }
    ncclUniqueId id;
    ncclComm_t grown = NULL;
    const ncclResult_t g = unique_id(comm, &id), h = grow(comm, W.nranks + 1, &id, W.nranks, &grown, NULL);
    const int grow_ok = g == ncclInvalidUsage && h == ncclInvalidUsage && grown == NULL &&
                        strstr(last_error_of(comm), "ncclCommGrow") != NULL;
    printf("forwarded: rank %d ncclCommGetUniqueId %d ncclCommGrow %d (expected %d, %d): %s\n", W.rank[l], g, h,
           ncclInvalidUsage, ncclInvalidUsage, grow_ok ? "ok" : "WRONG");
    const ncclResult_t su = suspend(comm, 0);
    const int su_named = su == ncclSuccess || strstr(last_error_of(comm), "ncclCommSuspend") != NULL;
    const ncclResult_t re = su == ncclSuccess ? resume(comm) : ncclSuccess;
    uint64_t value = 0;
    const ncclResult_t ms = mem_stats(comm, 0, &value);
    const int ms_named = ms == ncclSuccess || strstr(last_error_of(comm), "ncclCommMemStats") != NULL;
    const int forward_ok = (su == ncclSuccess || su == ncclInvalidUsage) && su_named && re == ncclSuccess &&
                           (ms == ncclSuccess || ms == ncclInvalidUsage) && ms_named;
    printf("forwarded: rank %d ncclCommSuspend %d ncclCommResume %d ncclCommMemStats %d (0 where the real NCCL has "
           "them, %d naming the function where it does not): %s\n",
           W.rank[l], su, re, ms, ncclInvalidUsage, forward_ok ? "ok" : "WRONG");
    if (grow_ok && forward_ok)
      ++W.passed;
    else
      ++W.failed;
  }
}

static void run_suite(void) {
  const double t0 = now_s();
  Case c;
  const int last = W.nranks - 1;
  const ncclRedOp_t all_ops[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
  const ncclRedOp_t few_ops[] = {ncclSum, ncclMax, ncclAvg};
  check_comm_queries();
  check_forwarded();

  for (size_t o = 0; o < 5; ++o)
    for (size_t t = 0; t < NTYPES; ++t)
      for (size_t n = 0; n < NCOUNTS; ++n)
        for (int ip = 0; ip < 2; ++ip) {
          make_case(&c, C_ALLREDUCE, all_ops[o], &kTypes[t], kCounts[n], ip, 0);
          run_case(&c);
        }
  for (int ip = 0; ip < 2; ++ip) {
    make_case(&c, C_ALLREDUCE, ncclSum, type_named("float32"), BIG_COUNT, ip, 0);
    run_case(&c);
  }
  /* The legacy default stream (stream 0), as simple programs pass it. */
  for (size_t n = 0; n < NCOUNTS; ++n)
    for (int t = 0; t < 2; ++t) {
      make_case(&c, C_ALLREDUCE, ncclSum, type_named(t ? "bfloat16" : "float32"), kCounts[n], 0, 0);
      snprintf(c.name, sizeof c.name, "allreduce.sum.outofplace.stream0");
      c.default_stream = 1;
      run_case(&c);
    }
  /* ncclAllReduceConfig (NCCL 2.30+; the shim serves it on its communicators with braid's all-reduce), or
   * ncclAllReduce where the library lacks it: the same case lines either way. */
  for (size_t n = 0; n < NCOUNTS; ++n) {
    make_case(&c, C_ALLREDUCE, ncclSum, type_named("bfloat16"), kCounts[n], 0, 0);
    snprintf(c.name, sizeof c.name, "allreduce.sum.outofplace.config");
    c.config = 1;
    run_case(&c);
  }
  for (int coll = C_REDUCE; coll <= C_REDUCESCATTER; ++coll)
    for (size_t o = 0; o < 3; ++o)
      for (int root = 0; root <= last; root += (last > 0 ? last : 1))
        for (size_t t = 0; t < NTYPES; ++t)
          for (size_t n = 0; n < NCOUNTS; ++n)
            for (int ip = 0; ip < 2; ++ip) {
              if (coll == C_REDUCESCATTER && root != 0) continue;
              if (few_ops[o] == ncclAvg && !is_float(&kTypes[t])) continue;
              make_case(&c, (Coll)coll, few_ops[o], &kTypes[t], kCounts[n], ip, root);
              run_case(&c);
            }
  for (size_t t = 0; t < NTYPES; ++t)
    for (size_t n = 0; n < NCOUNTS; ++n) {
      for (int ip = 0; ip < 2; ++ip) {
        make_case(&c, C_ALLGATHER, ncclSum, &kTypes[t], kCounts[n], ip, 0);
        run_case(&c);
        for (int root = 0; root <= last; root += (last > 0 ? last : 1)) {
          make_case(&c, C_BROADCAST, ncclSum, &kTypes[t], kCounts[n], ip, root);
          run_case(&c);
        }
      }
      for (int coll = C_ALLTOALL; coll <= C_PAIR; ++coll) {
        for (int ip = 0; ip < (coll == C_ALLTOALL ? 2 : 1); ++ip) { /* alltoall in place: sendbuff == recvbuff */
          make_case(&c, (Coll)coll, ncclSum, &kTypes[t], kCounts[n], ip, 0);
          run_case(&c);
        }
      }
    }
  run_graphs(type_named("float32"), 4097);
  run_graphs(type_named("bfloat16"), (1u << 20) + 3);
  printf("nccl_check: communicators from %s done in %.1f s\n", W.comms, now_s() - t0);
}

/* ------------------------------------------------------------------------------------------------------------ */
static void create_streams(void) {
  for (int l = 0; l < W.nlocal; ++l) {
    CUDA_CHECK(cudaSetDevice(W.dev[l]));
    CUDA_CHECK(cudaStreamCreateWithFlags(&W.stream[l], cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&W.gstream[l], cudaStreamNonBlocking));
  }
}

static void destroy_world(void) {
  snprintf(g_current, sizeof g_current, "teardown (%s)", W.comms);
  for (int l = 0; l < W.nlocal; ++l) {
    CUDA_CHECK(cudaSetDevice(W.dev[l]));
    CUDA_CHECK(cudaStreamSynchronize(W.stream[l]));
    NCCL_CHECK(ncclCommDestroy(W.comm[l]));
    CUDA_CHECK(cudaStreamDestroy(W.stream[l]));
    CUDA_CHECK(cudaStreamDestroy(W.gstream[l]));
  }
}

static void usage(void) {
  fprintf(stderr,
          "usage: nccl_check -t N [--max-count N]\n"
          "       <launcher> nccl_check --id-file PATH [--id-timeout S] [--max-count N]\n"
          "  -t N            one process drives N GPUs (ncclCommInitAll, then grouped ncclCommInitRank)\n"
          "  --id-file PATH  one process per GPU (BRAID_RANK/BRAID_WORLD_SIZE/BRAID_LOCAL_RANK or\n"
          "                  RANK/WORLD_SIZE/LOCAL_RANK); rank 0 writes the unique id there, the others read it\n"
          "  --id-timeout S  how long ranks wait for the id file (default 60)\n"
          "  --max-count N   leave out cases with more elements than N (a quick run)\n");
  exit(2);
}

int main(int argc, char** argv) {
  g_prog = "nccl_check";
  setvbuf(stdout, NULL, _IOLBF, 0);
  const time_t start = time(NULL);
  int threads = 0;
  const char* id_file = NULL;
  double id_timeout = 60;
  W.max_count = (size_t)-1;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "-t") && v) threads = atoi(argv[++i]);
    else if (!strcmp(a, "--id-file") && v) id_file = argv[++i];
    else if (!strcmp(a, "--id-timeout") && v) id_timeout = atof(argv[++i]);
    else if (!strcmp(a, "--max-count") && v) W.max_count = parse_size(argv[++i]);
    else usage();
  }
  if (threads < 0 || threads > MAX_LOCAL) die("-t must be between 1 and %d", MAX_LOCAL);

  int version = 0;
  NCCL_CHECK(ncclGetVersion(&version));
  const int major = version >= 10000 ? version / 10000 : version / 1000;
  const int minor = version >= 10000 ? version / 100 % 100 : version / 100 % 10;
  printf("nccl_check: ncclGetVersion %d (%d.%d.%d), built against nccl.h %d.%d.%d\n", version, major, minor,
         version % 100, NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
  int ndev = 0;
  CUDA_CHECK(cudaGetDeviceCount(&ndev));

  if (threads > 0) {
    if (threads > ndev) die("-t %d needs %d GPUs, %d visible", threads, threads, ndev);
    W.nranks = W.nlocal = threads;
    for (int l = 0; l < threads; ++l) W.rank[l] = W.dev[l] = l;
    printf("nccl_check: one process, %d GPUs\n", threads);

    W.comms = "initall";
    snprintf(g_current, sizeof g_current, "ncclCommInitAll");
    NCCL_CHECK(ncclCommInitAll(W.comm, threads, NULL));
    create_streams();
    run_suite();
    destroy_world();

    /* The grouped init path; its suite leaves out the two largest counts (the first pass covered them). */
    W.comms = "group";
    const size_t max_count = W.max_count;
    if (W.max_count > 4097) W.max_count = 4097;
    snprintf(g_current, sizeof g_current, "grouped ncclCommInitRank");
    ncclUniqueId id;
    NCCL_CHECK(ncclGetUniqueId(&id));
    NCCL_CHECK(ncclGroupStart());
    for (int l = 0; l < threads; ++l) {
      CUDA_CHECK(cudaSetDevice(l));
      NCCL_CHECK(ncclCommInitRank(&W.comm[l], threads, id, l));
    }
    NCCL_CHECK(ncclGroupEnd());
    create_streams();
    run_suite();
    destroy_world();
    W.max_count = max_count;
  } else {
    const LaunchEnv env = launch_env();
    if (ndev < 1) die("no CUDA device");
    W.nranks = env.world;
    W.nlocal = 1;
    W.rank[0] = env.rank;
    W.dev[0] = env.local_rank % ndev;
    W.comms = "initrank";
    printf("nccl_check: rank %d of %d (launcher: %s), GPU %d\n", env.rank, env.world, env.launcher, W.dev[0]);
    CUDA_CHECK(cudaSetDevice(W.dev[0]));
    ncclUniqueId id;
    char path[4096] = "";
    if (env.rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    if (env.world > 1) {
      if (!id_file) die("%d ranks need --id-file PATH (a path all ranks can read)", env.world);
      id_file_path(id_file, path, sizeof path);
      exchange_id_file(path, env.rank, &id, sizeof id, id_timeout, start);
    }
    snprintf(g_current, sizeof g_current, "ncclCommInitRank");
    NCCL_CHECK(ncclCommInitRank(&W.comm[0], env.world, id, env.rank));
    create_streams();
    run_suite();
    /* Every rank has read the id by now (they all took part in the collectives; an init alone need not wait for
     * the others): remove the file, so no later run can pick it up. */
    if (env.rank == 0 && path[0]) unlink(path);
    check_nonblocking();
    check_shrink();
    destroy_world();
  }
  printf("nccl_check: %d passed, %d failed%s\n", W.passed, W.failed,
         W.skipped ? " (some avg cases skipped: rank count not a power of two)" : "");
  return W.failed == 0 && W.passed > 0 ? 0 : 1;
}
