#!/usr/bin/env bash
# Registration, memory handles and the NCCL backend: tests and benchmarks on the GPU machine (device tool), after
# bench/dev/stage_build.sh staged the build:
#   tests     the Registration*, MemoryHandles*, NcclBackend* and NcclCommunicator* GPU tests as threads (all GPUs, then 2) and as
#             braid-run processes (all GPUs)
#   regress   the Collectives* and AllToAll* GPU tests as threads on 2 GPUs (the zero-copy paths they share)
#   bench     braid-bench --compare nccl, allreduce bf16 and alltoall float32 on cudaMalloc buffers, plain
#             (staged) and registered (zero copy), CUDA graphs; and allreduce on a communicator with
#             BRAID_BACKEND=nccl, checked
# Usage: bench/dev/registration_nccl_backend_run.sh KIND PHASE...   Logs go to $OUT (registration-logs.tgz).
set -u
RUN_TITLE=registration source "$(dirname "$0")/run_common.sh"
shift
export BRAID_NCCL_LIBRARY="$nccl_dir/libnccl.so.2"
for phase in "$@"; do
  case "$phase" in
    tests)
      gpu_tests 240 registration 'Registration*:MemoryHandles*:NcclBackend*:NcclCommunicator*'
      ;;
    regress)
      timeout 400 stdbuf -oL build/tests/gpu/braid_gpu_tests '--gtest_filter=Collectives*:AllToAll*' --world=2 \
        > "$out/regress-threads-2.log" 2>&1
      echo "regression tests (threads, 2 ranks) exit $?" | tee -a "$out/regress-threads-2.log"
      grep -E "FAILED|PASSED" "$out/regress-threads-2.log" | head -20
      ;;
    bench)
      cmp="--compare nccl --nccl-lib $nccl_dir/libnccl.so.2"
      for buffers in 0 1; do
        name=$([ $buffers = 1 ] && echo registered || echo cudamalloc)
        bench 150 allreduce-$name --coll allreduce -d bfloat16 -b 8K -e 256M -f 4 -G 20 --register $buffers $cmp
        bench 150 alltoall-$name --coll alltoall -d float -b 8K -e 256M -f 4 -G 20 --register $buffers $cmp
      done
      BRAID_BACKEND=nccl bench 120 allreduce-nccl-backend --coll allreduce -d bfloat16 -b 8K -e 64M -f 8 -c 1
      ;;
    bench-allreduce)  # the allreduce half of bench alone (short device budgets)
      cmp="--compare nccl --nccl-lib $nccl_dir/libnccl.so.2"
      bench 140 allreduce-cudamalloc --coll allreduce -d bfloat16 -b 64K -e 256M -f 4 -G 20 --register 0 $cmp
      bench 140 allreduce-registered --coll allreduce -d bfloat16 -b 64K -e 256M -f 4 -G 20 --register 1 $cmp
      ;;
    *) echo "unknown phase $phase" ;;
  esac
done
archive_logs registration-logs.tgz
