"""Every Python file of the tree compiles: scripts that only run on a GPU machine (bench/tp_overlap.py, the torch
checks) are otherwise first parsed there. Usage: check_compile.py SOURCE_ROOT."""
import sys
from pathlib import Path

FOLDERS = ["bench", "examples", "nccl_shim", "python/braid", "python/tests", "tests", "verify"]


def main() -> int:
    root = Path(sys.argv[1])
    failures, count = [], 0
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            count += 1
            try:
                compile(path.read_text(), str(path), "exec")
            except SyntaxError as error:
                failures.append(f"{path.relative_to(root)}:{error.lineno}: {error.msg}")
    for failure in failures:
        print(failure)
    print(f"{count} Python files, {len(failures)} that do not compile")
    return 1 if failures or count == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
