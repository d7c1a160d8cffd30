#!/usr/bin/env python3
"""Checks braid's protocol models (verify/models/*.pml) with spin, and their seeded mutants.

Each model declares its runs in its header comment, one a line:

    @run <name> <mode> <expect> [-DNAME[=VALUE] ...]

  name    a label; a name that starts with MUTANT_ also defines itself (spin -D<name>)
  mode    safety       assertions and invalid end states (pan compiled with -DSAFETY)
          ltl:<claim>  the model's LTL formula <claim>, under weak fairness (pan -a -f -N <claim>)
          np           non-progress cycles, under weak fairness (pan compiled with -DNP, run -l -f)
  expect  pass         0 errors, and the search was not cut short by its depth bound
          assert       a counterexample: an assertion violated
          deadlock     a counterexample: an invalid end state
          cycle        a counterexample: an acceptance or non-progress cycle

A run of the real model passes when pan reports 0 errors with the whole state space searched; a mutant passes
when pan finds a counterexample of the kind it declares (so a mutant caught for another reason than the one it
mirrors fails too). Each run happens in a temporary directory of its own. One line per run, then a closing line
"N passed, M failed"; the exit status is 0 only when every run passed.

    run_models.py                  every model
    run_models.py --model NAME     verify/models/NAME.pml only (the ctest entries, label `model`)
    run_models.py --list           the runs, without running them
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

MODELS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models")
RUN_LINE = re.compile(r"^\s*\*?\s*@run\s+(\S+)\s+(\S+)\s+(\S+)((?:\s+-D\S+)*)\s*$")
MUTANT_USE = re.compile(r"\b(MUTANT_[A-Z0-9_]+)\b")
MAX_DEPTH = 1000000         # pan -m: deep enough for every model; a cut-short search fails the run
MEMORY_LIMIT_MB = 3072      # pan -DMEMLIM: a model that needs more fails instead of swapping
RUN_TIMEOUT_S = 240         # one run (spin, gcc, pan) at most


class Run:
    def __init__(self, model, name, mode, expect, defines):
        self.model, self.name, self.mode, self.expect = model, name, mode, expect
        self.defines = list(defines)
        if name.startswith("MUTANT_"):
            self.defines.insert(0, "-D" + name)

    def label(self):
        return f"{self.model}/{self.name}"


def parse_runs(path):
    """The @run lines of a model, checked against the mutants the model's code names."""
    model = os.path.splitext(os.path.basename(path))[0]
    with open(path) as f:
        text = f.read()
    runs, problems = [], []
    for line in text.splitlines():
        if "@run" not in line:
            continue
        match = RUN_LINE.match(line)
        if not match:
            problems.append(f"{model}: malformed run line: {line.strip()}")
            continue
        name, mode, expect, defines = match.group(1), match.group(2), match.group(3), match.group(4).split()
        if mode not in ("safety", "np") and not mode.startswith("ltl:"):
            problems.append(f"{model}: run {name}: unknown mode {mode}")
        if expect not in ("pass", "assert", "deadlock", "cycle"):
            problems.append(f"{model}: run {name}: unknown expectation {expect}")
        runs.append(Run(model, name, mode, expect, defines))
    declared = {run.name for run in runs if run.name.startswith("MUTANT_")}
    code = "\n".join(line for line in text.splitlines() if "@run" not in line)
    used = set(MUTANT_USE.findall(code))
    for name in sorted(declared - used):
        problems.append(f"{model}: {name} has a run but no #ifdef in the model")
    for name in sorted(used - declared):
        problems.append(f"{model}: {name} is in the model but has no run")
    if not any(run.expect == "pass" for run in runs):
        problems.append(f"{model}: no run of the real model")
    if len(declared) < 3:
        problems.append(f"{model}: {len(declared)} mutants; every model needs at least 3")
    return runs, problems


def pan_verdict(output):
    """(errors, what pan found, whether the search was cut short) from pan's report."""
    errors = re.search(r"errors:\s*(\d+)", output)
    found = "none"
    if "assertion violated" in output:
        found = "assert"
    elif "invalid end state" in output:
        found = "deadlock"
    elif "acceptance cycle" in output or "non-progress cycle" in output:
        found = "cycle"
    # A search cut short: by its depth bound, or by the memory bound (pan stops and still prints its error count).
    truncated = any(sign in output for sign in ("max search depth too small", "reached -DMEMLIM bound",
                                                "out of memory", "Search not completed"))
    return (int(errors.group(1)) if errors else None), found, truncated


def summary_of(output):
    states = re.search(r"(\d+) states, stored", output)
    depth = re.search(r"depth reached (\d+)", output)
    parts = []
    if states:
        parts.append(f"{int(states.group(1)):,} states")
    if depth:
        parts.append(f"depth {depth.group(1)}")
    return ", ".join(parts)


def execute(run, path, spin, compiler):
    """Runs one model configuration; returns (passed, detail)."""
    work = tempfile.mkdtemp(prefix=f"braid-model-{run.model}-")
    try:
        model_copy = os.path.join(work, os.path.basename(path))
        shutil.copyfile(path, model_copy)

        def step(command, timeout):
            done = subprocess.run(command, cwd=work, capture_output=True, text=True, timeout=timeout)
            return done.returncode, done.stdout + done.stderr

        rc, out = step([spin, "-a"] + run.defines + [os.path.basename(path)], 120)
        if rc != 0 or not os.path.exists(os.path.join(work, "pan.c")):
            return False, "spin -a failed:\n" + out
        # A mutant's search stops at its first counterexample: a quick compile pays; a real model searches all.
        flags = ["-O2" if run.expect == "pass" else "-O0", "-w", f"-DMEMLIM={MEMORY_LIMIT_MB}", "-DVECTORSZ=4096",
                 "-DCOLLAPSE"]  # COLLAPSE: compressed states, a few times less memory for a little more time
        pan_args = [f"-m{MAX_DEPTH}"]
        if run.mode == "safety":
            flags += ["-DSAFETY", "-DNOCLAIM"]  # NOCLAIM: the model's LTL claims would switch off the end-state check
        elif run.mode == "np":
            flags += ["-DNP", "-DNOCLAIM"]
            pan_args += ["-l", "-f"]
        else:
            pan_args += ["-a", "-f", "-N", run.mode.split(":", 1)[1]]
        rc, out = step([compiler] + flags + ["-o", "pan", "pan.c"], 180)
        if rc != 0:
            return False, "compiling pan.c failed:\n" + out
        rc, out = step(["./pan"] + pan_args, RUN_TIMEOUT_S)
        errors, found, truncated = pan_verdict(out)
        summary = summary_of(out)
        if errors is None:
            return False, "pan printed no error count:\n" + out[-3000:]
        if run.mode == "safety" and not re.search(r"invalid end states\s+\+", out):
            return False, "pan did not check invalid end states:\n" + out[-3000:]
        if run.expect == "pass":
            if errors != 0:
                return False, f"{errors} error(s), {found}:\n" + out[-3000:]
            if truncated:
                return False, "the search was cut short (depth or memory bound):\n" + out[-3000:]
            return True, summary
        if errors == 0:
            return False, f"mutant not caught ({summary})"
        if found != run.expect:
            return False, f"caught as {found}, declared {run.expect}:\n" + out[-3000:]
        return True, f"caught: {found}"
    except subprocess.TimeoutExpired as timeout:
        return False, f"timed out: {' '.join(timeout.cmd)}"
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", help="a model's name (its file without .pml); repeatable")
    parser.add_argument("--list", action="store_true", help="print the runs without running them")
    args = parser.parse_args()

    names = args.model or sorted(f[:-4] for f in os.listdir(MODELS_DIR) if f.endswith(".pml"))
    runs, problems = [], []
    for name in names:
        path = os.path.join(MODELS_DIR, name + ".pml")
        if not os.path.exists(path):
            problems.append(f"{name}: no model at {path}")
            continue
        model_runs, model_problems = parse_runs(path)
        runs += [(run, path) for run in model_runs]
        problems += model_problems
    if args.list:
        for run, _ in runs:
            print(f"{run.label():48} {run.mode:18} {run.expect:9} {' '.join(run.defines)}")
        for problem in problems:
            print("problem:", problem)
        return 1 if problems else 0

    spin = shutil.which("spin")
    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if spin is None:
        print("FAIL: spin is not installed: the protocol models cannot be checked. Install it (Debian: apt-get install "
              "spin; scripts/build.sh installs it) and run again.", file=sys.stderr)
        return 1
    if compiler is None:
        print("FAIL: no C compiler (gcc or cc, or $CC) to build spin's verifier.", file=sys.stderr)
        return 1

    passed = failed = 0
    for problem in problems:
        print(f"FAIL  {problem}")
        failed += 1
    started = time.monotonic()
    for run, path in runs:
        begin = time.monotonic()
        ok, detail = execute(run, path, spin, compiler)
        seconds = time.monotonic() - begin
        verdict = "ok  " if ok else "FAIL"
        what = "model " if run.expect == "pass" else "mutant" if run.name.startswith("MUTANT_") else "limit "
        first, _, rest = detail.partition("\n")
        print(f"{verdict}  {what} {run.label():48} {seconds:6.1f} s  {first}", flush=True)
        if rest:
            lines = rest.splitlines()
            lines = lines[:24] + (["..."] if len(lines) > 24 else [])
            print("\n".join("      " + line for line in lines), flush=True)
        passed, failed = (passed + 1, failed) if ok else (passed, failed + 1)
    print(f"{passed} passed, {failed} failed ({time.monotonic() - started:.1f} s)")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
