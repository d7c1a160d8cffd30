/* A host-memory NCCL for the self-tests of nccl_check and nccl_shim_bench (see mock_cuda.c). All ranks of a
 * communicator must live in this process (-t N, or a world of one). A collective runs when its last rank
 * arrives; on a capturing stream the arrival is recorded and happens at graph launch. Reductions use the data
 * type's own arithmetic in rank order, and average floats as sum / nranks (not NCCL's premultiplied sum), so the
 * checker's host reference is compared with a computation made another way.
 * MOCK_NCCL_CORRUPT=k spoils the k-th collective (counting from 1, those with count > 0; "every": all of them),
 * as MOCK_NCCL_FAULT says:
 * flip (one output bit, the default), overrun (a byte past the output), send (a byte of the send buffer), skip
 * (the output is never written). The self-test uses them to prove nccl_check notices each kind of mistake. */
#define _POSIX_C_SOURCE 200809L

#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../fp8_bits.h"
#include "mock_cuda.h"

typedef enum { K_ALLREDUCE, K_REDUCE, K_REDUCESCATTER, K_ALLGATHER, K_BROADCAST, K_ALLTOALL } Kind;
typedef struct {
  Kind kind;
  const void* send;
  void* recv;
  size_t count;
  ncclDataType_t dt;
  ncclRedOp_t op;
  int root;
} CollArgs;

typedef struct Pending {
  uint64_t seq;
  int arrived;
  CollArgs* a; /* one per rank */
  struct Pending* next;
} Pending;

typedef struct P2P {
  const void* sbuf;
  void* rbuf;
  size_t bytes;
  struct P2P* next;
} P2P;

typedef struct Clique {
  ncclUniqueId id;
  int nranks, joined;
  Pending* pending;
  P2P **sends, **recvs; /* FIFO per (src, dst): [src * nranks + dst] */
  struct Clique* next;
} Clique;

struct ncclComm {
  int nranks, rank, dev;
  Clique* cl;
  uint64_t seq;
};

static Clique* g_cliques;
static int g_group_depth;
static long g_completed;

static void fail(const char* msg) {
  fprintf(stderr, "mock NCCL: %s\n", msg);
  abort();
}

static size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
  }
}

static float bf16_to_f(uint16_t h) {
  uint32_t x = (uint32_t)h << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}
static uint16_t f_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  x += 0x7fffu + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}

/* Element i of a buffer as a double (exact for everything the checks feed in), and back with the type's
 * rounding (integers wrap to their width). */
static double load(ncclDataType_t t, const void* p, size_t i) {
  switch (t) {
    case ncclInt8: return ((const int8_t*)p)[i];
    case ncclUint8: return ((const uint8_t*)p)[i];
    case ncclInt32: return ((const int32_t*)p)[i];
    case ncclUint32: return ((const uint32_t*)p)[i];
    case ncclInt64: return (double)((const int64_t*)p)[i];
    case ncclUint64: return (double)((const uint64_t*)p)[i];
    case ncclFloat16: return (double)((const _Float16*)p)[i];
    case ncclBfloat16: return bf16_to_f(((const uint16_t*)p)[i]);
    case ncclFloat32: return ((const float*)p)[i];
    case ncclFloat8e4m3: return fp8_to_f32(((const uint8_t*)p)[i], 0);
    case ncclFloat8e5m2: return fp8_to_f32(((const uint8_t*)p)[i], 1);
    default: return ((const double*)p)[i];
  }
}
static void store(ncclDataType_t t, void* p, size_t i, double v) {
  switch (t) {
    case ncclInt8: ((int8_t*)p)[i] = (int8_t)(int64_t)v; break;
    case ncclUint8: ((uint8_t*)p)[i] = (uint8_t)(int64_t)v; break;
    case ncclInt32: ((int32_t*)p)[i] = (int32_t)(int64_t)v; break;
    case ncclUint32: ((uint32_t*)p)[i] = (uint32_t)(int64_t)v; break;
    case ncclInt64: ((int64_t*)p)[i] = (int64_t)v; break;
    case ncclUint64: ((uint64_t*)p)[i] = (uint64_t)(int64_t)v; break;
    case ncclFloat16: ((_Float16*)p)[i] = (_Float16)v; break;
    case ncclBfloat16: ((uint16_t*)p)[i] = f_to_bf16((float)v); break;
    case ncclFloat32: ((float*)p)[i] = (float)v; break;
    case ncclFloat8e4m3: ((uint8_t*)p)[i] = f32_to_fp8((float)v, 0); break;
    case ncclFloat8e5m2: ((uint8_t*)p)[i] = f32_to_fp8((float)v, 1); break;
    default: ((double*)p)[i] = v; break;
  }
}
/* One reduction step, rounded to the type as a device would after each step. */
static double combine(ncclDataType_t t, ncclRedOp_t op, double a, double b) {
  double r;
  switch (op) {
    case ncclProd: r = a * b; break;
    case ncclMax: r = a > b ? a : b; break;
    case ncclMin: r = a < b ? a : b; break;
    default: r = a + b; break;
  }
  unsigned char tmp[8];
  store(t, tmp, 0, r);
  return load(t, tmp, 0);
}

/* out[k] = reduction over ranks q of in[q][off + k]. */
static void reduce_into(const CollArgs* a, unsigned char** in, int nranks, size_t off, void* out) {
  const ncclDataType_t t = a->dt;
  for (size_t k = 0; k < a->count; ++k) {
    double acc = load(t, in[0], off + k);
    for (int q = 1; q < nranks; ++q) acc = combine(t, a->op, acc, load(t, in[q], off + k));
    if (a->op == ncclAvg) acc = t <= ncclUint64 ? (double)((int64_t)acc / nranks) : acc / nranks;
    store(t, out, k, acc);
  }
}

static int spoil_this(size_t n) {
  const char* corrupt = getenv("MOCK_NCCL_CORRUPT");
  if (!corrupt || !n) return 0;
  ++g_completed;
  return !strcmp(corrupt, "every") || g_completed == atol(corrupt);
}
static const char* fault(void) {
  const char* f = getenv("MOCK_NCCL_FAULT");
  return f ? f : "flip";
}

static void execute(Clique* cl, Pending* p) {
  const int N = cl->nranks;
  const CollArgs* a0 = &p->a[0];
  const size_t sz = type_size(a0->dt), n = a0->count;
  for (int q = 1; q < N; ++q)
    if (p->a[q].kind != a0->kind || p->a[q].count != n || p->a[q].dt != a0->dt || p->a[q].op != a0->op ||
        p->a[q].root != a0->root)
      fail("ranks called different collectives at the same point");
  /* Every input is copied before any output is written: in-place layouts may alias them. */
  const size_t in_elems = (a0->kind == K_REDUCESCATTER || a0->kind == K_ALLTOALL) ? N * n : n;
  const size_t out_elems = (a0->kind == K_ALLGATHER || a0->kind == K_ALLTOALL) ? N * n : n;
  const int spoil = spoil_this(n);
  const int victim = a0->kind == K_REDUCE || a0->kind == K_BROADCAST ? a0->root : 0;
  if (spoil && !strcmp(fault(), "skip")) return;
  unsigned char** in = calloc((size_t)N, sizeof *in);
  for (int q = 0; q < N; ++q) {
    in[q] = malloc(in_elems * sz + 1);
    const int needed = a0->kind != K_BROADCAST || q == a0->root;
    if (needed && in_elems) memcpy(in[q], p->a[q].send, in_elems * sz);
  }
  switch (a0->kind) {
    case K_ALLREDUCE:
      for (int r = 0; r < N; ++r) reduce_into(&p->a[r], in, N, 0, p->a[r].recv);
      break;
    case K_REDUCE: reduce_into(&p->a[a0->root], in, N, 0, p->a[a0->root].recv); break;
    case K_REDUCESCATTER:
      for (int r = 0; r < N; ++r) reduce_into(&p->a[r], in, N, (size_t)r * n, p->a[r].recv);
      break;
    case K_ALLGATHER:
      for (int r = 0; r < N; ++r)
        for (int q = 0; q < N; ++q) memcpy((unsigned char*)p->a[r].recv + (size_t)q * n * sz, in[q], n * sz);
      break;
    case K_BROADCAST:
      for (int r = 0; r < N; ++r) memcpy(p->a[r].recv, in[a0->root], n * sz);
      break;
    case K_ALLTOALL:
      for (int r = 0; r < N; ++r)
        for (int q = 0; q < N; ++q)
          memcpy((unsigned char*)p->a[r].recv + (size_t)q * n * sz, in[q] + (size_t)r * n * sz, n * sz);
      break;
  }
  for (int q = 0; q < N; ++q) free(in[q]);
  free(in);
  if (spoil) {
    unsigned char* out = p->a[victim].recv;
    if (!strcmp(fault(), "overrun")) out[out_elems * sz] ^= 1;
    else if (!strcmp(fault(), "send")) ((unsigned char*)p->a[victim].send)[0] ^= 1;
    else out[0] ^= 1;
  }
}

typedef struct {
  ncclComm_t comm;
  CollArgs a;
} Arrival;

static void arrive(void* arg) {
  const Arrival* v = arg;
  Clique* cl = v->comm->cl;
  if (cl->joined < cl->nranks) fail("a communicator whose ranks are not all in this process (the mock is one process)");
  const uint64_t seq = v->comm->seq++;
  Pending** link = &cl->pending;
  while (*link && (*link)->seq != seq) link = &(*link)->next;
  if (!*link) {
    *link = calloc(1, sizeof **link);
    (*link)->seq = seq;
    (*link)->a = calloc((size_t)cl->nranks, sizeof(CollArgs));
  }
  Pending* p = *link;
  p->a[v->comm->rank] = v->a;
  if (++p->arrived == cl->nranks) {
    execute(cl, p);
    *link = p->next;
    free(p->a);
    free(p);
  }
}

static ncclResult_t post(ncclComm_t comm, cudaStream_t s, CollArgs a) {
  if (!comm) return ncclInvalidArgument;
  Arrival* v = malloc(sizeof *v);
  v->comm = comm, v->a = a;
  mock_stream_enqueue(s, arrive, v);
  return ncclSuccess;
}

typedef struct {
  ncclComm_t comm;
  int peer, is_send;
  const void* sbuf;
  void* rbuf;
  size_t bytes;
} P2PArrival;

static void p2p_arrive(void* arg) {
  const P2PArrival* v = arg;
  Clique* cl = v->comm->cl;
  const int N = cl->nranks;
  const int src = v->is_send ? v->comm->rank : v->peer, dst = v->is_send ? v->peer : v->comm->rank;
  P2P** mine = v->is_send ? &cl->sends[src * N + dst] : &cl->recvs[src * N + dst];
  P2P** theirs = v->is_send ? &cl->recvs[src * N + dst] : &cl->sends[src * N + dst];
  if (*theirs) {
    P2P* t = *theirs;
    if (t->bytes != v->bytes) fail("send and receive sizes differ");
    if (v->is_send) memcpy(t->rbuf, v->sbuf, v->bytes);
    else memcpy(v->rbuf, t->sbuf, v->bytes);
    *theirs = t->next;
    free(t);
    return;
  }
  P2P* e = calloc(1, sizeof *e);
  e->sbuf = v->sbuf, e->rbuf = v->rbuf, e->bytes = v->bytes;
  while (*mine) mine = &(*mine)->next;
  *mine = e;
}

static ncclResult_t post_p2p(ncclComm_t comm, cudaStream_t s, int peer, int is_send, const void* sbuf, void* rbuf,
                             size_t bytes) {
  if (!comm) return ncclInvalidArgument;
  if (peer < 0 || peer >= comm->nranks) return ncclInvalidArgument;
  P2PArrival* v = malloc(sizeof *v);
  *v = (P2PArrival){comm, peer, is_send, sbuf, rbuf, bytes};
  mock_stream_enqueue(s, p2p_arrive, v);
  return ncclSuccess;
}

/* ---- the API ---- */
ncclResult_t ncclGetVersion(int* v) {
  if (!v) return ncclInvalidArgument;
  const char* e = getenv("MOCK_NCCL_VERSION");
  *v = e ? atoi(e) : 22809;
  return ncclSuccess;
}
const char* ncclGetErrorString(ncclResult_t r) { return r == ncclSuccess ? "no error" : "mock error"; }
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  static unsigned counter;
  if (!id) return ncclInvalidArgument;
  memset(id, 0, sizeof *id);
  snprintf(id->internal, sizeof id->internal, "mock-%ld-%u", (long)getpid(), ++counter);
  return ncclSuccess;
}
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  if (!comm || nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  Clique* cl = g_cliques;
  while (cl && memcmp(&cl->id, &id, sizeof id)) cl = cl->next;
  if (!cl) {
    cl = calloc(1, sizeof *cl);
    cl->id = id, cl->nranks = nranks;
    cl->sends = calloc((size_t)nranks * nranks, sizeof(P2P*));
    cl->recvs = calloc((size_t)nranks * nranks, sizeof(P2P*));
    cl->next = g_cliques;
    g_cliques = cl;
  }
  ncclComm_t c = calloc(1, sizeof *c);
  c->nranks = nranks, c->rank = rank, c->cl = cl;
  cudaGetDevice(&c->dev);
  ++cl->joined;
  *comm = c;
  return ncclSuccess;
}
ncclResult_t ncclCommInitAll(ncclComm_t* comms, int n, const int* devlist) {
  if (!comms || n < 0) return ncclInvalidArgument;
  ncclUniqueId id;
  ncclGetUniqueId(&id);
  for (int i = 0; i < n; ++i) {
    cudaSetDevice(devlist ? devlist[i] : i);
    ncclCommInitRank(&comms[i], n, id, i);
  }
  return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  free(comm); /* the clique is left behind: the self-tests are short */
  return ncclSuccess;
}
ncclResult_t ncclCommCount(const ncclComm_t comm, int* n) {
  if (!comm || !n) return ncclInvalidArgument;
  *n = comm->nranks;
  return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* r) {
  if (!comm || !r) return ncclInvalidArgument;
  *r = comm->rank;
  return ncclSuccess;
}
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* d) {
  if (!comm || !d) return ncclInvalidArgument;
  *d = comm->dev;
  return ncclSuccess;
}
ncclResult_t ncclGroupStart(void) {
  ++g_group_depth;
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd(void) {
  if (g_group_depth == 0) return ncclInvalidUsage;
  --g_group_depth;
  return ncclSuccess;
}
ncclResult_t ncclAllReduce(const void* s, void* r, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                           cudaStream_t st) {
  return post(c, st, (CollArgs){K_ALLREDUCE, s, r, n, t, op, 0});
}
ncclResult_t ncclReduce(const void* s, void* r, size_t n, ncclDataType_t t, ncclRedOp_t op, int root, ncclComm_t c,
                        cudaStream_t st) {
  return post(c, st, (CollArgs){K_REDUCE, s, r, n, t, op, root});
}
ncclResult_t ncclReduceScatter(const void* s, void* r, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                               cudaStream_t st) {
  return post(c, st, (CollArgs){K_REDUCESCATTER, s, r, n, t, op, 0});
}
ncclResult_t ncclAllGather(const void* s, void* r, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t st) {
  return post(c, st, (CollArgs){K_ALLGATHER, s, r, n, t, ncclSum, 0});
}
ncclResult_t ncclBroadcast(const void* s, void* r, size_t n, ncclDataType_t t, int root, ncclComm_t c,
                           cudaStream_t st) {
  return post(c, st, (CollArgs){K_BROADCAST, s, r, n, t, ncclSum, root});
}
ncclResult_t ncclAlltoAll(const void* s, void* r, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t st) {
  return post(c, st, (CollArgs){K_ALLTOALL, s, r, n, t, ncclSum, 0});
}
ncclResult_t ncclSend(const void* s, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st) {
  return post_p2p(c, st, peer, 1, s, NULL, n * type_size(t));
}
ncclResult_t ncclRecv(void* r, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st) {
  return post_p2p(c, st, peer, 0, NULL, r, n * type_size(t));
}
