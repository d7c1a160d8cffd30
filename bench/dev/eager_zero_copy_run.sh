#!/usr/bin/env bash
# Eager zero copy on exposed buffers (BRAID_EAGER_ZERO_COPY=1): tests and benchmarks on the GPU machine (device
# tool), after bench/dev/stage_build.sh staged the build:
#   tests     the ExposedRanges GPU tests with the switch on, as threads (all GPUs, then 2) and as braid-run
#             processes (all GPUs), and as threads at world 4 with ranks sharing GPUs
#   bench     braid-bench --compare nccl, eager all-gather bf16 on registered VMM buffers (as PyTorch's expandable
#             segments make them), the switch on (announced: zero copy) and off (the table's staged paths), ranks
#             as threads and as braid-run processes
# Usage: bench/dev/eager_zero_copy_run.sh KIND PHASE...   Logs go to $OUT (eager-zero-copy-logs.tgz).
set -u
RUN_TITLE=eager-zero-copy source "$(dirname "$0")/run_common.sh"
shift
export BRAID_NCCL_LIBRARY="$nccl_dir/libnccl.so.2"
for phase in "$@"; do
  case "$phase" in
    tests)
      BRAID_EAGER_ZERO_COPY=1 gpu_tests 280 eager 'ExposedRanges.*'
      BRAID_EAGER_ZERO_COPY=1 BRAID_ALLOW_SHARED_GPU=1 timeout 200 stdbuf -oL build/tests/gpu/braid_gpu_tests \
        '--gtest_filter=ExposedRanges.*' --world=4 --test-watchdog=120 > "$out/eager-shared-4.log" 2>&1
      echo "eager tests (threads, 4 ranks on $gpus GPUs) exit $?" | tee -a "$out/eager-shared-4.log"
      grep -E "FAILED|Failure|PASSED|threw" "$out/eager-shared-4.log" | head -20
      ;;
    bench)
      cmp="--compare nccl --nccl-lib $nccl_dir/libnccl.so.2"
      for on in 1 0; do
        BRAID_EAGER_ZERO_COPY=$on bench 150 allgather-vmm-eager-switch$on --coll allgather -d bfloat16 -b 1M -e 512M -f 2 \
          --vmm 1 --register 1 $cmp
      done
      for on in 1 0; do
        { echo "## braid-run -n $gpus braid-bench (processes), BRAID_EAGER_ZERO_COPY=$on"; } > "$out/allgather-vmm-processes-switch$on.txt"
        BRAID_EAGER_ZERO_COPY=$on timeout 150 stdbuf -oL build/tools/braid-run/braid-run -n "$gpus" -- \
          build/tools/braid-bench/braid-bench --coll allgather -d bfloat16 -b 1M -e 512M -f 2 --vmm 1 --register 1 $cmp \
          --json "$out/allgather-vmm-processes-switch$on.json" >> "$out/allgather-vmm-processes-switch$on.txt" 2>&1
        echo "## exit code $?" >> "$out/allgather-vmm-processes-switch$on.txt"
        grep -v '^\[[1-9]' "$out/allgather-vmm-processes-switch$on.txt" | tail -n 30
      done
      ;;
    *) echo "unknown phase $phase" ;;
  esac
done
archive_logs eager-zero-copy-logs.tgz
