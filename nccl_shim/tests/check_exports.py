#!/usr/bin/env python3
"""The shim exports every function of the NCCL releases it keeps pace with and every nccl* function the PyTorch
releases it supports import (the lists in nccl_shim/abi/), each with NCCL's pncclX alias, so that no program
built for them meets an unresolved symbol. Then a function the real NCCL beside the shim may lack is called
through the shim without a communicator: it must answer with an error code, not end the process.

  check_exports.py LIBNCCL_SHIM ABI_DIR

Exit 77 (skipped) without binutils' nm.
"""
import ctypes
import pathlib
import shutil
import subprocess
import sys

NCCL_INVALID_ARGUMENT, NCCL_INVALID_USAGE = 4, 5


def listed(abi: pathlib.Path):
    wanted = {}
    for path in sorted(abi.glob("*.txt")):
        for line in path.read_text().splitlines():
            name = line.strip()
            if name and not name.startswith("#"):
                wanted.setdefault(name, []).append(path.name)
    return wanted


def exported(nm: str, library: str):
    out = subprocess.run([nm, "-D", "--defined-only", library], check=True, capture_output=True, text=True).stdout
    return {line.split()[2].split("@")[0] for line in out.splitlines() if len(line.split()) == 3 and line.split()[1] in "TW"}


def main() -> int:
    library, abi = sys.argv[1], pathlib.Path(sys.argv[2])
    nm = shutil.which("nm")
    if nm is None:
        print("SKIPPED: no nm (binutils) on this machine")
        return 77
    wanted = listed(abi)
    have = exported(nm, library)
    missing = [f"{name} (in {', '.join(lists)})" for name, lists in sorted(wanted.items()) if name not in have]
    no_alias = [name for name in sorted(wanted) if name in have and "p" + name not in have]
    for name in missing:
        print(f"not exported: {name}")
    for name in no_alias:
        print(f"exported without its p{name} alias")
    print(f"{len(wanted)} functions listed in {len(list(abi.glob('*.txt')))} lists; {len(missing)} missing, "
          f"{len(no_alias)} without their alias")

    shim = ctypes.CDLL(library, mode=ctypes.RTLD_LOCAL)
    suspend = shim.ncclCommSuspend
    suspend.argtypes, suspend.restype = [ctypes.c_void_p, ctypes.c_int], ctypes.c_int
    answered = suspend(None, 1)
    print(f"ncclCommSuspend(NULL, 1) = {answered}")
    grow_id = shim.ncclCommGetUniqueId
    grow_id.argtypes, grow_id.restype = [ctypes.c_void_p, ctypes.c_void_p], ctypes.c_int
    answered_id = grow_id(None, None)
    print(f"ncclCommGetUniqueId(NULL, NULL) = {answered_id}")
    calls_ok = all(code in (NCCL_INVALID_ARGUMENT, NCCL_INVALID_USAGE) for code in (answered, answered_id))
    return 0 if not missing and not no_alias and calls_ok else 1


if __name__ == "__main__":
    sys.exit(main())
