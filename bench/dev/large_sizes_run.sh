#!/usr/bin/env bash
# Every collective just past each large-size threshold (64, 128, 256 MiB), checked against braid-bench's host
# reference, on every buffer kind, eager and in CUDA graphs, with ranks as threads sharing the GPUs present
# (BRAID_ALLOW_SHARED_GPU=1), at each world given. One summary line per run in $OUT/large-summary.txt.
#   [RUNS="NAME..."] bench/dev/large_sizes_run.sh WORLD...
set -u
[ -f .carry/build.tgz ] && [ ! -d .carry/build ] && tar -C .carry -xzf .carry/build.tgz
source "$(dirname "$0")/device_env.sh"
export BRAID_ALLOW_SHARED_GPU=1
bench=build/tools/braid-bench/braid-bench
sizes=(-b 67108876 -e 300M -f 2)
quick=(-n 1 -w 0 --repeats 1 -c 1 --inplace 2 --coll all)
run() {  # NAME [ENV...] -- ARGS...
  local name=$1; shift
  [[ " ${RUNS:-$name} " == *" $name "* ]] || return 0  # RUNS: the names to run (default all)
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  local log="$out/large-w$world-$name.log" start=$SECONDS
  env ${envs[@]+"${envs[@]}"} timeout -k 5 "${RUN_BUDGET_S:-150}" "$bench" --threads "$world" "${sizes[@]}" "${quick[@]}" "$@" \
    > "$log" 2>&1
  local code=$?
  local wrong
  wrong=$(grep -cE 'FAILED' "$log")
  echo "world $world $name: exit $code, FAILED lines $wrong, $((SECONDS - start)) s" | tee -a "$out/large-summary.txt"
}
for world in "$@"; do
  run cudamalloc_f32 -- -d float32 -o sum
  run symmetric_f32 -- -d float32 -o sum --symmetric 1
  run registered_vmm_eager_zero_copy_f32 BRAID_EAGER_ZERO_COPY=1 -- -d float32 -o sum --vmm 1 --register 1
  run graph_cudamalloc_f32 -- -d float32 -o sum -G 2
  run cudamalloc_bf16_avg -- -d bfloat16 -o avg
done
tar -C "$out" -czf /tmp/large-logs.tgz . && find "$out" -type f ! -name large-summary.txt -delete && mv /tmp/large-logs.tgz "$out/"
