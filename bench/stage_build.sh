#!/usr/bin/env bash
# Stages the build for the GPU machine: the build tree without objects, binaries stripped of debug info
# (the device tool carries at most 64 MiB), and the commit it was built from.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .carry/build && mkdir -p .carry
rsync -a --exclude CMakeFiles --exclude '*.o' --exclude '*.a' --exclude Testing build/ .carry/build/
find .carry/build -type f \( -perm -u+x -o -name '*.so*' \) -exec strip --strip-debug {} + 2>/dev/null || true
git rev-parse HEAD > .carry/COMMIT
git diff --quiet HEAD -- src include tools tests || echo "(with uncommitted changes)" >> .carry/COMMIT
du -sh .carry
