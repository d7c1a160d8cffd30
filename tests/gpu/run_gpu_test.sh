#!/usr/bin/env bash
# GPU tests that need braid-run. Exit 77 = skipped (no GPU, or fewer GPUs than asked).
#   run_gpu_test.sh processes BRAID_RUN GPU_TESTS N|all [--skip-if-gpus=M] [ARGS...]
#       the GPU suite with N ranks as processes (ARGS go to every rank, e.g. --gtest_filter); with
#       --skip-if-gpus=M, skipped when exactly M GPUs are visible (an entry for M ranks covers it)
#   run_gpu_test.sh shared_processes BRAID_RUN GPU_TESTS N [ARGS...]
#       N ranks as processes on however many GPUs are visible, sharing them (the entry sets
#       BRAID_ALLOW_SHARED_GPU=1): each process has a context and hardware queues of its own
#   run_gpu_test.sh crash     BRAID_RUN GPU_TESTS N|all   rank 1 aborts; braid-run must stop all, exit 134
set -u
mode=$1 braid_run=$2 tests=$3 want=$4
shift 4
skip_if_gpus=""
if [[ "${1:-}" == --skip-if-gpus=* ]]; then skip_if_gpus=${1#--skip-if-gpus=}; shift; fi
gpus=$("$tests" --print-gpu-count) || { echo "SKIPPED: no CUDA device on this machine"; exit 77; }
if [ -n "$skip_if_gpus" ] && [ "$gpus" -eq "$skip_if_gpus" ]; then
  echo "SKIPPED: all $gpus GPUs is the world of the $gpus-rank entry, which runs the same tests"
  exit 77
fi
n=$gpus
if [ "$want" != all ]; then
  if [ "$mode" != shared_processes ] && [ "$gpus" -lt "$want" ]; then
    echo "SKIPPED: needs $want GPUs, $gpus visible"; exit 77
  fi
  n=$want
fi
case "$mode" in
  processes|shared_processes)
    exec "$braid_run" -n "$n" -- "$tests" "$@" ;;
  crash)
    if [ "$n" -lt 2 ]; then echo "SKIPPED: needs 2 GPUs"; exit 77; fi
    start=$(date +%s)
    "$braid_run" -n "$n" -- "$tests" --crash-rank=1
    code=$?
    elapsed=$(( $(date +%s) - start ))
    echo "braid-run exited with $code after ${elapsed} s (the surviving ranks' barrier timeout is 120 s)"
    if [ "$code" -ne 134 ]; then echo "FAIL: expected 134 (SIGABRT of rank 1)"; exit 1; fi
    if [ "$elapsed" -ge 60 ]; then echo "FAIL: braid-run did not stop the other ranks promptly"; exit 1; fi
    echo "PASS: braid-run stopped the job and returned the crashed rank's code"
    ;;
  *) echo "unknown mode $mode"; exit 2 ;;
esac
