#!/usr/bin/env bash
# Installs braid from BUILD_DIR into a temporary prefix, checks that the NCCL shim came with it, builds
# tests/install against it with find_package(braid), and runs the result.
set -euo pipefail
build_dir=$1 source_dir=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
# The NCCL shim is installed too, in lib/braid/ (never where it would replace the system's NCCL).
shim=$(find "$work/prefix" -path '*/braid/libnccl.so.2' -type f)
[ -n "$shim" ] || { echo "the NCCL shim (lib/braid/libnccl.so.2) was not installed" >&2; exit 1; }
echo "shim installed: ${shim#$work/prefix/}"
cmake -S "$source_dir/tests/install" -B "$work/build" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/build" >/dev/null
ldd "$work/build/consumer" | grep braid
"$work/build/consumer"
