#!/usr/bin/env bash
# Collectives: the GPU suite, the collectives beside NCCL and the selection sweeps, on the GPU machine (device tool), after bench/dev/stage_build.sh staged the build as .carry/build:
#   tests    the gpu-labelled CTest suite (threads and braid-run processes, all GPUs and 2)
#   suite-a, suite-b  the GPU suite as threads on all GPUs in two halves (b: Registration, MemoryHandles,
#            SendRecv, SymmetricMemory), each within one device command (the whole may not fit in one)
#   copy-engines  the copy-engine all-gather, reduce-scatter, broadcast and reduce forced (BRAID_ALGO) against the
#            table and NCCL on symmetric buffers, float32, 32 MiB-512 MiB: the candidates for 4-rank
#            all-gather and reduce-scatter targets, and the check of the all-gather row set on 2 ranks
#   probe    NCCL init under braid-run with NCCL_DEBUG=INFO (does --compare nccl work here?)
#   algos    braid-only all-reduce sweeps with each algorithm forced (BRAID_ALGO), bf16, CUDA graphs
#   compare  braid-bench --compare nccl for the large-message sizes
#   compare-symmetric  the same all-reduce rows on buffers from comm.alloc (zero copy)
#   collective-tests  the Collectives* GPU tests, ranks as threads, 100 s at most
#   symmetric  the zero-copy GPU tests (threads), then per-algorithm sweeps on symmetric buffers (--symmetric 1)
#   zero-copy  the zero-copy tests alone (symmetric and registered buffers, threads)
#   zero-copy-rs-ag  zero-copy reduce-scatter/all-gather tests, staged vs zero copy sweeps, --compare nccl at 128/512 MiB
#   rs-ag-check  the symmetric-memory and registered-buffer collective cases, threads and processes
#   pipelined-tests  the tests of every kernel that pushes through the FIFOs, and of the staged reductions (threads)
#   fp8      fp8 e4m3/e5m2 all-reduce, reduce-scatter and all-gather against NCCL (--compare nccl), checked
#   small-rs-ag  reduce-scatter and all-gather 8 KiB-16 MiB against NCCL with CUDA graphs
#   ll-rs-ag LL reduce-scatter and all-gather: tests, sweeps against staged and NCCL
#   ll-reduce LL reduce: tests, sweeps against staged and NCCL; broadcast against NCCL
#   small-compare  reduce, broadcast, reduce-scatter, all-gather 8 KiB-16 MiB against NCCL (graphs)
#   dtype-algos  braid-only sweeps with each algorithm of a reduction forced, per datatype (DTYPES, default bfloat16
#            f8e4m3 float32) and collective (COLLS, default allreduce reducescatter reduce), cudaMalloc and
#            symmetric buffers, 128 KiB-8 MiB in CUDA graphs: where the selection table's cut-offs depend on the type
#   explore  large messages, braid only: pipeline piece size (BRAID_PIPELINE_BYTES) and pipelined vs staged
#            reduce-scatter and all-gather, to tune the selection table
# Usage: bench/dev/collectives_run.sh KIND PHASE...   Logs and JSON go to $OUT.
set -u
RUN_TITLE=collectives source "$(dirname "$0")/run_common.sh"
shift
for phase in "$@"; do
  case "$phase" in
    tests)
      (ctest --test-dir build -L gpu -V --timeout 400 2>&1) > "$out/gpu-tests.log"
      grep -E "^[0-9]+: \[  FAILED|Failure|tests passed|Test #|SKIPPED|^[0-9]+: .*(error|Error)" "$out/gpu-tests.log" | head -40
      ;;
    suite-a|suite-b)
      rest='Registration.*:MemoryHandles.*:SendRecv.*:SymmetricMemory.*'
      filter=$([ "$phase" = suite-a ] && echo "-$rest" || echo "$rest")
      timeout 560 stdbuf -oL build/tests/gpu/braid_gpu_tests --gtest_filter="$filter" > "$out/gpu-$phase-threads.txt" 2>&1
      echo "GPU $phase (threads, $gpus ranks) exit $?" | tee -a "$out/gpu-$phase-threads.txt"
      grep -E "FAILED|Failure|PASSED|tests ran|SKIPPED" "$out/gpu-$phase-threads.txt" | head -20
      ;;
    copy-engines)
      cmp="--compare nccl --nccl-lib $nccl_dir/libnccl.so.2 --inplace 0 --symmetric 1 -d float32 -b 32M -e 512M -f 4 -c 0"
      for c in allgather broadcast; do
        BRAID_ALGO=$c=copyengine bench 60 copy-engine-$c --coll $c $cmp
        bench 60 table-$c --coll $c $cmp
      done
      ;;
    probe)
      timeout 60 env NCCL_DEBUG=INFO $run_bench --compare nccl --nccl-lib "$nccl_dir/libnccl.so.2" --coll allreduce -b 1M -e 1M \
        > "$out/nccl-probe.txt" 2>&1
      echo "nccl probe exit $?" | tee -a "$out/nccl-probe.txt"
      grep -v "NCCL INFO" "$out/nccl-probe.txt" | grep -v '^\[[1-9]' | tail -12
      ;;
    algos)
      for algo in ll ll128 oneshot twoshot; do
        BRAID_ALGO=allreduce=$algo bench 60 "algo-$algo" --coll allreduce -d bfloat16 -b 8K -e 16M -f 2 -G 20 --inplace 0
      done
      ;;
    compare)
      cmp="--compare nccl --nccl-lib $nccl_dir/libnccl.so.2 --inplace 0"
      bench 130 compare-allreduce-bf16-graph --coll allreduce -d bfloat16 -b 8K -e 128M -f 4 -G 20 $cmp
      bench 60 compare-allreduce-f32 --coll allreduce -d float32 -b 128M -e 512M -f 4 -c 0 $cmp
      bench 40 compare-allgather-f32 --coll allgather -d float32 -b 512M -e 512M -c 0 $cmp
      bench 40 compare-reducescatter-f32 --coll reducescatter -d float32 -b 512M -e 512M -c 0 $cmp
      ;;
    compare-symmetric)  # the same on buffers from comm.alloc (braid zero copy; NCCL runs on them as plain memory)
      cmp="--compare nccl --nccl-lib $nccl_dir/libnccl.so.2 --inplace 0 --symmetric 1"
      bench 130 compare-symmetric-allreduce-bf16-graph --coll allreduce -d bfloat16 -b 8K -e 128M -f 4 -G 20 $cmp
      bench 60 compare-symmetric-allreduce-f32 --coll allreduce -d float32 -b 128M -e 512M -f 4 -c 0 $cmp
      ;;
    zero-copy)  # after a zero-copy kernel change: its tests (symmetric and registered buffers), then compare-symmetric
      timeout 150 stdbuf -oL build/tests/gpu/braid_gpu_tests \
        --gtest_filter='Collectives.Symmetric*:Registration.RegisteredMatchesUnregisteredAndReference' \
        > "$out/zero-copy-tests.log" 2>&1
      echo "zero-copy tests (threads, $gpus ranks) exit $?" | tee -a "$out/zero-copy-tests.log"
      grep -E "OK \]|FAILED|Failure|PASSED" "$out/zero-copy-tests.log" | head -30
      ;;
    pipelined-tests)  # after a FIFO (pipeline) change: every test of a kernel that pushes through the FIFOs
      timeout 200 stdbuf -oL build/tests/gpu/braid_gpu_tests \
        --gtest_filter='Collectives.AllReduceMatrix*:Collectives.Pipelined*:Collectives.ReduceScatterMatrix:Collectives.ReduceMatrix:Collectives.AllGatherMatrix:Collectives.GraphCapture*:CollectivesStress.*:AllToAll*:SendRecv.*:Moe*' \
        > "$out/pipelined-tests.log" 2>&1
      echo "pipelined tests (threads, $gpus ranks) exit $?" | tee -a "$out/pipelined-tests.log"
      grep -E "OK \]|FAILED|Failure|PASSED" "$out/pipelined-tests.log" | head -60
      ;;
    zero-copy-rs-ag)  # zero-copy reduce-scatter / all-gather: tests, then staged vs zero copy on symmetric buffers, and NCCL
      timeout 150 stdbuf -oL build/tests/gpu/braid_gpu_tests --gtest_filter='Collectives.SymmetricMemoryBuffers:Collectives.SymmetricMemoryZeroCopy*' \
        > "$out/zero-copy-rs-ag-tests.log" 2>&1
      echo "zero-copy reduce-scatter/all-gather tests (threads, $gpus ranks) exit $?" | tee -a "$out/zero-copy-rs-ag-tests.log"
      grep -E "OK \]|FAILED|Failure|PASSED" "$out/zero-copy-rs-ag-tests.log" | head -30
      for coll in reducescatter allgather; do
        for algo in staged pipelined; do
          BRAID_ALGO=$coll=$algo bench 40 "symmetric-$coll-$algo" --coll $coll -d float32 -b 64K -e 256M -f 4 -G 20 -c 0 --inplace 0 --symmetric 1
        done
        bench 40 "compare-symmetric-$coll-f32" --coll $coll -d float32 -b 128M -e 512M -f 4 -c 0 --inplace 0 --symmetric 1 \
          --compare nccl --nccl-lib "$nccl_dir/libnccl.so.2"
      done
      ;;
    rs-ag-check)  # the zero-copy reduce-scatter/all-gather and symmetric/registered cases, threads then processes
      filter='Collectives.SymmetricMemory*:Collectives.Registered*:Registration.RegisteredMatches*'
      timeout 100 stdbuf -oL build/tests/gpu/braid_gpu_tests --gtest_filter="$filter" > "$out/rs-ag-check.log" 2>&1
      echo "threads ($gpus ranks) exit $?" | tee -a "$out/rs-ag-check.log"
      timeout 100 build/tools/braid-run/braid-run -n "$gpus" -- build/tests/gpu/braid_gpu_tests --gtest_filter="$filter" \
        >> "$out/rs-ag-check.log" 2>&1
      echo "processes ($gpus ranks) exit $?" | tee -a "$out/rs-ag-check.log"
      grep -E "OK \]|FAILED|Failure|PASSED|exit" "$out/rs-ag-check.log" | head -30
      ;;
    collective-tests)
      timeout 100 stdbuf -oL build/tests/gpu/braid_gpu_tests --gtest_filter='Collectives*' > "$out/collective-tests.log" 2>&1
      echo "collective tests (threads, $gpus ranks) exit $?" | tee -a "$out/collective-tests.log"
      grep -E "OK \]|FAILED|Failure|PASSED" "$out/collective-tests.log" | head -30
      ;;
    symmetric)
      timeout 150 stdbuf -oL build/tests/gpu/braid_gpu_tests --gtest_filter='Collectives.Symmetric*:SymmetricMemory.*' \
        > "$out/symmetric-tests.log" 2>&1
      echo "symmetric tests (threads, $gpus ranks) exit $?" | tee -a "$out/symmetric-tests.log"
      grep -E "OK \]|FAILED|Failure|PASSED" "$out/symmetric-tests.log" | head -30
      for algo in ll ll128 oneshot twoshot; do
        BRAID_ALGO=allreduce=$algo bench 40 "symmetric-algo-$algo" --coll allreduce -d bfloat16 -b 8K -e 64M -f 2 -G 20 --inplace 0 --symmetric 1
      done
      bench 40 symmetric-twoshot-f32 --coll allreduce -d float32 -b 128M -e 512M -f 4 -c 0 -n 10 --inplace 0 --symmetric 1
      ;;
    fp8)
      cmp="--compare nccl --nccl-lib $nccl_dir/libnccl.so.2"
      bench 120 compare-allreduce-f8e4m3-graph --coll allreduce -d f8e4m3 -b 8K -e 128M -f 4 -G 20 --inplace 0 $cmp
      bench 60 compare-allreduce-f8e5m2-graph --coll allreduce -d f8e5m2 -b 8K -e 32M -f 16 -G 20 -o max $cmp
      bench 60 compare-allreduce-f8e4m3 --coll allreduce -d f8e4m3 -b 128M -e 512M -f 4 --inplace 0 $cmp
      bench 60 compare-reducescatter-f8e4m3 --coll reducescatter -d f8e4m3 -b 64K -e 512M -f 8 --inplace 0 $cmp
      bench 60 compare-allgather-f8e5m2 --coll allgather -d f8e5m2 -b 64K -e 512M -f 8 --inplace 0 $cmp
      ;;
    small-rs-ag)  # reduce-scatter and all-gather at small sizes against NCCL, CUDA graphs (and symmetric buffers)
      cmp="--compare nccl --nccl-lib $nccl_dir/libnccl.so.2 --inplace 0"
      for coll in reducescatter allgather; do
        bench 60 "compare-small-$coll-graph" --coll $coll -d float32 -b 8K -e 16M -f 4 -G 20 $cmp
        bench 60 "compare-small-symmetric-$coll-graph" --coll $coll -d float32 -b 8K -e 16M -f 4 -G 20 --symmetric 1 $cmp
      done
      ;;
    ll-rs-ag)  # LL reduce-scatter/all-gather: their tests, then LL against staged and NCCL (graphs), to set the cut-offs
      timeout 200 stdbuf -oL build/tests/gpu/braid_gpu_tests \
        --gtest_filter='Collectives.LL*:Collectives.ReduceScatterMatrix:Collectives.AllGatherMatrix:Collectives.AllReduceMatrix*:AllToAll.*:CollectivesStress.*:Collectives.GraphCapture*' \
        > "$out/ll-rs-ag-tests.log" 2>&1
      echo "LL reduce-scatter/all-gather tests (threads, $gpus ranks) exit $?" | tee -a "$out/ll-rs-ag-tests.log"
      grep -E "OK \]|FAILED|Failure|PASSED" "$out/ll-rs-ag-tests.log" | head -40
      cmp="--compare nccl --nccl-lib $nccl_dir/libnccl.so.2 --inplace 0"
      for coll in reducescatter allgather; do
        for algo in ll staged; do
          BRAID_ALGO=$coll=$algo bench 60 "ll-$coll-$algo-graph" --coll $coll -d float32 -b 8K -e 8M -f 2 -G 20 $cmp
        done
        BRAID_ALGO=$coll=ll bench 60 "ll-symmetric-$coll-graph" --coll $coll -d float32 -b 8K -e 8M -f 2 -G 20 --symmetric 1 $cmp
        BRAID_ALGO=$coll=ll bench 60 "ll-$coll-bf16-eager" --coll $coll -d bfloat16 -b 8K -e 8M -f 4 $cmp
      done
      ;;
    ll-reduce)  # LL reduce: its tests, LL against staged and NCCL (graphs); broadcast against NCCL
      timeout 150 stdbuf -oL build/tests/gpu/braid_gpu_tests --gtest_filter='Collectives.LL*:Collectives.ReduceMatrix:CollectivesStress.*' \
        > "$out/ll-reduce-tests.log" 2>&1
      echo "LL reduce tests (threads, $gpus ranks) exit $?" | tee -a "$out/ll-reduce-tests.log"
      grep -E "OK \]|FAILED|Failure|PASSED" "$out/ll-reduce-tests.log" | head -20
      cmp="--compare nccl --nccl-lib $nccl_dir/libnccl.so.2 --inplace 0"
      for algo in ll staged; do
        BRAID_ALGO=reduce=$algo bench 60 "ll-reduce-$algo-graph" --coll reduce -d float32 -b 8K -e 8M -f 2 -G 20 $cmp
      done
      bench 60 "broadcast-graph" --coll broadcast -d float32 -b 8K -e 16M -f 4 -G 20 $cmp
      bench 60 "broadcast-symmetric-graph" --coll broadcast -d float32 -b 8K -e 16M -f 4 -G 20 --symmetric 1 $cmp
      ;;
    small-compare)  # every collective 8 KiB-16 MiB against NCCL with CUDA graphs, the table's choices, checked
      cmp="--compare nccl --nccl-lib $nccl_dir/libnccl.so.2 --inplace 0"
      for coll in reduce broadcast reducescatter allgather; do
        bench 60 "compare-small-$coll-graph" --coll $coll -d float32 -b 8K -e 16M -f 4 -G 20 $cmp
      done
      ;;
    dtype-algos)
      for coll in ${COLLS:-allreduce reducescatter reduce}; do
        algos=$([ $coll = allreduce ] && echo "ll ll128 oneshot twoshot" || echo "ll staged pipelined")
        for dtype in ${DTYPES:-bfloat16 f8e4m3 float32}; do
          for algo in $algos; do
            for symmetric in 0 1; do
              BRAID_ALGO=$coll=$algo bench 40 "dtype-$coll-$dtype-$algo-s$symmetric" --coll $coll -d $dtype -b 128K -e 8M -f 2 \
                -G 20 -c 0 --inplace 0 --symmetric $symmetric | grep -E '^ +[0-9]' | awk -v n="$coll $dtype $algo s$symmetric" '{printf "%s %s:%s\n", n, $1, $6}' | paste -sd' '
            done
          done
        done
      done
      ;;
    explore)  # AREAS (label:bytes ...) picks the pipeline areas; STAGED=0 skips the staged rows
      for area in ${AREAS:-256M:268435456 512M:536870912}; do
        export BRAID_PIPELINE_BYTES=${area#*:}
        bench 40 "explore-twoshot-f32-area${area%:*}" --coll allreduce -d float32 -b 16M -e 512M -f 4 -c 0 -n 10 --inplace 0
        for coll in reducescatter allgather; do
          BRAID_ALGO=$coll=pipelined bench 30 "explore-$coll-pipelined-area${area%:*}" --coll $coll -d float32 -b 16M -e 512M -f 4 -c 0 -n 10 --inplace 0
        done
        unset BRAID_PIPELINE_BYTES
      done
      [ "${STAGED:-1}" = 0 ] || for coll in reducescatter allgather; do
        BRAID_ALGO=$coll=staged bench 30 "explore-$coll-staged" --coll $coll -d float32 -b 16M -e 512M -f 4 -c 0 -n 10 --inplace 0
      done
      ;;
    *) echo "unknown phase $phase" ;;
  esac
done
archive_logs collectives-logs.tgz
