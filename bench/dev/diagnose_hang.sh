#!/usr/bin/env bash
# Finds where a braid-bench run that prints nothing is stuck (device tool, build staged as .carry/build).
# Each case runs under a time limit with braid's device waits bounded by BRAID_TIMEOUT_S=15 (a braid deadlock
# then ends in an error naming the wait site); a case still running after its grace gets every thread's stack
# (cuda-gdb attached, which also lists the kernels on the GPUs), GPU load, and the process states, and what
# is left of it afterwards is listed, so a process that outlives its kill shows.
#   bench/dev/diagnose_hang.sh CASE...   cases: graph4 nccl4 nccl2 graph2 smoke4 (see below)
set -u
source "$(dirname "$0")/device_env.sh"
nccl_dir=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))")
bench=build/tools/braid-bench/braid-bench
export BRAID_TIMEOUT_S=15 BRAID_COMMIT=$(head -1 .carry/COMMIT)

leftovers() {
  ps -eo pid,stat,etimes,wchan:32,cmd | grep -E 'braid|ctest' | grep -v -E 'grep|diagnose_hang' || echo "(none)"
}

dump() {  # tag: stacks of every braid-bench process
  nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader > "$out/$1-smi.txt" 2>&1
  for pid in $(pgrep -x braid-bench); do
    {
      echo "## pid $pid"; ps -L -o tid,stat,wchan:32,comm -p "$pid"
      timeout 90 cuda-gdb -batch -p "$pid" -ex "info cuda kernels" -ex "info threads" -ex "thread apply all bt 25" 2>&1
    } > "$out/$1-stacks-$pid.txt" 2>&1
  done
}

run_case() {  # tag, limit, grace, then the command
  local tag=$1 limit=$2 grace=$3; shift 3
  echo "== $tag: $* (limit $limit s, stacks at $grace s)" | tee "$out/$tag.txt"
  echo "leftovers before: $(leftovers | tr '\n' ';')" >> "$out/$tag.txt"
  local start=$SECONDS
  timeout -k 5 "$limit" stdbuf -oL -eL "$@" >> "$out/$tag.txt" 2>&1 &
  local runner=$!
  while kill -0 $runner 2>/dev/null && [ $((SECONDS - start)) -lt "$grace" ]; do sleep 1; done
  if kill -0 $runner 2>/dev/null; then
    echo "-- still running at $grace s: dumping stacks" | tee -a "$out/$tag.txt"
    dump "$tag"
  fi
  wait $runner
  local code=$?
  echo "-- exit $code after $((SECONDS - start)) s" | tee -a "$out/$tag.txt"
  sleep 2
  echo "-- left after exit: $(leftovers | tr '\n' ';')" | tee -a "$out/$tag.txt"
  grep -v -E '^\[[1-9]|NCCL INFO' "$out/$tag.txt" | tail -n 25
  return $code
}

for case in "$@"; do
  case "$case" in
    graph4)  # braid only, 4 threads, bf16 sweep with CUDA graphs: the shape of collectives_run.sh's algos phase
      run_case graph4 60 40 env BRAID_LOG_LEVEL=debug $bench -t 4 --coll allreduce -d bfloat16 -b 8K -e 16M -f 4 -G 20 --inplace 0 ;;
    graph2)
      run_case graph2 60 40 env BRAID_LOG_LEVEL=debug $bench -t 2 --coll allreduce -d bfloat16 -b 8K -e 16M -f 4 -G 20 --inplace 0 ;;
    nccl4)   # NCCL beside braid, 4 threads, one size: the shape of collectives_run.sh's probe and compare phases
      run_case nccl4 60 40 env NCCL_DEBUG=INFO NCCL_DEBUG_FILE="$out/nccl4-nccl.%h.%p.log" BRAID_LOG_LEVEL=debug \
        $bench -t 4 --compare nccl --nccl-lib "$nccl_dir/libnccl.so.2" --coll allreduce -b 1M -e 1M -w 1 -n 2 --repeats 1 ;;
    nccl2)
      run_case nccl2 60 40 env NCCL_DEBUG=INFO NCCL_DEBUG_FILE="$out/nccl2-nccl.%h.%p.log" \
        $bench -t 2 --compare nccl --nccl-lib "$nccl_dir/libnccl.so.2" --coll allreduce -b 1M -e 1M -w 1 -n 2 --repeats 1 ;;
    smoke4)
      run_case smoke4 40 30 $bench -t 4 --coll allreduce -b 8 -e 8 -w 0 -n 1 --repeats 1 ;;
    *) echo "unknown case $case" ;;
  esac
done
