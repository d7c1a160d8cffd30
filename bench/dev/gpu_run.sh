#!/usr/bin/env bash
# Runs on the GPU machine (device tool), from the repository root of the copied tree, with the build folder
# carried as .carry/build (built here; see bench/dev/stage_build.sh). Runs the gpu-labelled tests and the
# braid-bench smoke run as threads and as braid-run processes; logs go to $OUT.
set -u
source "$(dirname "$0")/device_env.sh"
kind=${1:-unknown}
{
  echo "# braid GPU run: commit $(cat .carry/COMMIT 2>/dev/null || echo unknown), kind $kind, $(date -u +%Y-%m-%dT%H:%MZ)"
  nvidia-smi -L
  nvidia-smi topo -m | head -8
} 2>&1 | tee "$out/header.txt"
gpus=$(nvidia-smi -L | wc -l)
(ctest --test-dir build -L gpu -V --timeout 600 2>&1) > "$out/gpu-tests.log"
tail -25 "$out/gpu-tests.log"
{
  echo "## braid-bench (ranks as threads)"
  build/tools/braid-bench/braid-bench --smoke
  echo "exit code $?"
  echo "## braid-run -n $gpus braid-bench (ranks as processes)"
  build/tools/braid-run/braid-run -n "$gpus" build/tools/braid-bench/braid-bench --smoke
  echo "exit code $?"
} 2>&1 | tee "$out/smoke.txt"
