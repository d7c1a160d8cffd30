#!/usr/bin/env bash
# Eager zero copy on exposed buffers (BRAID_EAGER_ZERO_COPY=1): tests and benchmarks on the GPU machine (device
# tool), after bench/dev/stage_build.sh staged the build (unpacked here from .carry/build.tgz):
#   tests     the ExposedRanges GPU tests with the switch on, as threads (all GPUs, then 2) and as braid-run
#             processes (all GPUs), and as threads at world 4 with ranks sharing GPUs
#   bench     braid-bench --compare nccl, eager all-gather, reduce-scatter and all-reduce bf16 on VMM buffers (as
#             PyTorch's expandable segments make them): registered with the switch on (announced) and unregistered
#             with it off (the staged paths), ranks as threads
#   processes braid-bench --compare nccl under braid-run (every rank a process, so large calls exchange their
#             buffers on the host), eager all-gather, reduce-scatter, all-reduce and all-to-all bf16 of 32-512 MiB on
#             unregistered VMM buffers (exposed at first use) with the switch on, and off (the staged paths)
#   torch     nccl_shim/tests/run_torch_check.sh with the allocator hook, expandable segments and the switch on, at
#             the default model and at width 4096 (FSDP2 layers of 64 MiB); needs the shim, stripped and gzipped, as
#             .carry/libnccl.so.2.gz (the staged build leaves nccl_shim out to fit)
# Staging that fits the device tool's 64 MiB: STAGE_EXCLUDE="nccl_shim probes python examples _deps
# src/libbraid.so.0.1.0 tools/braid-bench/braid-bench-reference-test tools/braid-bench/braid-bench-options-test"
# bench/dev/stage_build.sh (the tests and braid-bench link braid statically).
# Usage: bench/dev/eager_zero_copy_run.sh KIND PHASE...   Logs go to $OUT (eager-zero-copy-logs.tgz).
[ -d .carry/build ] || tar -C .carry -xzf .carry/build.tgz
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
      for coll in allgather reducescatter allreduce; do
        for on in 1 0; do
          BRAID_EAGER_ZERO_COPY=$on bench 90 $coll-vmm-switch$on --coll $coll -d bfloat16 -b 1M -e 512M -f 2 \
            --vmm 1 --register $on $cmp
        done
      done
      ;;
    processes)
      cmp="--compare nccl --nccl-lib $nccl_dir/libnccl.so.2"
      for coll in allgather reducescatter allreduce alltoall; do
        for on in 1 0; do
          name=$coll-vmm-processes-switch$on
          echo "## BRAID_EAGER_ZERO_COPY=$on braid-run -n $gpus braid-bench --coll $coll -d bfloat16 -b 32M -e 512M -f 2 --vmm 1 $cmp" > "$out/$name.txt"
          BRAID_EAGER_ZERO_COPY=$on timeout 100 build/tools/braid-run/braid-run -n "$gpus" -- build/tools/braid-bench/braid-bench \
            --coll $coll -d bfloat16 -b 32M -e 512M -f 2 --vmm 1 $cmp --json "$out/$name.json" >> "$out/$name.txt" 2>&1
          echo "## exit code $?" >> "$out/$name.txt"
          grep -E '^\[0\] +[0-9]' "$out/$name.txt" | head -8
        done
      done
      ;;
    torch)
      gunzip -c .carry/libnccl.so.2.gz > /tmp/libnccl.so.2 || { echo "torch: no .carry/libnccl.so.2.gz"; continue; }
      for width in 1024 4096; do
        BRAID_EAGER_ZERO_COPY=1 TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1 \
          PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True TORCH_CHECK_ARGS="--no-graph --no-compile --width $width" \
          timeout 250 bash nccl_shim/tests/run_torch_check.sh "$gpus" "$out/torch-$width" /tmp/libnccl.so.2 \
          > "$out/torch-check-$width.log" 2>&1
        echo "torch check, width $width: exit $?"
        grep -E "PASS|FAIL|ddp |fsdp2 |differ" "$out/torch-check-$width.log" | head -12
        rm -f "$out/torch-$width"/*.pt
      done
      ;;
    *) echo "unknown phase $phase" ;;
  esac
done
archive_logs eager-zero-copy-logs.tgz
