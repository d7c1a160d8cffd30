#!/usr/bin/env bash
# Runs on the GPU machine after bench/gpu_run.sh has set up build/: braid-bench against NCCL (--compare nccl)
# for the sizes issue 3 names. Every row is also checked against a host reference (-z 1). Outputs to $OUT.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never multicast there
cd /work/main
out=${OUT:-/tmp/out}
nccl_dir=$(python3 -c "import nvidia.nccl, os; print(os.path.join(os.path.dirname(nvidia.nccl.__file__), 'lib'))")
bench="build/tools/braid-bench/braid-bench --compare nccl --nccl-lib $nccl_dir/libnccl.so.2 --inplace 0"
export BRAID_COMMIT=$(head -1 .carry/COMMIT)
run() {  # name, then braid-bench arguments
  local name=$1; shift
  echo "## braid-bench $*" | tee "$out/$name.txt"
  $bench "$@" --json "$out/$name.json" 2>&1 | tee -a "$out/$name.txt"
}
run allreduce-bf16-graph -c allreduce -d bfloat16 -b 8K -e 512M -f 2 -G 20
run allreduce-f32 -c allreduce -d float32 -b 2M -e 512M -f 4
run allgather-f32 -c allgather -d float32 -b 1M -e 512M -f 8
run reducescatter-f32 -c reducescatter -d float32 -b 1M -e 512M -f 8
run broadcast-reduce-f32 -c broadcast -d float32 -b 1M -e 512M -f 8
