#!/usr/bin/env bash
# compare_runs.sh LOG_A LOG_B
# Compares two nccl_check logs, typically one run with the shim (LD_PRELOAD) and one with the real NCCL, made
# in the same mode on the same number of GPUs. nccl_check's inputs make every result exact, so a correct
# implementation's outputs are bitwise those of any other: every "case ... hash ..." line must be the same in
# both logs. Lines are sorted first (ranks of a multi-process run print in any order; braid-run's "[r] "
# prefix is dropped). Fails (exit 1) if the case lines differ, if either log has a WRONG case, or if either log
# lacks nccl_check's summary line or reports failures in it (a run that died half way).
# KNOWN_WRONG_IN_B, a regular expression on case lines, names cases LOG_B may get wrong against nccl_check's
# host reference (a fault of the library LOG_B ran, e.g. the real NCCL's in-place ncclAlltoAll, whose sends and
# receives of one buffer race): where LOG_B's line is WRONG and LOG_A's is right, the case is listed apart and
# neither fails the comparison nor counts as a difference. LOG_A never gets that leave.
set -u
if [ $# -ne 2 ]; then
  echo "usage: $0 LOG_A LOG_B" >&2
  exit 2
fi
a=$1 b=$2
status=0

all_cases() { sed -nE 's/^(\[[0-9]+\] )?(case .*)$/\2/p' "$1" | LC_ALL=C sort; }
# The case names (everything before " hash ") whose LOG_B line is WRONG where LOG_A's is right: left out of both.
excused=$(mktemp)
trap 'rm -f "$excused"' EXIT
if [ -n "${KNOWN_WRONG_IN_B:-}" ]; then
  LC_ALL=C join -t '|' <(all_cases "$2" | grep ' WRONG' | grep -E "$KNOWN_WRONG_IN_B" | sed 's/ hash .*//' | LC_ALL=C sort -u) \
    <(all_cases "$1" | grep -v ' WRONG' | sed 's/ hash .*//' | LC_ALL=C sort -u) > "$excused"
fi
cases() { all_cases "$1" | grep -v -F -f <(sed 's/$/ hash /' "$excused"); }

for log in "$a" "$b"; do
  if [ ! -r "$log" ]; then
    echo "compare_runs: cannot read $log" >&2
    exit 2
  fi
  n=$(cases "$log" | wc -l)
  wrong=$(cases "$log" | grep -c ' WRONG')
  summaries=$(grep -cE '^(\[[0-9]+\] )?nccl_check: [0-9]+ passed, [0-9]+ failed' "$log")
  # Failures the summaries report, beyond the excused cases (LOG_B's only).
  failed=$(sed -nE 's/^(\[[0-9]+\] )?nccl_check: [0-9]+ passed, ([0-9]+) failed.*/\2/p' "$log" | awk '{s += $1} END {print s + 0}')
  if [ "$log" = "$b" ]; then failed=$((failed - $(wc -l < "$excused"))); fi
  bad_summaries=$([ "$failed" -ne 0 ] && echo 1 || echo 0)
  echo "compare_runs: $log: $n case lines, $wrong WRONG, $summaries summary line(s)"
  if [ "$wrong" -ne 0 ]; then
    cases "$log" | grep ' WRONG' | head -20 | sed 's/^/  /'
    status=1
  fi
  if [ "$summaries" -eq 0 ] || [ "$bad_summaries" -ne 0 ]; then
    echo "compare_runs: $log: the run reports failures or did not finish:"
    grep -E 'FATAL|nccl_check: [0-9]+ passed' "$log" | head -10 | sed 's/^/  /'
    status=1
  fi
  if [ "$n" -eq 0 ]; then status=1; fi
done

if [ -s "$excused" ]; then
  echo "compare_runs: $(wc -l < "$excused") case(s) $b gets wrong against the host reference and $a right (KNOWN_WRONG_IN_B), the first of them:"
  head -10 "$excused" | sed 's/^/  /'
fi
diffs=$(diff <(cases "$a") <(cases "$b") | grep -c '^[<>]')
if [ "$diffs" -ne 0 ]; then
  echo "compare_runs: $diffs case lines differ (< $a, > $b); the first of them:"
  diff <(cases "$a") <(cases "$b") | grep '^[<>]' | head -40 | sed 's/^/  /'
  status=1
else
  echo "compare_runs: the case lines of both logs are identical"
fi
if [ $status -eq 0 ]; then echo "compare_runs: PASS"; else echo "compare_runs: FAIL"; fi
exit $status
