#!/usr/bin/env bash
# Runs the GPU suite (the non-long tests) with ranks sharing GPUs (BRAID_ALLOW_SHARED_GPU=1) at each world given,
# on the GPU machine (device tool; the build staged by bench/dev/stage_build.sh as .carry/build.tgz). A test that
# outlives WATCHDOG_S (default 40) is named and the run goes on with the tests after it, so one call lists every
# failure and hang of a world, within WORLD_BUDGET_S a world (default 280). Per world: the log, and a summary
# line (passed, failed, hung, seconds). STACKS=1: the stacks of each hung test (cuda-gdb), as stacks-wN-TEST.txt.
#   bench/dev/shared_suite_run.sh [--filter=GTEST_FILTER] WORLD...
set -u
[ -f .carry/build.tgz ] && [ ! -d .carry/build ] && tar -C .carry -xzf .carry/build.tgz
source "$(dirname "$0")/device_env.sh"
export BRAID_ALLOW_SHARED_GPU=1
watchdog=${WATCHDOG_S:-40}
budget=${WORLD_BUDGET_S:-280}
long=$(cat .carry/long_filter 2>/dev/null)
filter="-$long"
case "${1:-}" in --filter=*) filter=${1#--filter=}; shift ;; esac
[[ $filter == -* ]] || filter="$filter-$long"  # the long tests stay out
for world in "$@"; do
  log="$out/shared-w$world.log"
  : > "$log"
  finished="" hung="" start=$SECONDS
  while :; do
    exclude=$finished$hung
    run_filter="$filter$exclude"
    left=$((budget - (SECONDS - start)))
    [ "$left" -gt 5 ] || { echo "[ BUDGET ] world $world: out of time" >> "$log"; break; }
    seen=$(grep -c '^\[ WATCHDOG \]' "$log")
    GPU_TEST_WATCHDOG_HOLD_S=${STACKS:+90} timeout -k 5 "$left" stdbuf -oL build/tests/gpu/braid_gpu_tests \
      --world="$world" --test-watchdog="$watchdog" --gtest_filter="$run_filter" >> "$log" 2>&1 &
    runner=$!
    while kill -0 $runner 2>/dev/null; do  # STACKS=1: every thread's stack of a test the watchdog names
      sleep 1
      if [ -n "${STACKS:-}" ] && [ "$(grep -c '^\[ WATCHDOG \]' "$log")" != "$seen" ]; then
        pid=$(pgrep -n -x braid_gpu_tests)
        timeout 80 cuda-gdb -batch -p "$pid" -ex "info cuda kernels" -ex "thread apply all bt 30" \
          > "$out/stacks-w$world-$(grep -oE 'WATCHDOG \] [^ ]+' "$log" | tail -1 | awk '{print $3}').txt" 2>&1
        kill -9 "$pid" 2>/dev/null
        break
      fi
    done
    wait $runner
    code=$?
    [ "$(grep -c '^\[ WATCHDOG \]' "$log")" != "$seen" ] && code=124 || { [ "$code" = 124 ] && code=125; }  # 125: budget
    finished=$(grep -oE '^\[ +(OK|FAILED|SKIPPED) +\] [A-Za-z0-9_]+\.[A-Za-z0-9_]+ \(' "$log" \
      | sed -E 's/.*\] ([^ ]+) \(/:\1/' | sort -u | tr -d '\n')
    [ "$code" = 124 ] || break
    name=$(grep -oE 'WATCHDOG \] [^ ]+' "$log" | tail -1 | awk '{print $3}')
    hung="$hung:$name"
  done
  passed=$(grep -cE '^\[ +OK +\]' "$log")
  failed=$(grep -oE '^\[ +FAILED +\] [A-Za-z0-9_.]+ \(' "$log" | sort -u | wc -l)
  echo "world $world: passed $passed, failed $failed, hung ${hung:-none}, $((SECONDS - start)) s, last exit $code" \
    | tee -a "$out/shared-summary.txt"
  grep -E '^\[ +FAILED +\] [A-Za-z0-9_.]+ \(|^\[ WATCHDOG' "$log" | sort -u | tee -a "$out/shared-summary.txt"
done
