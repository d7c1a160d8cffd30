#!/usr/bin/env bash
# Stages the build for the GPU machine: the build tree without objects, binaries stripped of debug info
# (the device tool carries at most 64 MiB), as .carry/build.tgz, and the commit it was built from.
# STAGE_EXCLUDE names build folders to leave out when the total would not fit (e.g. STAGE_EXCLUDE="nccl_shim
# probes" for runs of braid's own tests and benchmarks).
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v rsync > /dev/null || { echo "stage_build.sh needs rsync (apt-get install rsync)" >&2; exit 1; }
rm -rf .carry/build .carry/build.tgz && mkdir -p .carry
excludes=()
for folder in ${STAGE_EXCLUDE:-}; do excludes+=(--exclude "/$folder"); done
# Not needed there: the CPU tests (CI runs them) and the cuobjdump wheel of the kernel checks.
rsync -a --exclude CMakeFiles --exclude '*.o' --exclude '*.a' --exclude Testing --exclude braid_cpu_tests \
  --exclude cuobjdump-pypi "${excludes[@]}" build/ .carry/build/
find .carry/build -type f \( -perm -u+x -o -name '*.so*' \) -exec strip --strip-debug {} + 2>/dev/null || true
# The build travels as one gzip archive (bench/dev/ordering_run.sh unpacks it): GPU tests and braid-bench link the
# kernels statically, so the tree itself is about twice what the device tool carries.
tar -C .carry -czf .carry/build.tgz build && rm -rf .carry/build
git rev-parse HEAD > .carry/COMMIT
git diff --quiet HEAD -- src include tools tests || echo "(with uncommitted changes)" >> .carry/COMMIT
du -sh .carry
