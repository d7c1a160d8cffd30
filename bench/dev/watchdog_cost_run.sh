#!/usr/bin/env bash
# What the NCCL backend's watchdog costs an eager call (device tool; build staged as .carry/build, libbraid and the
# GPU tests gzipped; optionally a baseline libbraid as .carry/base/libbraid.so.0.gz): the watchdog's GPU tests on
# this build, then braid-bench -t GPUS on the NCCL backend beside NCCL alone (allreduce float32 8 B-256 KiB, out of
# place, no graphs), PASSES (3) interleaved passes of: the baseline with the watchdog on, this build with it on, this build
# with it off.
#   bash bench/dev/watchdog_cost_run.sh KIND
export out=$OUT
RUN_TITLE=nccl-watchdog-cost source bench/dev/run_common.sh "${1:?kind, e.g. nvidia-h100-x1}"
for f in .carry/build/src/libbraid.so.0.1.0 .carry/build/tests/gpu/braid_gpu_tests .carry/base/libbraid.so.0; do
  [ -f $f.gz ] && gunzip -f $f.gz
done
chmod +x .carry/build/tests/gpu/braid_gpu_tests
export BRAID_NCCL_LIBRARY=$nccl_dir/libnccl.so.2
timeout -k 5 120 build/tests/gpu/braid_gpu_tests --gtest_filter='NcclWatchdogTest.*' > $out/watchdog-tests.txt 2>&1
echo "## exit code $?" >> $out/watchdog-tests.txt
echo "== NcclWatchdogTest.*"; grep -E "OK \]|FAILED|Failure|PASSED|exit code" $out/watchdog-tests.txt
variants="new-on new-off"; [ -f .carry/base/libbraid.so.0 ] && variants="base-on $variants"
for pass in $(seq ${PASSES:-3}); do
  for variant in $variants; do
    name=$variant-$pass; lib_path=""; watchdog=${variant#*-}
    [ "${variant%-*}" = base ] && lib_path=$PWD/.carry/base
    echo "## $variant: BRAID_BACKEND=nccl BRAID_NCCL_WATCHDOG=$watchdog braid-bench -t $gpus --coll allreduce -b 8 -e 256K -f 32 --inplace 0 -c 0 -n 500 -w 100 --compare nccl" > $out/$name.txt
    LD_LIBRARY_PATH=$lib_path BRAID_BACKEND=nccl BRAID_NCCL_WATCHDOG=$watchdog timeout 60 build/tools/braid-bench/braid-bench -t $gpus \
      --coll allreduce -b 8 -e 256K -f 32 --inplace 0 -c 0 -n 500 -w 100 --compare nccl --nccl-lib $nccl_dir/libnccl.so.2 >> $out/$name.txt 2>&1
    echo "## exit code $?" >> $out/$name.txt
    echo "== $name"; grep -v "NCCL INFO" $out/$name.txt | grep -E "^ +[0-9]|exit code"
  done
done
archive_logs run-logs.tgz
