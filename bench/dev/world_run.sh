#!/usr/bin/env bash
# A whole host at world N (every GPU of the machine), the checks a world-size run owes in order of need, within
# one device command, on the GPU machine (device tool), after bench/dev/stage_build.sh staged the build (unpacked
# here from .carry/build.tgz) and bench/probes/egress was built and carried as .carry/egress:
#   egress   the per-GPU egress limits (bench/probes/egress.cu): SM stores and copy engines, alone and all at once
#   tests    the collective, all-to-all, MoE, fault and send/recv GPU tests as threads at world N, and the announcing
#            ones with BRAID_EAGER_ZERO_COPY=1
#   moe      MoE dispatch and combine beside NCCL at DeepEP's shapes (H=7168, K=8, E=256; T=1, 128, 4096), bf16 and
#            fp8 dispatch, CUDA graphs
#   large    performance_run.sh large: every collective eager at 32-512 MiB on both buffer kinds beside NCCL, until
#            DEADLINE_S (150 s by default) has passed
# Usage: bench/dev/world_run.sh KIND PHASE...   Logs and JSON go to $OUT as world-logs.tgz (large packs what came
# before it into performance-logs.tgz inside); file the JSON with bench/archive.py add --gpu KIND.
[ -d .carry/build ] || tar -C .carry -xzf .carry/build.tgz
set -u
RUN_TITLE=world source "$(dirname "$0")/run_common.sh"
shift
cmp="--compare nccl --nccl-lib $nccl_dir/libnccl.so.2"
for phase in "$@"; do
  case "$phase" in
    egress)
      timeout 60 .carry/egress 2>&1 | tee "$out/egress.txt"
      ;;
    tests)
      timeout 110 stdbuf -oL build/tests/gpu/braid_gpu_tests '--gtest_filter=Collectives*:AllToAll*:Moe*:Faults*:SendRecv*' \
        --world=$gpus --test-watchdog=100 > "$out/tests-$gpus.log" 2>&1
      echo "tests (threads, $gpus ranks) exit $?"
      grep -E "FAILED|Failure|PASSED|tests ran|SKIPPED \]" "$out/tests-$gpus.log" | head -30
      BRAID_EAGER_ZERO_COPY=1 timeout 40 stdbuf -oL build/tests/gpu/braid_gpu_tests \
        '--gtest_filter=ExposedRanges.Announced*:-*Segments*' --world=$gpus > "$out/exposed-$gpus.log" 2>&1
      echo "announcing tests (threads, $gpus ranks, BRAID_EAGER_ZERO_COPY=1) exit $?"
      grep -E "FAILED|Failure|PASSED" "$out/exposed-$gpus.log" | head
      ;;
    moe)
      shape="--moe --hidden 7168 --top-k 8 -d bfloat16 -G 20 --experts 256"
      bench 80 perf-moe-deepep $shape --tokens 1,128,4096 $cmp
      bench 50 perf-moe-fp8 $shape --tokens 128,4096 --dispatch-type f8e4m3 $cmp
      ;;
    large)
      DEADLINE_S=${DEADLINE_S:-150} bash "$(dirname "$0")/performance_run.sh" "$kind" large 2>&1 |
        grep -E "^ +[0-9]+|deadline|exit code" | head -120
      ;;
    *) echo "unknown phase $phase" ;;
  esac
done
archive_logs world-logs.tgz
