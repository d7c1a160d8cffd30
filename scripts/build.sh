#!/usr/bin/env bash
# Builds braid into ./build (or $BUILD_DIR), installing the Debian packages it needs when they are missing.
# nvcc is expected under /usr/local/cuda (CUDA 13). Extra arguments go to cmake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}

packages=(cmake ninja-build g++ libgtest-dev libfmt-dev libcli11-dev nlohmann-json3-dev libssl-dev)
missing=()
for package in "${packages[@]}"; do
  dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "build.sh: installing ${missing[*]}"
  if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
export PATH="/usr/local/cuda/bin:$PATH"

cmake -S . -B "$build_dir" -G Ninja "$@"
cmake --build "$build_dir" -j "$(nproc)"
