#!/usr/bin/env bash
# All-to-all and MoE tests and benchmarks on the GPU machine (device tool), after bench/dev/stage_build.sh staged the build:
#   tests     the AllToAll* and Moe* GPU tests as threads (all GPUs, then 2) and as braid-run processes (all GPUs)
#   compare   braid-bench --coll alltoall --compare nccl, cudaMalloc buffers (pipelined) and symmetric buffers
#             (direct stores / copy engines), 8 KiB to 512 MiB, CUDA graphs for the small sizes
#   moe-tests the Moe* GPU tests alone, as threads (all GPUs) and as braid-run processes
#   moe       braid-bench --moe --compare nccl: T=128 and T=4096, H=7168, K=8, E=64, bf16, CUDA graphs
#   moe-fp8   the same workload at T=128, 512, 4096 with fp8 e4m3 dispatch (scales per 128 columns), then bf16
#   algos     braid only, each all-to-all algorithm forced (BRAID_ALGO), symmetric and cudaMalloc buffers, to set
#             the cut-offs (LL falls back to stores or pipelined where a block exceeds its LL slot)
# Usage: bench/dev/all_to_all_moe_run.sh KIND PHASE...   Logs and JSON go to $OUT.
set -u
RUN_TITLE=all-to-all-moe source "$(dirname "$0")/run_common.sh"
shift
for phase in "$@"; do
  case "$phase" in
    tests)
      gpu_tests 200 alltoall 'AllToAll*:Moe*'
      ;;
    moe-tests)
      timeout 200 stdbuf -oL build/tests/gpu/braid_gpu_tests '--gtest_filter=Moe*' --world=$gpus > "$out/moe-tests-threads-$gpus.log" 2>&1
      echo "MoE tests (threads, $gpus ranks) exit $?" | tee -a "$out/moe-tests-threads-$gpus.log"
      grep -E "OK \]|FAILED|Failure|PASSED|SKIPPED" "$out/moe-tests-threads-$gpus.log" | head -40
      timeout 200 build/tools/braid-run/braid-run -n "$gpus" -- build/tests/gpu/braid_gpu_tests '--gtest_filter=Moe*' \
        > "$out/moe-tests-processes-$gpus.log" 2>&1
      echo "MoE tests (processes, $gpus ranks) exit $?" | tee -a "$out/moe-tests-processes-$gpus.log"
      grep -E "FAILED|Failure|PASSED" "$out/moe-tests-processes-$gpus.log" | head -20
      ;;
    compare)
      cmp="--compare nccl --nccl-lib $nccl_dir/libnccl.so.2 --inplace 0"
      bench 90 compare-alltoall-graph --coll alltoall -d float32 -b 8K -e 4M -f 4 -G 20 $cmp
      bench 120 compare-alltoall --coll alltoall -d float32 -b 16M -e 512M -f 2 $cmp
      bench 90 compare-symmetric-alltoall-graph --coll alltoall -d float32 -b 8K -e 4M -f 4 -G 20 --symmetric 1 $cmp
      bench 90 compare-symmetric-alltoall --coll alltoall -d float32 -b 16M -e 512M -f 4 --symmetric 1 $cmp
      ;;
    algos)
      for algo in ll pipelined copyengine; do
        BRAID_ALGO=alltoall=$algo bench 60 "symmetric-alltoall-$algo" --coll alltoall -d float32 -b 8K -e 64M -f 4 -G 20 -c 0 --inplace 0 --symmetric 1
      done
      for algo in ll pipelined; do
        BRAID_ALGO=alltoall=$algo bench 60 "alltoall-$algo" --coll alltoall -d float32 -b 8K -e 4M -f 4 -G 20 -c 0 --inplace 0
      done
      ;;
    moe)
      cmp="--compare nccl --nccl-lib $nccl_dir/libnccl.so.2"
      bench 150 moe-compare-nccl --moe --tokens 128,4096 --hidden 7168 --top-k 8 --experts 64 -d bfloat16 -G 20 $cmp
      ;;
    moe-fp8)
      cmp="--compare nccl --nccl-lib $nccl_dir/libnccl.so.2"
      shape="--moe --tokens 128,512,4096 --hidden 7168 --top-k 8 --experts 64 -d bfloat16 -G 20"
      bench 200 moe-fp8-e4m3-compare-nccl $shape --dispatch-type f8e4m3 $cmp
      bench 200 moe-bf16-compare-nccl $shape $cmp
      ;;
    *) echo "unknown phase $phase" ;;
  esac
done
archive_logs all-to-all-moe-logs.tgz
