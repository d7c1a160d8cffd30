#!/usr/bin/env bash
# Builds braid on the GPU machine (device tool), whose cores build in minutes what a two-core machine builds in
# most of an hour. The Debian -dev packages braid builds with are carried as .deb files in .carry/debs (fetched
# here with `apt-get download libfmt-dev libfmt9 libgtest-dev libcli11-dev nlohmann-json3-dev libssl-dev
# libssl3`) and unpacked into a prefix there, which has no network.
#   bench/dev/device_build.sh SOURCE_DIR BUILD_DIR [TARGET...]
set -euo pipefail
source_dir=$1 build_dir=$2
shift 2
debs=$(cd "$(dirname "$0")/../.." && pwd)/.carry/debs
prefix=/tmp/braid-build-deps
if [ ! -d "$prefix/usr" ]; then
  mkdir -p "$prefix"
  for deb in "$debs"/*.deb; do dpkg-deb -x "$deb" "$prefix"; done
fi
export PATH=/usr/local/cuda/bin:$PATH
generator=Ninja
command -v ninja >/dev/null || generator="Unix Makefiles"
targets=()
for target in "$@"; do targets+=(--target "$target"); done
mkdir -p "$build_dir"
cmake -S "$source_dir" -B "$build_dir" -G "$generator" -DCMAKE_PREFIX_PATH="$prefix/usr" >"$build_dir/configure.log" 2>&1 ||
  { tail -30 "$build_dir/configure.log"; exit 1; }
cmake --build "$build_dir" -j "$(nproc)" "${targets[@]}" >"$build_dir/build.log" 2>&1 ||
  { grep -B2 -A12 -m3 "error" "$build_dir/build.log"; exit 1; }
echo "built $source_dir in $build_dir ${*:-(all)}"
