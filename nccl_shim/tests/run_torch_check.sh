#!/usr/bin/env bash
# run_torch_check.sh NGPUS OUT_DIR SHIM_PATH
# Runs torch_shim_check.py under torchrun twice on NGPUS GPUs: once with the real NCCL (torch's own, mode nccl)
# and once with the shim preloaded (LD_PRELOAD=SHIM_PATH BRAID_LOG_LEVEL=info, mode shim). Keeps both logs in
# OUT_DIR, compares the saved output tensors of the two runs bitwise, prints the training sections' step times
# (ddp, fsdp2, fsdp2pg, compile) of both runs side by side and the shim's "served by" lines, and exits nonzero if either run
# failed, any tensor differs, or a section was skipped in one run and not in the other. A section skipped in both
# (e.g. compile where this machine has no compiler toolchain) is reported as SKIPPED, not as passed. The .pt files
# are removed after an identical comparison (they are tens of MB) unless KEEP_TENSORS=1. TORCH_CHECK_ARGS adds
# arguments to both runs of the script (e.g. --no-graph --no-fsdp --no-compile; --cpu-gloo checks this script
# itself on a machine without GPUs).
#
# The training sections' tensors (losses, parameters) come from float sums over the ranks: exact for one summation
# order only. With 2 ranks there is one order, and they must be bitwise equal. With more, braid and NCCL may add in
# different orders, so there they must be equal within TRAIN_RTOL (relative, default 1e-4) and TRAIN_ATOL (default
# 1e-6), and the largest difference is printed; TRAIN_BITWISE=1 asks for bitwise equality at any number of ranks.
set -u
if [ $# -ne 3 ]; then
  echo "usage: $0 NGPUS OUT_DIR SHIM_PATH" >&2
  exit 2
fi
ngpus=$1 out=$2 shim=$(realpath "$3")
here=$(cd "$(dirname "$0")" && pwd)
[ -f "$shim" ] || { echo "run_torch_check: no shim at $shim" >&2; exit 2; }
mkdir -p "$out"
rm -f "$out"/rank*-nccl.pt "$out"/rank*-shim.pt

# Never NVLink multicast (NVLS), in NCCL, torch's symmetric memory or NVSHMEM.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# The real NCCL's folder (pip's nvidia-nccl), where the shim may look for its fallback; both runs get it alike.
nccl_dir=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
if [ -n "$nccl_dir" ]; then export LD_LIBRARY_PATH="$nccl_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
echo "run_torch_check: $ngpus GPUs, shim $shim, real NCCL folder ${nccl_dir:-?}, logs and tensors in $out"

run() {  # run MODE [VAR=VALUE...]
  local mode=$1
  shift
  # shellcheck disable=SC2086  # TORCH_CHECK_ARGS is several words on purpose
  env -u LD_PRELOAD "$@" python3 -m torch.distributed.run --standalone --nproc-per-node "$ngpus" \
    "$here/torch_shim_check.py" --mode "$mode" --out "$out" ${TORCH_CHECK_ARGS:-} >"$out/torch-$mode.log" 2>&1
}
run nccl
nccl_rc=$?
run shim LD_PRELOAD="$shim" BRAID_LOG_LEVEL=info
shim_rc=$?
for mode in nccl shim; do
  echo "--- $mode run: $(grep -c ' WRONG' "$out/torch-$mode.log") WRONG lines; its summary lines:"
  grep -E 'torch_shim_check: (mode|mapped|training model|rank [0-9]+ mode|.*not a power|(ddp|fsdp2|fsdp2pg|compile) |[a-z0-9]+ skipped:)' \
    "$out/torch-$mode.log" | sed 's/^/  /'
done
echo "run_torch_check: nccl run exit $nccl_rc, shim run exit $shim_rc"
[ $nccl_rc -ne 0 ] && { echo "--- the end of the nccl run's log:"; tail -n 30 "$out/torch-nccl.log"; }
[ $shim_rc -ne 0 ] && { echo "--- the end of the shim run's log:"; tail -n 30 "$out/torch-shim.log"; }

# Comparison of every saved output, rank by rank: bitwise, except as the header says for the training sections.
python3 - "$out" "$ngpus" <<'EOF'
import os, sys
import torch

out, n = sys.argv[1], int(sys.argv[2])
TRAINING = ("ddp.", "fsdp2.", "fsdp2pg.", "compile.")  # float sums over the ranks (see the header)
exact_training = n <= 2 or os.environ.get("TRAIN_BITWISE", "0") == "1"
rtol, atol = float(os.environ.get("TRAIN_RTOL", "1e-4")), float(os.environ.get("TRAIN_ATOL", "1e-6"))
def bits(t):
    return t.contiguous().flatten().view(torch.uint8)
def largest_difference(x, y):
    return (x.double() - y.double()).abs().max().item() if x.numel() else 0.0
compared = differ = 0
problems = []
skipped = {}  # section -> reason (rank 0's nccl run), for the sections both runs skipped
close = {}  # training section -> [tensors equal only within the tolerance, largest difference]
for r in range(n):
    files = [os.path.join(out, f"rank{r}-{mode}.pt") for mode in ("nccl", "shim")]
    missing = [f for f in files if not os.path.exists(f)]
    if missing:
        problems.append(f"rank {r}: missing {', '.join(missing)}")
        continue
    a, b = (torch.load(f) for f in files)
    for key in sorted(set(a) | set(b)):
        if key.startswith("skipped."):  # a marker, not an output: its reason may differ between runs
            section = key[len("skipped."):]
            if key in a and key in b:
                skipped.setdefault(section, bytes(a[key].tolist()).decode(errors="replace"))
            else:
                problems.append(f"rank {r}: {section} skipped only in the {'nccl' if key in a else 'shim'} run")
            continue
        if key not in a or key not in b:
            problems.append(f"rank {r}: {key} only in the {'nccl' if key in a else 'shim'} run")
            continue
        x, y = a[key], b[key]
        compared += 1
        if x.dtype == y.dtype and x.shape == y.shape and torch.equal(bits(x), bits(y)):
            continue
        training = key.startswith(TRAINING) and x.dtype == y.dtype and x.shape == y.shape and x.is_floating_point()
        if training and not exact_training and torch.allclose(x, y, rtol=rtol, atol=atol):
            entry = close.setdefault(key.split(".")[0], [0, 0.0])
            entry[0] += 1
            entry[1] = max(entry[1], largest_difference(x, y))
            continue
        differ += 1
        detail = f" (largest difference {largest_difference(x, y):.3g})" if training else ""
        problems.append(f"rank {r}: {key} differs{detail}")
for p in problems[:60]:
    print("  " + p)
if len(problems) > 60:
    print(f"  ... and {len(problems) - 60} more")
for section, (count, largest) in sorted(close.items()):
    print(f"run_torch_check: {section}: {count} tensors not bitwise equal but within rtol {rtol:g}, atol {atol:g} "
          f"(largest difference {largest:.3g}): float sums of {n} ranks, braid's order vs NCCL's")
for section, reason in sorted(skipped.items()):
    print(f"run_torch_check: {section} SKIPPED in both runs: {reason}")
print(f"run_torch_check: {compared} tensors compared, {differ} differ, {len(problems) - differ} other problems")
sys.exit(0 if compared and not problems else 1)
EOF
compare_rc=$?

# The training sections' step times side by side (rank 0's mean over its timed steps), and their skips: a section
# skipped in one run and not in the other fails the check, even where no tensor says so (a run that died first).
echo "--- step times, rank 0, ms per step:"
printf '  %-8s %10s %10s %9s\n' section nccl shim shim/nccl
step_ms() {  # step_ms MODE SECTION
  sed -nE "s/^.*torch_shim_check: $2 [0-9]+ steps ([0-9.]+) ms\/step.*$/\1/p" "$out/torch-$1.log" | head -n 1
}
skips() {  # skips MODE: the sections that run reported skipped, sorted, space-separated
  sed -nE 's/^.*torch_shim_check: ([a-z0-9]+) skipped:.*$/\1/p' "$out/torch-$1.log" | sort -u | tr '\n' ' '
}
for section in ddp fsdp2 fsdp2pg compile; do
  t_nccl=$(step_ms nccl $section) t_shim=$(step_ms shim $section)
  ratio=-
  if [ -n "$t_nccl" ] && [ -n "$t_shim" ]; then
    ratio=$(awk -v a="$t_nccl" -v b="$t_shim" 'BEGIN { if (a > 0) printf "%.3f", b / a; else print "-" }')
  fi
  printf '  %-8s %10s %10s %9s\n' "$section" "${t_nccl:--}" "${t_shim:--}" "$ratio"
done
skipped_nccl=$(skips nccl) skipped_shim=$(skips shim)
skipped_nccl=${skipped_nccl% } skipped_shim=${skipped_shim% }
skip_rc=0
if [ "$skipped_nccl" != "$skipped_shim" ]; then
  echo "run_torch_check: the runs skipped different sections: nccl run [$skipped_nccl], shim run [$skipped_shim]"
  skip_rc=1
fi

echo "--- the shim's served-by lines (count, line):"
# Lines are counted over ranks: whatever precedes "braid shim:" (log prefix, host, rank) is dropped first.
grep -h "served by" "$out/torch-shim.log" | sed -E 's/^.*(braid shim:)/\1/' | sort | uniq -c | sort -rn | head -60
[ "$(grep -c "served by" "$out/torch-shim.log")" -eq 0 ] && echo "  (none: is BRAID_LOG_LEVEL=info honoured?)"

if [ $nccl_rc -eq 0 ] && [ $shim_rc -eq 0 ] && [ $compare_rc -eq 0 ] && [ $skip_rc -eq 0 ]; then
  [ "${KEEP_TENSORS:-0}" = 1 ] || rm -f "$out"/rank*-nccl.pt "$out"/rank*-shim.pt
  echo "run_torch_check: PASS: both runs right, every output bitwise identical (or, where said above, within" \
    "tolerance)${skipped_nccl:+; SKIPPED, not passed: $skipped_nccl}"
  exit 0
fi
echo "run_torch_check: FAIL (tensors kept in $out)"
exit 1
