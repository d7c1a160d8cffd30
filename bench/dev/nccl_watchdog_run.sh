#!/usr/bin/env bash
# The NCCL backend's watchdog on 2 or more GPUs (device tool, build staged as .carry/build with the test binary
# and libbraid gzipped): NcclCommunicator.*, NcclBackend.* and NcclWatchdogTest.* as threads, the timeout test as
# braid-run processes, Registration + MemoryHandles (their NCCL comparisons bounded too), and the watchdog's cost
# on eager calls (braid on its NCCL backend beside NCCL alone).
#   bash bench/dev/nccl_watchdog_run.sh KIND
export out=$OUT
RUN_TITLE=nccl-watchdog source bench/dev/run_common.sh "${1:?kind, e.g. nvidia-h200-x2}"
gunzip -f .carry/build/src/libbraid.so.0.1.0.gz .carry/build/tests/gpu/braid_gpu_tests.gz
chmod +x .carry/build/tests/gpu/braid_gpu_tests
T=build/tests/gpu/braid_gpu_tests
export BRAID_NCCL_LIBRARY=$nccl_dir/libnccl.so.2
timeout -k 5 120 $T --gtest_filter='NcclCommunicator.*:NcclBackend.*:NcclWatchdogTest.*' > $out/nccl-threads.txt 2>&1
echo "== NcclCommunicator + NcclBackend (threads) exit $?"; grep -E "OK \]|FAILED|Failure|threw|PASSED|tests ran|Expected|Which|took|raised" $out/nccl-threads.txt | head -30
timeout -k 5 100 build/tools/braid-run/braid-run -n $gpus -- $T --gtest_filter='NcclCommunicator.TimeoutAbortsTheWaitAndNamesTheOperation' > $out/nccl-timeout-processes.txt 2>&1
echo "== timeout test (processes) exit $?"; grep -E "OK \]|FAILED|Failure|PASSED|tests ran" $out/nccl-timeout-processes.txt | head
timeout -k 5 150 $T --gtest_filter='Registration.*:MemoryHandles.*' > $out/reg-handles.txt 2>&1
echo "== Registration + MemoryHandles exit $?"; grep -E "FAILED|Failure|threw|PASSED|tests ran" $out/reg-handles.txt | head
BRAID_BACKEND=nccl timeout 120 build/tools/braid-bench/braid-bench -t $gpus --coll allreduce -b 8 -e 1M -f 32 --inplace 0 -c 0 \
  --compare nccl --nccl-lib $nccl_dir/libnccl.so.2 -n 200 -w 50 --json $out/nccl-backend-eager.json > $out/nccl-backend-eager.txt 2>&1
echo "== braid-bench, NCCL backend, eager: exit $?"; grep -v "^\[[1-9]\|NCCL INFO" $out/nccl-backend-eager.txt | tail -15
archive_logs run-logs.tgz
