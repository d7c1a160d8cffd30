// How the shim exports NCCL's names: default visibility (exports.map keeps only nccl*/pnccl* and the marker), and
// for every ncclX the pncclX alias NCCL also exports (profiling tools call those).
#pragma once

#define SHIM_EXPORT __attribute__((visibility("default")))
#define SHIM_ALIAS(name) \
  extern "C" SHIM_EXPORT decltype(name) p##name __attribute__((alias(#name)));
