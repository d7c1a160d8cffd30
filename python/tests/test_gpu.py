"""GPU tests: ranks under torchrun on 2 GPUs run python/tests/gpu/worker.py, which checks every collective on
tensors against torch.distributed (NCCL) on the same random data (all_to_all_v_device, split sizes on the GPU,
too), point to point, symmetric tensors (.peer, .view_all), a captured all_reduce, MoE dispatch and combine on
both layouts against a reference (and fp8), 200 replays of a captured dispatch + combine with T on the device,
torch.compile of a MoE layer against eager, its backward through plain autograd (the routing weights' gradient
too) on every layout against an all-gathered reference, a compiled all_reduce as a process's first braid call, a
braid.SignalPad driven by Triton kernels, braid.init(group=), and braid.ops' fused GEMMs (all_gather_matmul,
matmul_reduce_scatter) against NCCL's collective and torch.matmul, eager, captured, compiled and differentiated.
With one GPU and BRAID_ALLOW_SHARED_GPU=1 the 2 ranks share it, and the reference is computed on the host from
every rank's inputs (gpu/reference.py: NCCL refuses two ranks on one GPU). Skipped, with the reason, without torch
or with fewer than 2 GPUs otherwise."""
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

WORKER = Path(__file__).with_name("gpu") / "worker.py"
RANKS = 2


def _free_port_pair() -> int:
    """A port p with p and p + 1 free: torchrun's store takes MASTER_PORT, braid's MASTER_PORT + 1."""
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            try:
                with socket.socket() as b:
                    b.bind(("127.0.0.1", port + 1))
                    return port
            except OSError:
                continue
    raise RuntimeError("no pair of free ports")


@pytest.fixture(scope="module")
def torchrun():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    shared = os.environ.get("BRAID_ALLOW_SHARED_GPU") == "1"
    if gpus < RANKS and not (shared and gpus >= 1):
        pytest.skip(f"needs {RANKS} CUDA GPUs, or one with BRAID_ALLOW_SHARED_GPU=1; torch sees {gpus}")

    def run(section: str):
        command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={RANKS}",
                   "--master-addr=127.0.0.1", f"--master-port={_free_port_pair()}", str(WORKER), section]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), BRAID_TIMEOUT_S="60")
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        output = result.stdout + result.stderr
        assert result.returncode == 0, output
        assert output.count(f"{section} OK") == RANKS, output
    return run


@pytest.mark.parametrize("section", ["collectives", "all_to_all", "all_to_all_device", "p2p", "symmetric", "graph",
                                     "moe", "moe_graph", "moe_compile", "moe_backward", "signal_pad", "init_group",
                                     "compile_first", "fused_matmul"])
def test_two_ranks(torchrun, section):
    torchrun(section)
