#!/usr/bin/env bash
# The measurements behind docs/performance.md, on the GPU machine (device tool), after bench/dev/stage_build.sh
# staged the build as .carry/build. Every run beside NCCL (the nvidia-nccl-cu13 wheel's libnccl), its results
# checked against a host reference except the eager 32 MiB-512 MiB rows (the GPU tests cover those sizes):
#   collectives  every collective on cudaMalloc buffers and on symmetric buffers (comm.alloc), bf16 sum,
#                out of place: 8 KiB-16 MiB in CUDA graphs of 20 calls, 32 MiB-512 MiB eager
#   moe          MoE dispatch and combine, every layout, CUDA graphs: DeepEP's shapes (H=7168, K=8, E=256,
#                T=128 and 4096), T=1..8192 at E=64 (rank-major) and T=1..512 (low latency), bf16; T=128, 512,
#                4096 with fp8 dispatch
#   large, small  the eager or the graph half of collectives alone (DTYPE picks the datatype, bfloat16 by default)
# Usage: bench/dev/performance_run.sh KIND PHASE...   JSON (one file per braid-bench run) and logs go to $OUT as
# performance-logs.tgz; file them with bench/archive.py add --gpu <kind> perf-*.json.
set -u
RUN_TITLE=performance source "$(dirname "$0")/run_common.sh"
shift
cmp="--compare nccl --nccl-lib $nccl_dir/libnccl.so.2"
for phase in "$@"; do
  case "$phase" in
    collectives|large|small)
      # One braid-bench run per collective, so a run cut off by its limit (or by DEADLINE_S, the seconds this
      # script may take in all) loses one collective's JSON, not every one's.
      sizes=()
      [ "$phase" != small ] && sizes+=("large:-b 32M -e 512M -f 2 -c 0")
      [ "$phase" != large ] && sizes+=("small:-b 8K -e 16M -f 2 -G 20")
      for size in "${sizes[@]}"; do
        for buffers in cudaMalloc symmetric; do
          symmetric=$([ $buffers = symmetric ] && echo 1 || echo 0)
          for c in allreduce allgather reducescatter alltoall broadcast reduce sendrecv; do
            if [ $SECONDS -gt "${DEADLINE_S:-100000}" ]; then echo "deadline: perf-${size%%:*}-$buffers-$c not run"; continue; fi
            bench 90 "perf-${size%%:*}-$buffers-$c" --coll $c -d ${DTYPE:-bfloat16} ${size#*:} --inplace 0 --symmetric $symmetric $cmp
          done
        done
      done
      ;;
    moe)
      shape="--moe --hidden 7168 --top-k 8 -d bfloat16 -G 20"
      bench 200 perf-moe-deepep $shape --experts 256 --tokens 128,4096 $cmp
      bench 300 perf-moe-sweep $shape --experts 64 --layout rank-major --tokens 1,2,4,8,16,32,64,128,256,512,1024,2048,4096,8192 $cmp
      bench 200 perf-moe-decode $shape --experts 64 --layout low-latency --tokens 1,2,4,8,16,32,64,128,256,512 $cmp
      bench 200 perf-moe-fp8 $shape --experts 64 --tokens 128,512,4096 --dispatch-type f8e4m3 $cmp
      ;;
    *) echo "unknown phase $phase" ;;
  esac
done
archive_logs performance-logs.tgz
