/* A host-memory stand-in for the few CUDA runtime calls nccl_check and nccl_shim_bench make, so both programs'
 * own logic (layouts, references, hashes, graph replays, id files, timing loop, output) can be tested on a
 * machine without a GPU. It is no model of CUDA: "device" memory is malloc'd, every operation runs at once on
 * the calling thread, except on a capturing stream, where it is recorded and run by cudaGraphLaunch.
 * Used only by the *_mock self-test builds; the real programs link cudart. */
#define _POSIX_C_SOURCE 200809L

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mock_cuda.h"

struct MockNode {
  void (*fn)(void*);
  void* arg;
  struct MockNode* next;
};
struct CUstream_st {
  int capturing;
  struct MockNode *head, *tail;
};
struct CUgraph_st {
  struct MockNode* head;
  int refs; /* the graph, and each instantiation: CUDA lets a graph be destroyed while its execs live */
};
struct CUgraphExec_st {
  struct CUgraph_st* graph;
  int launches;
};
struct CUevent_st {
  double t;
};

static _Thread_local int g_device;

static int device_count(void) {
  const char* v = getenv("MOCK_CUDA_DEVICES");
  return v ? atoi(v) : 8;
}

void mock_stream_enqueue(cudaStream_t s, void (*fn)(void*), void* arg) {
  if (!s || !s->capturing) {
    fn(arg);
    free(arg);
    return;
  }
  struct MockNode* n = calloc(1, sizeof *n);
  n->fn = fn, n->arg = arg;
  if (s->tail) s->tail->next = n;
  else s->head = n;
  s->tail = n;
}

int mock_stream_capturing(cudaStream_t s) { return s && s->capturing; }

typedef struct {
  void* dst;
  const void* src;
  size_t bytes;
  int value;
} CopyArg;
static void do_copy(void* a) {
  CopyArg* c = a;
  memcpy(c->dst, c->src, c->bytes);
}
static void do_set(void* a) {
  CopyArg* c = a;
  memset(c->dst, c->value, c->bytes);
}

cudaError_t cudaGetDeviceCount(int* n) {
  *n = device_count();
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
  if (d < 0 || d >= device_count()) return cudaErrorInvalidDevice;
  g_device = d;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
  *d = g_device;
  return cudaSuccess;
}
const char* cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error (mock)" : "error (mock)"; }
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
cudaError_t cudaMalloc(void** p, size_t bytes) {
  *p = malloc(bytes ? bytes : 1);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void* p) {
  free(p);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, enum cudaMemcpyKind kind) {
  (void)kind;
  memcpy(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t s) {
  (void)kind;
  CopyArg* a = malloc(sizeof *a);
  *a = (CopyArg){dst, src, bytes, 0};
  mock_stream_enqueue(s, do_copy, a);
  return cudaSuccess;
}
cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
  memset(dst, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t s) {
  CopyArg* a = malloc(sizeof *a);
  *a = (CopyArg){dst, NULL, bytes, value};
  mock_stream_enqueue(s, do_set, a);
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  (void)flags;
  *s = calloc(1, sizeof **s);
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  free(s);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  (void)s;
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode) {
  (void)mode;
  if (!s || s->capturing) return cudaErrorIllegalState;
  s->capturing = 1;
  s->head = s->tail = NULL;
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* g) {
  if (!s || !s->capturing) return cudaErrorIllegalState;
  *g = calloc(1, sizeof **g);
  (*g)->head = s->head;
  (*g)->refs = 1;
  s->capturing = 0;
  s->head = s->tail = NULL;
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* e, cudaGraph_t g, unsigned long long flags) {
  (void)flags;
  *e = calloc(1, sizeof **e);
  (*e)->graph = g; /* shared: the mock never edits a graph */
  ++g->refs;
  return cudaSuccess;
}
/* MOCK_CUDA_GRAPH_FAULT=N: from the N-th launch of an instantiated graph on, its first node is left out (a graph
 * that does not replay all it captured); the self-test uses it to prove nccl_check checks every replay. */
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s) {
  if (s && s->capturing) return cudaErrorIllegalState;
  const char* fault = getenv("MOCK_CUDA_GRAPH_FAULT");
  const int skip_first = fault && ++e->launches >= atoi(fault);
  for (struct MockNode* n = e->graph->head; n; n = n->next)
    if (!(skip_first && n == e->graph->head)) n->fn(n->arg);
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  if (--g->refs > 0) return cudaSuccess;
  for (struct MockNode* n = g->head; n;) {
    struct MockNode* next = n->next;
    free(n->arg);
    free(n);
    n = next;
  }
  free(g);
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) {
  cudaGraphDestroy(e->graph);
  free(e);
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = calloc(1, sizeof **e);
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  free(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  (void)s;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  e->t = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  (void)e;
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  *ms = (float)((b->t - a->t) * 1e3);
  return cudaSuccess;
}
