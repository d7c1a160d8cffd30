#!/usr/bin/env bash
# selftest.sh CHECK_MOCK BENCH_MOCK MOCK_NCCL_LIB COMPARE_RUNS [SHIM]
# Tests the testers, without a GPU: nccl_check and nccl_shim_bench built against mock/ (CUDA and NCCL in host
# memory). A checker that passes everything proves nothing, so besides "a correct implementation passes" this
# shows that each kind of mistake the checks exist for (a wrong element, a write past the output, a write into
# the send buffer, an output never written, a graph replay that leaves work out) is reported WRONG with a
# nonzero exit, and that compare_runs.sh accepts equal runs and rejects different ones. Where python3 has torch,
# run_torch_check.sh also runs torch_shim_check.py on CPU tensors through gloo (--cpu-gloo), with SHIM preloaded
# in its shim run: the script's references, splits, saving and comparison, not NCCL.
set -u
check=$1 bench=$2 mocklib=$3 compare=$4 shim=${5:-}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export MOCK_CUDA_DEVICES=4
status=0
pass() { echo "selftest: ok   $*"; }
fail() { echo "selftest: FAIL $*"; status=1; }

# A correct implementation passes: every count once with one rank (the 1 Mi + 3 and 24 Mi element paths), and
# the small counts with 2, 3 (not a power of two: avg skipped, a rank exchanging with itself) and 4 ranks.
for args in "-t 1" "-t 2 --max-count 4097" "-t 3 --max-count 4097" "-t 4 --max-count 4097"; do
  log=$tmp/clean${args// /_}.log
  # shellcheck disable=SC2086  # $args is several words on purpose
  if "$check" $args >"$log" 2>&1 && grep -q '^nccl_check: [0-9]* passed, 0 failed' "$log"; then
    pass "nccl_check $args: $(grep '^nccl_check: [0-9]* passed' "$log")"
  else
    fail "nccl_check $args on a correct mock:"
    grep -E 'WRONG|FATAL|passed' "$log" | head -5
  fi
done
if grep -q 'skipped (avg is exact only' "$tmp/clean-t_3_--max-count_4097.log"; then
  pass "avg skipped with 3 ranks"
else
  fail "avg not skipped with 3 ranks"
fi

# Two runs of a correct implementation compare equal; the hashes are deterministic.
"$check" -t 2 --max-count 4097 >"$tmp/again.log" 2>&1
if "$compare" "$tmp/clean-t_2_--max-count_4097.log" "$tmp/again.log" >"$tmp/cmp.log" 2>&1; then
  pass "compare_runs accepts two equal runs"
else
  fail "compare_runs rejected two equal runs:"
  cat "$tmp/cmp.log"
fi

# Every kind of mistake is caught, and compare_runs rejects the run that has it.
for fault in flip overrun send skip; do
  log=$tmp/fault-$fault.log
  MOCK_NCCL_FAULT=$fault MOCK_NCCL_CORRUPT=37 "$check" -t 2 --max-count 4097 >"$log" 2>&1
  code=$?
  if [ $code -ne 0 ] && grep -q ' WRONG' "$log"; then
    pass "fault '$fault' reported: $(grep -m1 ' WRONG' "$log" | cut -c1-150)"
  else
    fail "fault '$fault' not reported (exit $code)"
  fi
  if "$compare" "$tmp/clean-t_2_--max-count_4097.log" "$log" >/dev/null 2>&1; then
    fail "compare_runs accepted a run with fault '$fault'"
  fi
done
log=$tmp/fault-graph.log
MOCK_CUDA_GRAPH_FAULT=5 "$check" -t 2 --max-count 4097 >"$log" 2>&1
code=$?
if [ $code -ne 0 ] && grep -q '^case graph.* WRONG replay' "$log"; then
  pass "a graph replay leaving work out is reported: $(grep -m1 ' WRONG' "$log" | cut -c1-150)"
else
  fail "a graph replay leaving work out was not reported (exit $code)"
fi
# A log cut short (a run that died) is rejected even where its case lines agree.
head -n 100 "$tmp/again.log" >"$tmp/short.log"
if "$compare" "$tmp/short.log" "$tmp/short.log" >/dev/null 2>&1; then
  fail "compare_runs accepted a run without its summary line"
else
  pass "compare_runs rejects a run without its summary line"
fi

# Id file: a rank other than 0 waits a bounded time, and ignores a stale file of an earlier run.
start=$(date +%s)
RANK=1 WORLD_SIZE=2 "$check" --id-file "$tmp/id" --id-timeout 1 >"$tmp/id.log" 2>&1
code=$?
if [ $code -ne 0 ] && grep -q 'no unique-id file' "$tmp/id.log" && [ $(($(date +%s) - start)) -lt 20 ]; then
  pass "a missing id file ends rank 1 with a message"
else
  fail "missing id file: exit $code"
  cat "$tmp/id.log"
fi
head -c 128 /dev/zero >"$tmp/stale"
touch -d '-10 minutes' "$tmp/stale"
RANK=1 WORLD_SIZE=2 "$check" --id-file "$tmp/stale" --id-timeout 1 >"$tmp/stale.log" 2>&1
if grep -q 'no unique-id file' "$tmp/stale.log"; then
  pass "a stale id file is ignored"
else
  fail "a stale id file was read"
  cat "$tmp/stale.log"
fi

# The benchmark runs its whole loop (one rank), writes its JSON, and counts wrong results.
if "$bench" --shim "$mocklib" --nccl "$mocklib" -b 8K -e 64K -n 3 --json "$tmp/bench.json" >"$tmp/bench.log" 2>&1 &&
  grep -q '"rows"' "$tmp/bench.json" && [ "$(grep -c '"size"' "$tmp/bench.json")" -eq 4 ]; then
  pass "nccl_shim_bench: 4 rows, JSON written"
  if command -v python3 >/dev/null && ! python3 -m json.tool "$tmp/bench.json" >/dev/null; then
    fail "nccl_shim_bench wrote invalid JSON"
  fi
else
  fail "nccl_shim_bench on the mock:"
  cat "$tmp/bench.log"
fi
MOCK_NCCL_CORRUPT=every "$bench" --shim "$mocklib" --nccl "$mocklib" -b 8K -e 16K -n 3 >"$tmp/bench-bad.log" 2>&1
code=$?
if [ $code -ne 0 ] && grep -q '#wrong total: [1-9]' "$tmp/bench-bad.log"; then
  pass "nccl_shim_bench counts wrong results"
else
  fail "nccl_shim_bench missed wrong results (exit $code)"
  cat "$tmp/bench-bad.log"
fi

if [ -z "$shim" ] || ! python3 -c 'import torch' 2>/dev/null; then
  echo "selftest: skipped the torch script's CPU run (no torch in python3, or no shim given)"
elif TORCH_CHECK_ARGS=--cpu-gloo bash "$here/run_torch_check.sh" 2 "$tmp/torch" "$shim" >"$tmp/torch.log" 2>&1; then
  pass "run_torch_check.sh --cpu-gloo: $(grep -m1 'tensors compared' "$tmp/torch.log")"
else
  fail "run_torch_check.sh --cpu-gloo:"
  tail -n 30 "$tmp/torch.log"
fi

if [ $status -eq 0 ]; then echo "selftest: PASS"; else echo "selftest: FAIL"; fi
exit $status
