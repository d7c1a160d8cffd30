/* nccl_shim_bench: allreduce timings of braid's libnccl.so.2 shim and of the real NCCL, in one run.
 *
 * Both libraries are dlopen-ed into the same process (RTLD_LOCAL, so each call goes to the library it was looked
 * up in) and every function used is resolved with dlsym into a table typed from nccl.h's own declarations; the
 * program links no NCCL. Each rank (one process per GPU, launched like nccl_check) makes one communicator with
 * each library. Per size, each library's allreduce (bfloat16, sum, out of place) is captured GRAPH_ITERS times
 * into one CUDA graph; the graph is launched n times, each launch timed with CUDA events, and the per-call time
 * is the median over launches. The two libraries take turns (shim, nccl, shim, nccl, ...) several times per size
 * so clock and thermal drift hit both alike, and the median of the turns is kept. A rank reports the slowest
 * rank's time (max over ranks). Each size is also checked once per library: small integer inputs whose sums are
 * exact in bfloat16, so the expected output is known bit for bit.
 *
 *   <launcher> nccl_shim_bench --shim PATH --nccl PATH --id-file PATH [-b 8K] [-e 512M] [-f 2] [-n 20]
 *                              [--graph-iters 20] [--turns 3] [--json FILE]
 */
#define _GNU_SOURCE /* dladdr, dl_iterate_phdr: which files were really loaded */

#include <dlfcn.h>
#include <link.h>
#include <nccl.h>
#include <cuda_runtime.h>

#include "shim_test_common.h"

/* One NCCL library: its handle and the functions this program calls, typed by nccl.h's declarations. */
typedef struct {
  const char* label; /* "shim" or "nccl" */
  const char* path;
  const char* loaded_from; /* the file the dynamic loader actually mapped */
  void* handle;
  int version;
  __typeof__(ncclGetVersion)* getVersion;
  __typeof__(ncclGetUniqueId)* getUniqueId;
  __typeof__(ncclCommInitRank)* commInitRank;
  __typeof__(ncclCommDestroy)* commDestroy;
  __typeof__(ncclCommCount)* commCount;
  __typeof__(ncclAllReduce)* allReduce;
  __typeof__(ncclGetErrorString)* getErrorString;
  ncclComm_t comm;
} Lib;

#define CUDA_CHECK(call)                                                                                   \
  do {                                                                                                     \
    cudaError_t e_ = (call);                                                                               \
    if (e_ != cudaSuccess) die("%s:%d: %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_));        \
  } while (0)
#define LIB_CHECK(lib, call)                                                                               \
  do {                                                                                                     \
    ncclResult_t r_ = (lib)->call;                                                                         \
    if (r_ != ncclSuccess)                                                                                 \
      die("%s: %s returned %d (%s)", (lib)->label, #call, (int)r_, (lib)->getErrorString(r_));            \
  } while (0)

static void* resolve(Lib* lib, const char* name) {
  void* f = dlsym(lib->handle, name);
  if (!f) die("%s (%s) does not export %s", lib->label, lib->path, name);
  return f;
}

static void load_lib(Lib* lib, const char* label, const char* path) {
  lib->label = label;
  lib->path = path;
  lib->handle = dlopen(path, RTLD_LOCAL | RTLD_NOW);
  if (!lib->handle) die("cannot load %s library %s: %s", label, path, dlerror());
  lib->getVersion = (__typeof__(lib->getVersion))resolve(lib, "ncclGetVersion");
  lib->getUniqueId = (__typeof__(lib->getUniqueId))resolve(lib, "ncclGetUniqueId");
  lib->commInitRank = (__typeof__(lib->commInitRank))resolve(lib, "ncclCommInitRank");
  lib->commDestroy = (__typeof__(lib->commDestroy))resolve(lib, "ncclCommDestroy");
  lib->commCount = (__typeof__(lib->commCount))resolve(lib, "ncclCommCount");
  lib->allReduce = (__typeof__(lib->allReduce))resolve(lib, "ncclAllReduce");
  lib->getErrorString = (__typeof__(lib->getErrorString))resolve(lib, "ncclGetErrorString");
  Dl_info info;
  lib->loaded_from = dladdr((void*)lib->allReduce, &info) && info.dli_fname ? info.dli_fname : "?";
  LIB_CHECK(lib, getVersion(&lib->version));
}

/* Every loaded object with "nccl" in its name: shows whether the shim's own fallback mapped a second NCCL. */
static int list_nccl_objects(struct dl_phdr_info* info, size_t size, void* data) {
  (void)size;
  (void)data;
  if (info->dlpi_name && strstr(info->dlpi_name, "nccl")) printf("#   loaded: %s\n", info->dlpi_name);
  return 0;
}

static int cmp_double(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}
static double median(double* v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Inputs: rank r's element i is 1 + (a pseudo-random value below 256/nranks), repeating with period kPeriod, so
 * every partial sum is an integer <= 256, exact in bfloat16 (8 significant bits), whatever the order. */
enum { kPeriod = 4099 };

static uint16_t bf16_of_int(int v) {
  float f = (float)v;
  uint32_t x;
  memcpy(&x, &f, 4);
  return (uint16_t)(x >> 16); /* exact: v <= 256 */
}

static int input_value(int rank, int nranks, size_t i) {
  const uint64_t k = (uint64_t)(256 / nranks);
  return 1 + (int)(rnd64(0x5eed0000ULL + (uint64_t)rank, i % kPeriod) % (k ? k : 1));
}

typedef struct {
  size_t bytes, count;
  double us[2];     /* per allreduce, max over ranks: [0] shim, [1] nccl */
  double wrong[2];  /* wrong elements, summed over ranks */
} Row;

int main(int argc, char** argv) {
  g_prog = "nccl_shim_bench";
  setvbuf(stdout, NULL, _IOLBF, 0);
  const time_t start = time(NULL);
  const char *shim_path = NULL, *nccl_path = NULL, *id_file = NULL, *json = NULL;
  size_t min_bytes = 8 << 10, max_bytes = (size_t)512 << 20;
  double factor = 2, id_timeout = 60;
  int iters = 20, graph_iters = 20, turns = 3, warmup = 5;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    if (i + 1 >= argc) die("option %s needs a value (or is unknown)", a);
    const char* v = argv[++i];
    if (!strcmp(a, "--shim")) shim_path = v;
    else if (!strcmp(a, "--nccl")) nccl_path = v;
    else if (!strcmp(a, "--id-file")) id_file = v;
    else if (!strcmp(a, "--id-timeout")) id_timeout = atof(v);
    else if (!strcmp(a, "-b")) min_bytes = parse_size(v);
    else if (!strcmp(a, "-e")) max_bytes = parse_size(v);
    else if (!strcmp(a, "-f")) factor = atof(v);
    else if (!strcmp(a, "-n")) iters = atoi(v);
    else if (!strcmp(a, "--graph-iters")) graph_iters = atoi(v);
    else if (!strcmp(a, "--turns")) turns = atoi(v);
    else if (!strcmp(a, "--warmup")) warmup = atoi(v);
    else if (!strcmp(a, "--json")) json = v;
    else die("unknown option %s", a);
  }
  if (!shim_path || !nccl_path)
    die("usage: nccl_shim_bench --shim PATH --nccl PATH [--id-file PATH] [-b 8K] [-e 512M] [-f 2] [-n 20] "
        "[--graph-iters 20] [--turns 3] [--warmup 5] [--json FILE]");
  if (min_bytes < 2 || max_bytes < min_bytes || factor <= 1 || iters < 1 || graph_iters < 1 || turns < 1 ||
      turns > 16 || warmup < 0)
    die("bad sizes or counts (-b >= 2, -e >= -b, -f > 1, -n >= 1, --graph-iters >= 1, 1 <= --turns <= 16)");

  const LaunchEnv env = launch_env();
  const int N = env.world;
  int ndev = 0;
  CUDA_CHECK(cudaGetDeviceCount(&ndev));
  if (ndev < 1) die("no CUDA device");
  const int dev = env.local_rank % ndev;
  CUDA_CHECK(cudaSetDevice(dev));

  /* The real NCCL is loaded first: a library that later asks the loader for "libnccl.so.2" by name (the shim's
   * fallback may) then finds it, rather than the shim, which carries the same soname. */
  Lib libs[2];
  load_lib(&libs[1], "nccl", nccl_path);
  load_lib(&libs[0], "shim", shim_path);
  Lib* const shim = &libs[0];
  Lib* const nccl = &libs[1];

  ncclUniqueId ids[2];
  memset(ids, 0, sizeof ids);
  if (env.rank == 0) {
    LIB_CHECK(shim, getUniqueId(&ids[0]));
    LIB_CHECK(nccl, getUniqueId(&ids[1]));
  }
  char path[4096] = "";
  if (N > 1) {
    if (!id_file) die("%d ranks need --id-file PATH", N);
    id_file_path(id_file, path, sizeof path);
    exchange_id_file(path, env.rank, ids, sizeof ids, id_timeout, start);
  }
  LIB_CHECK(nccl, commInitRank(&nccl->comm, N, ids[1], env.rank));
  LIB_CHECK(shim, commInitRank(&shim->comm, N, ids[0], env.rank));
  for (int l = 0; l < 2; ++l) {
    int n = -1;
    LIB_CHECK(&libs[l], commCount(libs[l].comm, &n));
    if (n != N) die("%s communicator has %d ranks, expected %d", libs[l].label, n, N);
  }

  if (env.rank == 0) {
    printf("# nccl_shim_bench: allreduce bfloat16 sum, out of place, %d ranks (launcher: %s)\n", N, env.launcher);
    printf("# per call: median over n launches of a CUDA graph of %d allreduces; median of %d turns per library\n"
           "#           (shim, nccl, shim, nccl, ...); the slowest rank's time\n",
           graph_iters, turns);
    for (int l = 0; l < 2; ++l)
      printf("# %s: %s (mapped from %s), ncclGetVersion %d\n", libs[l].label, libs[l].path, libs[l].loaded_from,
             libs[l].version);
    dl_iterate_phdr(list_nccl_objects, NULL);
    printf("# %12s %12s %8s %10s %10s %9s %10s %10s %6s %6s\n", "size", "count", "type", "shim_us", "nccl_us",
           "shim/nccl", "shim_busbw", "nccl_busbw", "#wrong", "#wrong");
    printf("# %12s %12s %8s %10s %10s %9s %10s %10s %6s %6s\n", "(B)", "(elements)", "", "", "", "", "(GB/s)",
           "(GB/s)", "shim", "nccl");
  }

  /* Buffers for the largest size, shared by both libraries; the input pattern is uploaded once. */
  const size_t max_count = max_bytes / 2;
  uint16_t* host_in = malloc(max_count * 2);
  uint16_t* host_out = malloc(max_count * 2);
  if (!host_in || !host_out) die("out of host memory for %zu bytes", max_bytes);
  uint16_t expected[kPeriod];
  for (size_t i = 0; i < kPeriod; ++i) {
    int sum = 0;
    for (int r = 0; r < N; ++r) sum += input_value(r, N, i);
    expected[i] = bf16_of_int(sum);
  }
  uint16_t pattern[kPeriod];
  for (size_t i = 0; i < kPeriod; ++i) pattern[i] = bf16_of_int(input_value(env.rank, N, i));
  for (size_t i = 0; i < max_count; i += kPeriod)
    memcpy(host_in + i, pattern, (max_count - i < kPeriod ? max_count - i : kPeriod) * 2);
  void *send, *recv;
  double* dstats; /* a small device buffer for the max/sum over ranks, reduced with the real NCCL */
  CUDA_CHECK(cudaMalloc(&send, max_count * 2));
  CUDA_CHECK(cudaMalloc(&recv, max_count * 2));
  CUDA_CHECK(cudaMalloc((void**)&dstats, 4 * sizeof(double)));
  CUDA_CHECK(cudaMemset(dstats, 0, 4 * sizeof(double)));
  CUDA_CHECK(cudaMemcpy(send, host_in, max_count * 2, cudaMemcpyHostToDevice));
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const int max_iters = iters < 3 ? 3 : iters;
  cudaEvent_t* ev = malloc(sizeof(cudaEvent_t) * 2 * (size_t)max_iters);
  for (int i = 0; i < 2 * max_iters; ++i) CUDA_CHECK(cudaEventCreate(&ev[i]));
  double* samples = malloc(sizeof(double) * (size_t)max_iters);
  double* turn_us = malloc(sizeof(double) * (size_t)turns);

  Row rows[64];
  int nrows = 0;
  for (double b = (double)min_bytes; b <= (double)max_bytes * 1.0000001 && nrows < 64; b *= factor) {
    Row* row = &rows[nrows++];
    row->bytes = ((size_t)b) & ~(size_t)1;
    row->count = row->bytes / 2;
    /* Fewer launches above 64 MB bound the run time; at least 3 for a median. */
    int n = iters;
    if (row->bytes > ((size_t)64 << 20)) n = (int)((double)iters * (double)((size_t)64 << 20) / (double)row->bytes);
    if (n < 3) n = 3;
    if (n > max_iters) n = max_iters;

    cudaGraphExec_t exec[2];
    for (int l = 0; l < 2; ++l) {
      Lib* lib = &libs[l];
      for (int w = 0; w < warmup; ++w)
        LIB_CHECK(lib, allReduce(send, recv, row->count, ncclBfloat16, ncclSum, lib->comm, stream));
      CUDA_CHECK(cudaStreamSynchronize(stream));
      cudaGraph_t graph;
      CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
      for (int g = 0; g < graph_iters; ++g)
        LIB_CHECK(lib, allReduce(send, recv, row->count, ncclBfloat16, ncclSum, lib->comm, stream));
      CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
      CUDA_CHECK(cudaGraphInstantiate(&exec[l], graph, 0));
      CUDA_CHECK(cudaGraphDestroy(graph));
      CUDA_CHECK(cudaGraphLaunch(exec[l], stream)); /* first launch uploads the graph: not timed */
      CUDA_CHECK(cudaStreamSynchronize(stream));
    }
    double per_turn[2][16]; /* [library][turn] */
    for (int t = 0; t < turns; ++t)
      for (int l = 0; l < 2; ++l) {
        /* Lines the ranks up (through the real NCCL) before each library's turn. */
        LIB_CHECK(nccl, allReduce(dstats, dstats, 1, ncclFloat64, ncclSum, nccl->comm, stream));
        CUDA_CHECK(cudaStreamSynchronize(stream));
        for (int i = 0; i < n; ++i) {
          CUDA_CHECK(cudaEventRecord(ev[2 * i], stream));
          CUDA_CHECK(cudaGraphLaunch(exec[l], stream));
          CUDA_CHECK(cudaEventRecord(ev[2 * i + 1], stream));
        }
        CUDA_CHECK(cudaStreamSynchronize(stream));
        for (int i = 0; i < n; ++i) {
          float ms = 0;
          CUDA_CHECK(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
          samples[i] = 1e3 * (double)ms / graph_iters;
        }
        per_turn[l][t] = median(samples, n);
      }
    double stats[4];
    for (int l = 0; l < 2; ++l) {
      for (int t = 0; t < turns; ++t) turn_us[t] = per_turn[l][t];
      stats[l] = median(turn_us, turns);
      /* Correctness, once per size and library: poison the output, replay the graph, compare every element. */
      CUDA_CHECK(cudaMemsetAsync(recv, 0xff, row->bytes, stream));
      CUDA_CHECK(cudaGraphLaunch(exec[l], stream));
      CUDA_CHECK(cudaMemcpyAsync(host_out, recv, row->bytes, cudaMemcpyDeviceToHost, stream));
      CUDA_CHECK(cudaStreamSynchronize(stream));
      double wrong = 0;
      for (size_t i = 0, j = 0; i < row->count; ++i, j = j + 1 == kPeriod ? 0 : j + 1) wrong += host_out[i] != expected[j];
      stats[2 + l] = wrong;
      CUDA_CHECK(cudaGraphExecDestroy(exec[l]));
    }
    /* Slowest rank's time (max), and wrong elements over all ranks (sum), through the real NCCL. */
    CUDA_CHECK(cudaMemcpy(dstats, stats, sizeof stats, cudaMemcpyHostToDevice));
    LIB_CHECK(nccl, allReduce(dstats, dstats, 2, ncclFloat64, ncclMax, nccl->comm, stream));
    LIB_CHECK(nccl, allReduce(dstats + 2, dstats + 2, 2, ncclFloat64, ncclSum, nccl->comm, stream));
    CUDA_CHECK(cudaMemcpyAsync(stats, dstats, sizeof stats, cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    row->us[0] = stats[0], row->us[1] = stats[1], row->wrong[0] = stats[2], row->wrong[1] = stats[3];
    if (env.rank == 0) {
      const double bus = 2.0 * (N - 1) / N; /* allreduce bus bandwidth factor, as nccl-tests */
      printf("  %12zu %12zu %8s %10.2f %10.2f %9.3f %10.2f %10.2f %6.0f %6.0f\n", row->bytes, row->count, "bf16",
             row->us[0], row->us[1], row->us[0] / row->us[1], bus * (double)row->bytes / (row->us[0] * 1e3),
             bus * (double)row->bytes / (row->us[1] * 1e3), row->wrong[0], row->wrong[1]);
    }
  }

  /* Every rank has read the ids by now (they all took part in the allreduces): no later run may pick them up. */
  if (env.rank == 0 && path[0]) unlink(path);
  double total_wrong = 0;
  for (int i = 0; i < nrows; ++i) total_wrong += rows[i].wrong[0] + rows[i].wrong[1];
  if (env.rank == 0) {
    printf("# #wrong total: %.0f\n", total_wrong);
    if (json) {
      FILE* f = fopen(json, "w");
      if (!f) die("cannot write %s: %s", json, strerror(errno));
      fprintf(f, "{\n  \"benchmark\": \"allreduce bfloat16 sum out-of-place\",\n  \"nranks\": %d,\n", N);
      fprintf(f, "  \"graph_iters\": %d,\n  \"turns\": %d,\n", graph_iters, turns);
      for (int l = 0; l < 2; ++l)
        fprintf(f, "  \"%s\": {\"path\": \"%s\", \"loaded_from\": \"%s\", \"version\": %d},\n", libs[l].label,
                libs[l].path, libs[l].loaded_from, libs[l].version);
      fprintf(f, "  \"rows\": [\n");
      for (int i = 0; i < nrows; ++i) {
        const Row* r = &rows[i];
        const double bus = 2.0 * (N - 1) / N;
        fprintf(f,
                "    {\"size\": %zu, \"count\": %zu, \"type\": \"bf16\", \"shim_us\": %.3f, \"nccl_us\": %.3f, "
                "\"shim_over_nccl\": %.4f, \"shim_busbw\": %.3f, \"nccl_busbw\": %.3f, \"shim_wrong\": %.0f, "
                "\"nccl_wrong\": %.0f}%s\n",
                r->bytes, r->count, r->us[0], r->us[1], r->us[0] / r->us[1],
                bus * (double)r->bytes / (r->us[0] * 1e3), bus * (double)r->bytes / (r->us[1] * 1e3), r->wrong[0],
                r->wrong[1], i + 1 < nrows ? "," : "");
      }
      fprintf(f, "  ]\n}\n");
      fclose(f);
      printf("# wrote %s\n", json);
    }
  }

  for (int i = 0; i < 2 * max_iters; ++i) CUDA_CHECK(cudaEventDestroy(ev[i]));
  CUDA_CHECK(cudaStreamDestroy(stream));
  CUDA_CHECK(cudaFree(send));
  CUDA_CHECK(cudaFree(recv));
  CUDA_CHECK(cudaFree(dstats));
  LIB_CHECK(shim, commDestroy(shim->comm));
  LIB_CHECK(nccl, commDestroy(nccl->comm));
  free(host_in);
  free(host_out);
  free(ev);
  free(samples);
  free(turn_us);
  return total_wrong == 0 ? 0 : 1;
}
