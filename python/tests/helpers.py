"""Shared by the tests: run Python in a fresh interpreter (environment variables and blocked imports that must
not leak into the test process), and a stand-in communicator for the checks that need no GPU."""
import contextlib
import os
import subprocess
import sys
import types


def run_python(code: str, env: dict | None = None, block_torch: bool = False, timeout: float = 120):
    """Runs `code` in a new interpreter with this process's sys.path and `env` over this environment (None
    unsets a variable); returns the CompletedProcess."""
    prelude = "import sys\n"
    if block_torch:  # `import torch` then fails as it does where torch is not installed
        prelude += "sys.modules['torch'] = None\n"
    full_env = {k: v for k, v in os.environ.items()}
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    for name, value in (env or {}).items():  # None: unset
        if value is None:
            full_env.pop(name, None)
        else:
            full_env[name] = value
    return subprocess.run([sys.executable, "-c", prelude + code], env=full_env, capture_output=True, text=True,
                          timeout=timeout)


# Launcher variables Rendezvous.from_env() reads: cleared so a test sees only what it sets.
LAUNCHER_VARIABLES = ["BRAID_RANK", "BRAID_WORLD_SIZE", "BRAID_STORE_ADDR", "BRAID_LOCAL_RANK", "BRAID_LOCAL_WORLD_SIZE",
                      "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                      "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID",
                      "SLURM_NTASKS"]


class OpLog:
    """Records the braid ops that run (name and arguments, in order) under a TorchDispatchMode: `with log.mode:`."""

    def __init__(self, torch):
        from torch.utils._python_dispatch import TorchDispatchMode
        calls = self.calls = []

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func.namespace == "braid":
                    calls.append((func._opname, args))
                return func(*args, **(kwargs or {}))

        self.mode = Mode()

    def names(self):
        return [name for name, _ in self.calls]


@contextlib.contextmanager
def stand_in_op_handle(world: int):
    """An op handle naming a stand-in communicator of `world` ranks: the argument checks and the custom ops' fake
    implementations read only its size, rank and device, so they run without a GPU."""
    import braid
    stand_in = types.SimpleNamespace(size=world, rank=0, device=0)
    yield braid.op_handle(stand_in)
    braid._handles.release_handle(stand_in)
