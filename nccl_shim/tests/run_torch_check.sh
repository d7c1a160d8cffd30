#!/usr/bin/env bash
# run_torch_check.sh NGPUS OUT_DIR SHIM_PATH
# Runs torch_shim_check.py under torchrun twice on NGPUS GPUs: once with the real NCCL (torch's own, mode nccl)
# and once with the shim preloaded (LD_PRELOAD=SHIM_PATH BRAID_LOG_LEVEL=info, mode shim). Keeps both logs in
# OUT_DIR, compares the saved output tensors of the two runs bitwise, prints the shim's "served by" lines, and
# exits nonzero if either run failed or any tensor differs. The .pt files are removed after an identical
# comparison (they are tens of MB) unless KEEP_TENSORS=1. TORCH_CHECK_ARGS adds arguments to both runs of the
# script (e.g. --no-graph; --cpu-gloo checks this script itself on a machine without GPUs).
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
  grep -E 'torch_shim_check: (mode|mapped|rank [0-9]+ mode|.*not a power)' "$out/torch-$mode.log" | sed 's/^/  /'
done
echo "run_torch_check: nccl run exit $nccl_rc, shim run exit $shim_rc"
[ $nccl_rc -ne 0 ] && { echo "--- the end of the nccl run's log:"; tail -n 30 "$out/torch-nccl.log"; }
[ $shim_rc -ne 0 ] && { echo "--- the end of the shim run's log:"; tail -n 30 "$out/torch-shim.log"; }

# Bitwise comparison of every saved output, rank by rank.
python3 - "$out" "$ngpus" <<'EOF'
import os, sys
import torch

out, n = sys.argv[1], int(sys.argv[2])
def bits(t):
    return t.contiguous().flatten().view(torch.uint8)
compared = differ = 0
problems = []
for r in range(n):
    files = [os.path.join(out, f"rank{r}-{mode}.pt") for mode in ("nccl", "shim")]
    missing = [f for f in files if not os.path.exists(f)]
    if missing:
        problems.append(f"rank {r}: missing {', '.join(missing)}")
        continue
    a, b = (torch.load(f) for f in files)
    for key in sorted(set(a) | set(b)):
        if key not in a or key not in b:
            problems.append(f"rank {r}: {key} only in the {'nccl' if key in a else 'shim'} run")
            continue
        x, y = a[key], b[key]
        compared += 1
        if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(bits(x), bits(y)):
            differ += 1
            problems.append(f"rank {r}: {key} differs")
for p in problems[:60]:
    print("  " + p)
if len(problems) > 60:
    print(f"  ... and {len(problems) - 60} more")
print(f"run_torch_check: {compared} tensors compared, {differ} differ, {len(problems) - differ} other problems")
sys.exit(0 if compared and not problems else 1)
EOF
compare_rc=$?

echo "--- the shim's served-by lines (count, line):"
# Lines are counted over ranks: whatever precedes "braid shim:" (log prefix, host, rank) is dropped first.
grep -h "served by" "$out/torch-shim.log" | sed -E 's/^.*(braid shim:)/\1/' | sort | uniq -c | sort -rn | head -60
[ "$(grep -c "served by" "$out/torch-shim.log")" -eq 0 ] && echo "  (none: is BRAID_LOG_LEVEL=info honoured?)"

if [ $nccl_rc -eq 0 ] && [ $shim_rc -eq 0 ] && [ $compare_rc -eq 0 ]; then
  [ "${KEEP_TENSORS:-0}" = 1 ] || rm -f "$out"/rank*-nccl.pt "$out"/rank*-shim.pt
  echo "run_torch_check: PASS: both runs right, every output bitwise identical"
  exit 0
fi
echo "run_torch_check: FAIL (tensors kept in $out)"
exit 1
