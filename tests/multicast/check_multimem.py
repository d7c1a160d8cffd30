#!/usr/bin/env python3
"""The multicast kernels carry NVLink multicast instructions, and no other kernel does (multicast stays gated).

Disassembles the built library with cuobjdump and reads:
  - the SASS (cuobjdump -sass): every instantiation of the multicast reductions (all_reduce_multicast,
    reduce_multicast) holds an LDGMC (multimem.ld_reduce), and no other function holds one;
  - the PTX the library embeds (cuobjdump -ptx): the multicast kernels hold multimem.ld_reduce / multimem.st as
    each needs, and no other entry holds a multimem instruction. A multimem.st has no SASS mnemonic of its
    own on sm_90 (it is an STG to a multicast address), so all-gather's stores are read in the PTX.

Usage: check_multimem.py LIBRARY [CUOBJDUMP]. cuobjdump: the argument, $CUOBJDUMP, PATH, /usr/local/cuda/bin, or
installed from PyPI (nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm) into the library's folder; where none can
be had the check exits 77 (ctest reports it skipped, never passed).
"""
import os
import re
import shutil
import subprocess
import sys

SKIP = 77
PYPI = ["nvidia-cuda-cuobjdump==13.2.51", "nvidia-cuda-nvdisasm==13.2.51"]

# kernel (as its mangled name spells it) -> (instantiations, PTX instructions it must hold)
EXPECTED = {
    "all_reduce_multicast": (7, ["multimem.ld_reduce", "multimem.st"]),
    "reduce_multicast": (7, ["multimem.ld_reduce"]),
    "all_gather_multicast": (1, ["multimem.st"]),
}
REDUCTIONS = ("all_reduce_multicast", "reduce_multicast")  # the ones whose SASS shows LDGMC


def find_cuobjdump(given, library):
    for candidate in (given, os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump"), "/usr/local/cuda/bin/cuobjdump"):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    target = os.path.join(os.path.dirname(os.path.abspath(library)), "cuobjdump-pypi")
    tool = os.path.join(target, "nvidia", "cu13", "bin", "cuobjdump")
    if not os.path.isfile(tool):
        print(f"check_multimem: no cuobjdump here; installing {' '.join(PYPI)} into {target}", flush=True)
        result = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                                 "--target", target] + PYPI, capture_output=True, text=True)
        if result.returncode != 0 or not os.path.isfile(tool):
            print(f"check_multimem: SKIPPED, cuobjdump unavailable (pip: {result.stderr.strip()[-400:]})")
            sys.exit(SKIP)
    return tool


def functions(text, header):
    """name -> body, for each function the dump starts with a line matching `header`."""
    found, name, body = {}, None, []
    for line in text.splitlines():
        match = header.search(line)
        if match:
            if name:
                found[name] = "\n".join(body)
            name, body = match.group(1), []
        elif name:
            body.append(line)
    if name:
        found[name] = "\n".join(body)
    return found


def kernel_of(name):
    for kernel in EXPECTED:  # all_reduce_multicast before reduce_multicast: the longer name first
        if re.search(r"\d" + kernel + r"(E|I)", name):
            return kernel
    return None


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    library = sys.argv[1]
    cuobjdump = find_cuobjdump(sys.argv[2] if len(sys.argv) > 2 else None, library)
    env = dict(os.environ, PATH=os.path.dirname(cuobjdump) + os.pathsep + os.environ.get("PATH", ""))
    sass = subprocess.run([cuobjdump, "-sass", library], capture_output=True, text=True, env=env, check=True).stdout
    ptx = subprocess.run([cuobjdump, "-ptx", library], capture_output=True, text=True, env=env, check=True).stdout
    sass_functions = functions(sass, re.compile(r"Function : (\S+)"))
    ptx_entries = functions(ptx, re.compile(r"^\.(?:visible |weak )?\.?entry (\S+?)\("))
    problems = []
    for what, found in (("SASS functions", sass_functions), ("PTX entries", ptx_entries)):
        for kernel, (instantiations, _) in EXPECTED.items():
            count = sum(1 for name in found if kernel_of(name) == kernel)
            if count != instantiations:
                problems.append(f"{what}: {count} instantiation(s) of {kernel}, expected {instantiations}")
    for name, body in sass_functions.items():
        kernel, has = kernel_of(name), "LDGMC" in body
        if kernel in REDUCTIONS and not has:
            problems.append(f"SASS of {name} has no LDGMC (multimem.ld_reduce)")
        if kernel not in REDUCTIONS and has:
            problems.append(f"SASS of {name}, not a multicast reduction, has an LDGMC")
    for name, body in ptx_entries.items():
        kernel = kernel_of(name)
        if kernel is None:
            if "multimem." in body:
                problems.append(f"PTX of {name}, not a multicast kernel, has a multimem instruction")
            continue
        for instruction in EXPECTED[kernel][1]:
            if instruction not in body:
                problems.append(f"PTX of {name} has no {instruction}")
    ldgmc = sum(body.count("LDGMC") for body in sass_functions.values())
    print(f"check_multimem: {library}: {len(sass_functions)} SASS functions, {len(ptx_entries)} PTX entries, "
          f"{ldgmc} LDGMC instruction(s)")
    for problem in problems:
        print("FAIL:", problem)
    if not problems:
        print(f"check_multimem: OK: an LDGMC in each of the {sum(EXPECTED[k][0] for k in REDUCTIONS)} multicast "
              f"reductions and in no other function; multimem in the PTX of the multicast kernels only")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
