#!/usr/bin/env bash
# Stages the build for the GPU machine: the build tree without objects, binaries stripped of debug info
# (the device tool carries at most 64 MiB), and the commit it was built from. STAGE_EXCLUDE names build
# folders to leave out when the total would not fit (e.g. STAGE_EXCLUDE="nccl_shim probes" for runs of braid's
# own tests and benchmarks).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .carry/build && mkdir -p .carry
excludes=()
for folder in ${STAGE_EXCLUDE:-}; do excludes+=(--exclude "/$folder"); done
rsync -a --exclude CMakeFiles --exclude '*.o' --exclude '*.a' --exclude Testing "${excludes[@]}" build/ .carry/build/
find .carry/build -type f \( -perm -u+x -o -name '*.so*' \) -exec strip --strip-debug {} + 2>/dev/null || true
git rev-parse HEAD > .carry/COMMIT
git diff --quiet HEAD -- src include tools tests || echo "(with uncommitted changes)" >> .carry/COMMIT
du -sh .carry
