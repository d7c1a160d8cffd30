# Sourced by the run scripts on the GPU machine (after bench/stage_build.sh staged the build as
# .carry/build), with the run's KIND as $1 and its title as RUN_TITLE: the device environment (device_env.sh),
# a header with the commit, and bench(), which runs braid-bench with ranks as threads of one process.
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

# Every log in one archive: the device tool brings back only a few files per command.
archive_logs() {  # archive name
  (cd "$out" && tar czf "$1" --remove-files $(ls | grep -v -x "$1"))
}
