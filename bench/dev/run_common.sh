# Sourced by the run scripts on the GPU machine (after bench/dev/stage_build.sh staged the build as
# .carry/build), with the run's KIND as $1 and its title as RUN_TITLE: the device environment (device_env.sh),
# a header with the commit, bench(), which runs braid-bench with ranks as threads of one process, and gpu_tests().
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh"
kind=$1
gpus=$(nvidia-smi -L | wc -l)
export BRAID_COMMIT=$(head -1 .carry/COMMIT)
nccl_dir=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))")
# Ranks as threads of one braid-bench: its own stdout (line-buffered by stdbuf) goes straight to the log, so
# a run cut off by its time limit still leaves every row it printed.
run_bench="build/tools/braid-bench/braid-bench -t $gpus"
echo "# braid $RUN_TITLE run: commit $(cat .carry/COMMIT | tr '\n' ' '), kind $kind, $gpus GPUs, $(date -u +%Y-%m-%dT%H:%MZ)" | tee "$out/header.txt"
nvidia-smi -L >> "$out/header.txt"

bench() {  # seconds, name, then braid-bench arguments
  local seconds=$1 name=$2; shift 2
  { echo "## braid-bench -t $gpus $*"; } > "$out/$name.txt"
  timeout "$seconds" stdbuf -oL $run_bench "$@" --json "$out/$name.json" >> "$out/$name.txt" 2>&1
  echo "## exit code $?" >> "$out/$name.txt"
  grep -v '^\[[1-9]' "$out/$name.txt" | tail -n 40
}

# GPU tests of a gtest filter as threads (on every GPU, then 2) and as braid-run processes (every GPU), a log each,
# with the result lines shown.
gpu_tests() {  # seconds, name, gtest filter
  local seconds=$1 name=$2 filter="--gtest_filter=$3"
  for world in $(printf '%s\n' "$gpus" 2 | sort -u); do
    timeout "$seconds" stdbuf -oL build/tests/gpu/braid_gpu_tests "$filter" --world=$world > "$out/$name-threads-$world.log" 2>&1
    echo "$name tests (threads, $world ranks) exit $?" | tee -a "$out/$name-threads-$world.log"
    grep -E "OK \]|FAILED|Failure|PASSED|SKIPPED|threw|Error" "$out/$name-threads-$world.log" | head -60
  done
  timeout "$seconds" build/tools/braid-run/braid-run -n "$gpus" -- build/tests/gpu/braid_gpu_tests "$filter" \
    > "$out/$name-processes-$gpus.log" 2>&1
  echo "$name tests (processes, $gpus ranks) exit $?" | tee -a "$out/$name-processes-$gpus.log"
  grep -E "FAILED|Failure|PASSED|threw" "$out/$name-processes-$gpus.log" | head -40
}

# Every log in one archive: the device tool brings back only a few files per command.
archive_logs() {  # archive name
  (cd "$out" && tar czf "$1" --remove-files $(ls | grep -v -x "$1"))
}
