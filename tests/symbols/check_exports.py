#!/usr/bin/env python3
"""libbraid.so exports braid's public API and nothing else, read from the headers of include/braid/:

  - the C functions braid.h declares, and
  - the members of every class or struct that the C++ headers (braid.hpp, rendezvous.hpp, memory.hpp, moe.hpp,
    fused_matmul.hpp, error.hpp, types.hpp) define at namespace
    scope in namespace braid, their type info and vtables, and the functions declared at namespace scope there.

Both ways: every symbol the library exports is public (nothing internal, no cudart), and every public symbol
the library's objects define (libbraid_static.a holds the same objects) is exported. Exit 77 (skipped) without
binutils' nm.

  check_exports.py LIBBRAID_SO LIBBRAID_STATIC_A INCLUDE_BRAID_DIR
"""
import pathlib
import re
import shutil
import subprocess
import sys


def public_api(include: pathlib.Path):
    classes, functions, c_functions = set(), set(), set()
    for header in include.glob("*.hpp"):
        for line in header.read_text().splitlines():
            match = re.match(r"(?:class|struct) (\w+)\b[^;]*\{", line)  # a definition at namespace scope
            if match:
                classes.add(match.group(1))
                continue
            if line[:1].isalpha() and not re.match(r"(?:class|struct|enum|namespace|using|typedef|template)\b", line):
                match = re.search(r"\b(\w+)\(", line)
                if match:
                    functions.add(match.group(1))
    c_functions.update(re.findall(r"\b(braid[A-Z]\w*)\s*\(", (include / "braid.h").read_text()))
    return classes, functions, c_functions


def is_public(name: str, classes, functions, c_functions) -> bool:
    if name in c_functions:
        return True
    for prefix in ("typeinfo name for ", "typeinfo for ", "vtable for "):
        if name.startswith(prefix):
            return name[len(prefix):] in {f"braid::{c}" for c in classes}
    match = re.match(r"braid::(\w+)(::|\()", name)
    if not match:
        return False
    return (match.group(2) == "::" and match.group(1) in classes) or (match.group(2) == "(" and match.group(1) in functions)


def defined(nm: str, arguments) -> set:
    out = subprocess.run([nm, "--defined-only", "-C", *arguments], check=True, capture_output=True, text=True).stdout
    names = set()
    for line in out.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[1] in "TWDBRVu":  # global code and data (lower case: local)
            names.add(parts[2].split("@")[0])
    return names


def main() -> int:
    nm = shutil.which("nm")
    if nm is None:
        print("SKIPPED: no nm (binutils) on this machine")
        return 77
    shared, static, include = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
    classes, functions, c_functions = public_api(include)
    if not classes or not functions or not c_functions:
        print(f"the headers in {include} yielded no API: classes {classes}, functions {functions}, C {c_functions}")
        return 1
    exported = defined(nm, ["-D", str(shared)])
    internal = sorted(name for name in exported if not is_public(name, classes, functions, c_functions))
    public = {name for name in defined(nm, [str(static)]) if is_public(name, classes, functions, c_functions)}
    hidden = sorted(public - exported)
    for name in internal[:40]:
        print(f"exported but not public API: {name}")
    for name in hidden[:40]:
        print(f"public API but not exported: {name}")
    print(f"{len(exported)} symbols exported, {len(internal)} of them internal; {len(public)} public symbols defined, "
          f"{len(hidden)} of them hidden ({len(classes)} classes, {len(functions)} functions, {len(c_functions)} C "
          f"functions in the headers)")
    return 1 if internal or hidden else 0


if __name__ == "__main__":
    sys.exit(main())
