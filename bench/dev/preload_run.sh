#!/usr/bin/env bash
# Kernel preload on one GPU (device tool; build staged as .carry/build by bench/dev/stage_build.sh, with libbraid and
# the GPU tests gzipped), in phases. "preload": the KernelPreload tests alone with the preload on, off (the
# busy-GPU check must then fail: the hazard it guards against is real) and under CUDA_MODULE_LOADING=EAGER
# (skipped: nothing to show), and what the preload costs communicator init. "suite": the whole GPU suite as
# threads, with the ranks this machine has. (The NCCL watchdog's cost: watchdog_cost_run.sh.)
#   bash bench/dev/preload_run.sh KIND PHASE...
export out=$OUT
kind_arg=${1:?kind, e.g. nvidia-h100-x1}; shift
RUN_TITLE="kernel-preload $*" source bench/dev/run_common.sh "$kind_arg"
for f in .carry/build/src/libbraid.so.0.1.0 .carry/build/tests/gpu/braid_gpu_tests; do [ -f $f.gz ] && gunzip -f $f.gz; done
chmod +x .carry/build/tests/gpu/braid_gpu_tests
T=build/tests/gpu/braid_gpu_tests
for phase in "$@"; do
case $phase in
preload)
  for mode in on off; do
    BRAID_PRELOAD_KERNELS=$mode timeout -k 5 60 $T --gtest_filter='KernelPreload.*' > $out/preload-$mode.txt 2>&1
    echo "## exit code $?" >> $out/preload-$mode.txt
    echo "== KernelPreload.*, BRAID_PRELOAD_KERNELS=$mode"; grep -E "OK \]|FAILED \]|SKIPPED \]|Failure|while the GPU|modules,|Expected|Which|exit code" $out/preload-$mode.txt
  done
  CUDA_MODULE_LOADING=EAGER BRAID_PRELOAD_KERNELS=off timeout -k 5 60 $T --gtest_filter='KernelPreload.*' > $out/preload-eager.txt 2>&1
  echo "## exit code $?" >> $out/preload-eager.txt
  echo "== KernelPreload.*, CUDA_MODULE_LOADING=EAGER, preload off"; grep -E "OK \]|FAILED \]|SKIPPED \]|Failure|while the GPU|modules,|exit code" $out/preload-eager.txt
  for pass in 1 2 3; do
    BRAID_LOG_LEVEL=debug timeout -k 5 60 $T --gtest_filter='KernelPreload.InitLoads*' 2>&1 | grep -E "loaded .* kernels" >> $out/preload-init-cost.txt
  done
  echo "== the preload's cost at init (3 processes)"; cat $out/preload-init-cost.txt
  ;;
suite)
  timeout -k 5 520 $T > $out/suite.txt 2>&1
  echo "## exit code $?" >> $out/suite.txt
  grep -E "FAILED|Failure|threw|PASSED|SKIPPED|tests ran|exit code" $out/suite.txt | head -40
  ;;
*) echo "unknown phase $phase"; exit 2 ;;
esac
done
archive_logs run-logs.tgz
