#!/usr/bin/env bash
# Builds braid into ./build (or $BUILD_DIR), installing the Debian packages it needs when they are missing and
# fetching NCCL's headers (the nvidia-nccl-cu13 2.28.9 wheel) when the CUDA toolkit has none. What it cannot install,
# it names with the fix: nvcc of CUDA 13 under /usr/local/cuda, and (to run, not to build) an NVIDIA driver of
# the R580 series or newer. Extra arguments go to cmake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}

nvcc=/usr/local/cuda/bin/nvcc
if [ ! -x "$nvcc" ]; then
  echo "build.sh: $nvcc not found: install the CUDA 13 toolkit (https://developer.nvidia.com/cuda-downloads) under /usr/local/cuda" >&2
  exit 1
fi
cuda_release=$("$nvcc" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
if [ -z "$cuda_release" ] || [ "$cuda_release" -lt 13 ]; then
  echo "build.sh: $nvcc is CUDA ${cuda_release:-of an unknown release}; braid needs CUDA 13 or newer" >&2
  exit 1
fi
if command -v nvidia-smi >/dev/null 2>&1; then  # a note only: building needs no GPU
  driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1 || true)
  if [ -n "$driver" ] && [ "${driver%%.*}" -lt 580 ] 2>/dev/null; then
    echo "build.sh: note: the NVIDIA driver is $driver; braid's CUDA 13 runtime needs R580 or newer to run here" >&2
  fi
fi

packages=(cmake ninja-build g++ libgtest-dev libfmt-dev libcli11-dev nlohmann-json3-dev libssl-dev spin)
# Debian's own python3 needs its headers (python3-dev) for the Python package's extension, and pip.
if [ "$(command -v python3 || true)" = /usr/bin/python3 ]; then packages+=(python3-dev python3-pip); fi
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

# nccl.h of NCCL 2.28 or newer (declarations only: braid loads NCCL at run time): the toolkit's or $NCCL_HOME's,
# else the nvidia-nccl-cu13 wheel's, fetched once into the build folder.
nccl_args=()
if [ ! -f /usr/local/cuda/include/nccl.h ] && [ ! -f "${NCCL_HOME:-/nonexistent}/include/nccl.h" ]; then
  wheel_dir="$PWD/$build_dir/_deps/nccl"
  if [ -z "$(find "$wheel_dir" -name nccl.h 2>/dev/null | head -1)" ]; then
    if ! command -v python3 >/dev/null 2>&1; then
      echo "build.sh: nccl.h is not in /usr/local/cuda/include, and python3 (to fetch the nvidia-nccl-cu13 wheel) is" \
           "missing: install python3 and pip, or NCCL 2.28+ headers (set NCCL_HOME to their prefix)" >&2
      exit 1
    fi
    echo "build.sh: nccl.h is not in /usr/local/cuda/include: fetching it from the nvidia-nccl-cu13 wheel"
    python3 -m pip install --quiet --no-deps --target "$wheel_dir" "nvidia-nccl-cu13==2.28.9"
  fi
  nccl_args=(-DBRAID_NCCL_INCLUDE_DIR="$(dirname "$(find "$wheel_dir" -name nccl.h | head -1)")")
fi

# The Python package (python/, docs/python.md) and its pytest suite: nanobind, scikit-build-core and pytest for
# python3, installed into the build folder (as the NCCL wheel is: no system or user site is touched) when python3
# lacks them. Without them CMake leaves the package out and says so.
python_args=()
if command -v python3 >/dev/null 2>&1; then
  python_deps="$PWD/$build_dir/_deps/python"
  if ! PYTHONPATH="$python_deps" python3 -c "import nanobind, pytest, scikit_build_core" >/dev/null 2>&1; then
    echo "build.sh: installing nanobind, scikit-build-core and pytest for python3 into $python_deps"
    python3 -m pip install --quiet --target "$python_deps" nanobind scikit-build-core pytest ||
      echo "build.sh: note: pip could not install them: the Python package is left out of this build" >&2
  fi
  python_args=(-DBRAID_PYTHON_DEPS="$python_deps")
fi

cmake -S . -B "$build_dir" -G Ninja "${nccl_args[@]}" "${python_args[@]}" "$@"
cmake --build "$build_dir" -j "$(nproc)"
