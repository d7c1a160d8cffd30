#!/usr/bin/env bash
# Runs the Python GPU tests (python/tests/test_gpu.py, pytest arguments passed on) on the GPU machine (device tool;
# the build staged by bench/dev/stage_build.sh as .carry/build.tgz, configured for the machine's Python 3.12), with
# the package imported from build/python. One GPU: the 2 ranks share it (BRAID_ALLOW_SHARED_GPU=1). The log is
# python-gpu.log.
set -u
[ -f .carry/build.tgz ] && [ ! -d .carry/build ] && tar -C .carry -xzf .carry/build.tgz
source "$(dirname "$0")/device_env.sh"
[ "$(nvidia-smi -L | wc -l)" -lt 2 ] && export BRAID_ALLOW_SHARED_GPU=1
export PYTHONPATH="$PWD/build/python"
python3 -c "import braid, torch; print('braid from', braid.__file__, '; torch', torch.__version__, 'sees', torch.cuda.device_count(), 'GPUs')" 2>&1 | tee "$out/python-gpu.log"
stdbuf -oL python3 -m pytest -v -rs --durations=0 python/tests/test_gpu.py "$@" 2>&1 | tee -a "$out/python-gpu.log" | tail -60
