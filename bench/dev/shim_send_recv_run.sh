#!/usr/bin/env bash
# The NCCL shim and the send/recv it stands on, on the GPU machine (device tool), after bench/dev/stage_build.sh
# staged the build:
#   p2p       the SendRecv* GPU tests as threads (all GPUs, then 2) and as braid-run processes (all GPUs); the
#             AllToAll* tests (send/recv shares their kernel) as threads
#   check     nccl_check (a C program against nccl.h only) with the shim and with the real NCCL: one process
#             driving every GPU (-t), and one process per GPU under braid-run; compare_runs.sh diffs the hashes
#   torch     the torchrun script with and without the shim (nccl_shim/tests/run_torch_check.sh)
#   bench     nccl_shim_bench: allreduce bf16 8 KB - 512 MB in CUDA graphs, shim and real NCCL in one process;
#             braid-bench's allreduce on the same sizes (braid's own API), to compare the shim's overhead
#   nccltests nccl-tests' *_perf programs (built against NCCL, carried in NCCL_TESTS_DIR, default .carry/nccl-tests)
#             on every GPU of one process with data checks (-c 1), with the shim and with the real NCCL: 8 KiB-512 MiB,
#             every datatype and operator up to 1 MiB (NCCL 2.28 refuses fp8's avg, and the real NCCL serves the shim's
#             PreMulSum, which it refuses on fp8: both runs end there), and the shim's registered buffers (-R 1) and
#             windows (-R 2); NCCL_TESTS_LIBS="shim" leaves out the real NCCL's runs
#   symbols   which NCCL symbols libtorch_cuda.so imports (the shim must export each)
# Usage: bench/dev/shim_send_recv_run.sh KIND PHASE...   Logs go to $OUT (shim-logs.tgz).
set -u
RUN_TITLE=shim source "$(dirname "$0")/run_common.sh"
shift
shim=$PWD/build/nccl_shim/libnccl.so.2
check=build/nccl_shim/tests/nccl_check
[ -x "$check" ] || check=build/manual/nccl_check
nccl_tests=${NCCL_TESTS_DIR:-.carry/nccl-tests}
export BRAID_TIMEOUT_S=60
for phase in "$@"; do
  case "$phase" in
    p2p)
      BRAID_NCCL_LIBRARY="$nccl_dir/libnccl.so.2" gpu_tests 240 p2p 'SendRecv*'
      timeout 300 stdbuf -oL build/tests/gpu/braid_gpu_tests '--gtest_filter=AllToAll*' --world=$gpus > "$out/alltoall-threads.log" 2>&1
      echo "all-to-all tests (threads, $gpus ranks) exit $?" | tee -a "$out/alltoall-threads.log"
      grep -E "FAILED|PASSED" "$out/alltoall-threads.log" | head -20
      ;;
    check)
      for lib in shim nccl; do
        if [ $lib = shim ]; then env=(LD_PRELOAD=$shim BRAID_LOG_LEVEL=info LD_LIBRARY_PATH=$nccl_dir); else env=(LD_LIBRARY_PATH=$nccl_dir); fi
        timeout 200 env "${env[@]}" $check -t "$gpus" > "$out/check-$lib-threads.log" 2>&1
        echo "nccl_check $lib -t $gpus exit $?" | tee -a "$out/check-$lib-threads.log"
        tail -n 3 "$out/check-$lib-threads.log"
        rm -f /tmp/nccl-id-$lib
        timeout 200 env "${env[@]}" build/tools/braid-run/braid-run -n "$gpus" -- $check --id-file /tmp/nccl-id-$lib \
          > "$out/check-$lib-processes.log" 2>&1
        echo "nccl_check $lib processes $gpus exit $?" | tee -a "$out/check-$lib-processes.log"
        tail -n 3 "$out/check-$lib-processes.log"
      done
      for mode in threads processes; do
        # NCCL 2.28.9's in-place ncclAlltoAll gives wrong data (its sends and receives of one buffer race); the
        # shim's must still be right against the host reference.
        KNOWN_WRONG_IN_B='^case alltoall\.inplace ' bash nccl_shim/tests/compare_runs.sh "$out/check-shim-$mode.log" "$out/check-nccl-$mode.log" > "$out/compare-$mode.log" 2>&1
        echo "compare $mode exit $?" | tee -a "$out/compare-$mode.log"; tail -n 3 "$out/compare-$mode.log"
      done
      grep -h "served by" "$out"/check-shim-*.log | sed 's/^\[[0-9]*\] //' | sort | uniq -c | head -60 > "$out/check-served-by.log"
      head -40 "$out/check-served-by.log"
      ;;
    torch)
      timeout 500 bash nccl_shim/tests/run_torch_check.sh "$gpus" "$out/torch" "$shim" > "$out/torch-check.log" 2>&1
      echo "torch check exit $?" | tee -a "$out/torch-check.log"
      grep -v "served by" "$out/torch-check.log" | grep -E -i "error|traceback|differ|fail|mismatch|wrong|identical|ok" | head -60
      cp "$out"/torch/*.log "$out/" 2>/dev/null; rm -rf "$out/torch"  # the saved tensors are too large to bring back
      ;;
    bench)
      bench_bin=build/nccl_shim/tests/nccl_shim_bench
      timeout 300 build/tools/braid-run/braid-run -n "$gpus" -- $bench_bin --shim "$shim" --nccl "$nccl_dir/libnccl.so.2" \
        --id-file /tmp/nccl-bench-id -b 8K -e 512M -f 2 --json "$out/shim-vs-nccl.json" > "$out/shim-vs-nccl.log" 2>&1
      echo "nccl_shim_bench exit $?" | tee -a "$out/shim-vs-nccl.log"
      grep -v '^\[[1-9]' "$out/shim-vs-nccl.log" | tail -n 40
      bench 200 braid-allreduce --coll allreduce -d bfloat16 -b 8K -e 512M -f 2 -G 20
      ;;
    nccltests)
      for lib in ${NCCL_TESTS_LIBS:-shim nccl}; do
        if [ $lib = shim ]; then env=(LD_PRELOAD=$shim LD_LIBRARY_PATH=$nccl_dir); else env=(LD_LIBRARY_PATH=$nccl_dir); fi
        for test in "$nccl_tests"/*_perf; do
          name=$(basename "$test")
          runs=("-b 8K -e 512M -f 2" "-d all -o all -b 8 -e 1M -f 8")
          [ $lib = shim ] && runs+=("-R 1 -b 8K -e 512M -f 4" "-R 2 -b 8K -e 512M -f 4")
          for args in "${runs[@]}"; do
            log="$out/nccltests-$lib-$name-$(echo "$args" | tr -d ' -' | cut -c1-24).log"
            timeout 240 env "${env[@]}" "$test" -g "$gpus" -c 1 -w 2 -n 5 $args > "$log" 2>&1
            code=$?
            wrong=$(awk '$1 ~ /^[0-9]+$/ && NF >= 13 { w += $9 + $13; rows++ } END { printf "%d wrong in %d sizes", w, rows }' "$log")
            echo "$lib $name $args: exit $code, $wrong, $(grep -o 'Out of bounds values : .*' "$log")"
          done
        done
      done | tee "$out/nccltests-summary.log"
      ;;
    symbols)
      lib=$(python3 -c "import torch, os; print(os.path.join(os.path.dirname(torch.__file__), 'lib', 'libtorch_cuda.so'))")
      nm -D --undefined-only "$lib" | grep -i nccl > "$out/torch-nccl-symbols.log"
      comm -23 <(awk '{print $2}' "$out/torch-nccl-symbols.log" | sort -u) <(nm -D --defined-only "$shim" | awk '{print $3}' | sort -u) \
        > "$out/torch-symbols-missing.log"
      echo "libtorch_cuda imports $(wc -l < "$out/torch-nccl-symbols.log") NCCL symbols; the shim lacks: $(tr '\n' ' ' < "$out/torch-symbols-missing.log")"
      ;;
    *) echo "unknown phase $phase" ;;
  esac
done
archive_logs shim-logs.tgz
