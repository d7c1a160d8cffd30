#!/usr/bin/env bash
# Installs braid from BUILD_DIR into a temporary prefix, builds tests/install against it with
# find_package(braid), and runs the result.
set -euo pipefail
build_dir=$1 source_dir=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
cmake -S "$source_dir/tests/install" -B "$work/build" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/build" >/dev/null
ldd "$work/build/consumer" | grep braid
"$work/build/consumer"
