#!/usr/bin/env bash
# Runs on the GPU machine after bench/gpu_run.sh has set up build/: braid-bench against NCCL (--compare nccl)
# for the sizes issue 3 names. Every row is also checked against a host reference (-c 1). Outputs to $OUT.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never multicast there
cd /work/main
out=${OUT:-/tmp/out}
nccl_dir=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))")
bench="build/tools/braid-bench/braid-bench --compare nccl --nccl-lib $nccl_dir/libnccl.so.2 --inplace 0"
export BRAID_COMMIT=$(head -1 .carry/COMMIT)
run() {  # seconds, name, then braid-bench arguments
  local seconds=$1 name=$2; shift 2
  echo "## braid-bench $*" | tee "$out/$name.txt"
  timeout "$seconds" stdbuf -oL $bench "$@" --json "$out/$name.json" >> "$out/$name.txt" 2>&1
  echo "## exit code $?" >> "$out/$name.txt"
}
run 120 allreduce-bf16-graph --coll allreduce -d bfloat16 -b 8K -e 512M -f 4 -G 20
run 90 allreduce-f32 --coll allreduce -d float32 -b 2M -e 512M -f 4
run 45 allgather-f32 --coll allgather -d float32 -b 512M -e 512M
run 45 reducescatter-f32 --coll reducescatter -d float32 -b 512M -e 512M
