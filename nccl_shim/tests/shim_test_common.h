/* Helpers shared by nccl_check.c and nccl_shim_bench.c: launch environment, unique-id exchange through a
 * file, hashing and pseudo-random numbers. Plain C11 + POSIX, header-only (static functions) so each program
 * stays one translation unit plus this file, and neither needs anything of braid. */
#ifndef NCCL_SHIM_TEST_COMMON_H
#define NCCL_SHIM_TEST_COMMON_H

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fp8_bits.h"

static const char* g_prog = "nccl_test";

static void die(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "%s: FATAL: ", g_prog);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  fflush(stdout);
  exit(2);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* 64-bit FNV-1a: the output fingerprint printed for every case, compared between runs by compare_runs.sh. */
static inline uint64_t fnv1a(const void* data, size_t bytes, uint64_t h) {
  const unsigned char* p = (const unsigned char*)data;
  for (size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}
#define FNV_OFFSET 0xcbf29ce484222325ULL

/* splitmix64 of (seed, index): every element of every rank's input can be regenerated anywhere from its index,
 * so a rank computes its reference without ever seeing the other ranks' buffers. */
static inline uint64_t mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
static inline uint64_t rnd64(uint64_t seed, uint64_t index) {
  return mix64(seed + (index + 1) * 0x9e3779b97f4a7c15ULL);
}

/* Parses "8K", "512M", "1G", "4097" (binary multipliers, as nccl-tests does). Returns 0 on a malformed value. */
static inline size_t parse_size(const char* text) {
  char* end = NULL;
  errno = 0;
  unsigned long long v = strtoull(text, &end, 10);
  if (errno || end == text) return 0;
  switch (*end) {
    case 'k': case 'K': v <<= 10; ++end; break;
    case 'm': case 'M': v <<= 20; ++end; break;
    case 'g': case 'G': v <<= 30; ++end; break;
    default: break;
  }
  if (*end == 'B' || *end == 'b') ++end;
  return *end ? 0 : (size_t)v;
}

static int env_int(const char* name, int fallback) {
  const char* v = getenv(name);
  if (!v || !*v) return fallback;
  char* end = NULL;
  long x = strtol(v, &end, 10);
  if (*end) die("environment variable %s=%s is not an integer", name, v);
  return (int)x;
}

/* One process per GPU: the rank, world size and local rank come from braid-run (BRAID_*) or from torchrun-like
 * launchers (RANK, WORLD_SIZE, LOCAL_RANK). Without either, the process is a world of one. */
typedef struct {
  int rank, world, local_rank;
  const char* launcher;
} LaunchEnv;

static LaunchEnv launch_env(void) {
  LaunchEnv e;
  if (getenv("BRAID_RANK")) {
    e.rank = env_int("BRAID_RANK", 0);
    e.world = env_int("BRAID_WORLD_SIZE", 1);
    e.local_rank = env_int("BRAID_LOCAL_RANK", e.rank);
    e.launcher = "braid-run";
  } else if (getenv("RANK")) {
    e.rank = env_int("RANK", 0);
    e.world = env_int("WORLD_SIZE", 1);
    e.local_rank = env_int("LOCAL_RANK", e.rank);
    e.launcher = "RANK/WORLD_SIZE";
  } else {
    e.rank = 0;
    e.world = 1;
    e.local_rank = 0;
    e.launcher = "none (one rank)";
  }
  if (e.world < 1 || e.rank < 0 || e.rank >= e.world || e.local_rank < 0)
    die("bad launch environment: rank %d, world size %d, local rank %d", e.rank, e.world, e.local_rank);
  return e;
}

/* The id file's name gets the launcher's job id when there is one, so a file left by an earlier job is never
 * read by this one (two jobs may also share a --id-file path then). */
static void id_file_path(const char* base, char* out, size_t out_size) {
  const char* job = getenv("BRAID_JOB_ID");
  if (!job || !*job) job = getenv("TORCHELASTIC_RUN_ID");
  if (job && *job)
    snprintf(out, out_size, "%s.%s", base, job);
  else
    snprintf(out, out_size, "%s", base);
}

/* Rank 0 publishes `bytes` bytes (the unique id or ids) at `path` atomically: written to a temporary name, then
 * renamed, so a reader never sees a partial file. The other ranks poll for it for at most timeout_s seconds.
 * A reader also ignores a file older than its own start (minus a margin for ranks starting at different
 * times): that is a stale file of an earlier run, not this job's. */
static void exchange_id_file(const char* path, int rank, void* data, size_t bytes, double timeout_s,
                             time_t process_start) {
  if (rank == 0) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    FILE* f = fopen(tmp, "wb");
    if (!f) die("cannot create %s: %s", tmp, strerror(errno));
    if (fwrite(data, 1, bytes, f) != bytes || fflush(f) != 0 || fsync(fileno(f)) != 0)
      die("cannot write %s: %s", tmp, strerror(errno));
    fclose(f);
    if (rename(tmp, path) != 0) die("cannot rename %s to %s: %s", tmp, path, strerror(errno));
    return;
  }
  const double deadline = now_s() + timeout_s;
  const time_t oldest = process_start - 30;
  for (;;) {
    struct stat st;
    if (stat(path, &st) == 0 && st.st_mtime >= oldest && (size_t)st.st_size == bytes) {
      FILE* f = fopen(path, "rb");
      if (f) {
        size_t got = fread(data, 1, bytes, f);
        fclose(f);
        if (got == bytes) return;
      }
    }
    if (now_s() > deadline)
      die("rank %d: no unique-id file %s from rank 0 after %.0f s (is rank 0 running, with the same --id-file?)",
          rank, path, timeout_s);
    const struct timespec pause = {0, 20 * 1000 * 1000};
    nanosleep(&pause, NULL);
  }
}

#endif
