#!/usr/bin/env python3
"""A rank SIGKILLed in the middle of DDP training (torch.distributed, backend "nccl", through whichever
libnccl.so.2 the processes get: the shim under LD_PRELOAD, or the real NCCL): every survivor must end with an
error, never hang.

    python3 torch_kill_check.py --ranks N [--timeout S] [--kill-step K] [--dump-wait-ms MS] [--torchrun]

The script launches the ranks itself, one process per GPU, with the environment torchrun would give them (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), and no agent that stops the others when one dies: each survivor
has only its process group to notice the death (ProcessGroupNCCL's watchdog, which polls ncclCommGetAsyncError,
and the collective's own wait). The last rank SIGKILLs itself at step K of an all-reduce heavy DDP loop. The
launcher prints, for each survivor, when the error reached its training loop and when its process ended, both
counted from the kill, and exits 0 when every survivor's loop got the error within the process group's timeout and
its process ended within that timeout plus torch's dump wait, 1 otherwise (a survivor still running at the
launcher's deadline is killed and counted as a hang). Each rank's output goes to rank<r>.log in --logs.

After a failure torch's watchdog waits 4 x TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC (15 000 by default: 60 s) for the
ranks' debug dumps before it ends the process; --dump-wait-ms sets that variable in every rank, so the bound on the
exit becomes the timeout plus four times it (plus 5 s).

--torchrun runs the same training under torchrun (--standalone, one worker per GPU) instead, as a job is run: its
agent sees the killed worker and stops the others. The launcher then checks that the whole job (torchrun itself)
ended with a nonzero exit code within the process group's timeout of the kill; torchrun's output goes to
torchrun.log in --logs.
"""
import argparse
import datetime
import os
import signal
import socket
import subprocess
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args):
    port = free_port()
    os.makedirs(args.logs, exist_ok=True)
    kill_file = f"/tmp/torch-kill-check-{os.getpid()}"
    if os.path.exists(kill_file):
        os.unlink(kill_file)
    procs = []
    for rank in range(args.ranks):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(args.ranks), LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCH_KILL_CHECK_FILE=kill_file)
        if args.dump_wait_ms is not None:
            env["TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC"] = str(args.dump_wait_ms)
        log = open(os.path.join(args.logs, f"rank{rank}.log"), "w")
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank-main",
                                       "--timeout", str(args.timeout), "--kill-step", str(args.kill_step)], env=env,
                                      stdout=log, stderr=subprocess.STDOUT))
    deadline = time.time() + args.timeout + 120 + 60  # init, the steps before the kill, the timeout, a grace period
    ended = {}
    while len(ended) < len(procs) and time.time() < deadline:
        for rank, proc in enumerate(procs):
            if rank not in ended and proc.poll() is not None:
                ended[rank] = (proc.returncode, time.time())
        time.sleep(0.01)
    killed_at = float(open(kill_file).read()) if os.path.exists(kill_file) else None
    ok = killed_at is not None
    if killed_at is None:
        print("torch_kill_check: the last rank never reached its kill step")
    for rank, proc in enumerate(procs):
        if rank not in ended:
            proc.kill()
            proc.wait()
            print(f"torch_kill_check: rank {rank} HUNG: still running {args.timeout + 180} s after launch; killed")
            ok = False
            continue
        code, at = ended[rank]
        if rank == args.ranks - 1:
            print(f"torch_kill_check: rank {rank} (the killed one) exit code {code}")
            ok = ok and code == -signal.SIGKILL
            continue
        after = at - killed_at if killed_at is not None else float("nan")
        raised = None
        for line in open(os.path.join(args.logs, f"rank{rank}.log"), errors="replace"):
            if line.startswith(f"rank {rank}: raised "):
                raised = float(line.split()[3])
        dump_wait = 60.0 if args.dump_wait_ms is None else 4 * args.dump_wait_ms / 1000.0 + 5.0
        within = code != 0 and raised is not None and raised <= args.timeout and after <= args.timeout + dump_wait
        raised_text = f"{raised:.2f} s" if raised is not None else "never"
        print(f"torch_kill_check: rank {rank} survivor: error in its training loop {raised_text} after the kill, "
              f"process ended (exit code {code}) {after:.2f} s after it: {'ok' if within else 'WRONG'}")
        ok = ok and within
    if os.path.exists(kill_file):
        os.unlink(kill_file)
    print(f"torch_kill_check: {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


def launch_torchrun(args):
    os.makedirs(args.logs, exist_ok=True)
    kill_file = f"/tmp/torch-kill-check-{os.getpid()}"
    if os.path.exists(kill_file):
        os.unlink(kill_file)
    env = dict(os.environ, TORCH_KILL_CHECK_FILE=kill_file)
    if args.dump_wait_ms is not None:
        env["TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC"] = str(args.dump_wait_ms)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.ranks}",
               os.path.abspath(__file__), "--rank-main", "--timeout", str(args.timeout),
               "--kill-step", str(args.kill_step)]
    with open(os.path.join(args.logs, "torchrun.log"), "w") as log:
        job = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            code = job.wait(timeout=args.timeout + 180)
        except subprocess.TimeoutExpired:
            job.kill()
            job.wait()
            print(f"torch_kill_check: the torchrun job HUNG: still running {args.timeout + 180} s after launch; killed")
            return 1
    ended = time.time()
    if not os.path.exists(kill_file):
        print(f"torch_kill_check: the last rank never reached its kill step (torchrun exit code {code})")
        return 1
    after = ended - float(open(kill_file).read())
    os.unlink(kill_file)
    ok = code != 0 and after <= args.timeout
    print(f"torch_kill_check: under torchrun the job ended (exit code {code}) {after:.2f} s after the kill: "
          f"{'ok' if ok else 'WRONG'}")
    print(f"torch_kill_check: {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


def rank_main(args):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=args.timeout), device_id=device)
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(2048, 2048), nn.GELU()) for _ in range(4)]).to(device)
    ddp = DDP(model, device_ids=[device.index])
    optimizer = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    torch.manual_seed(1 + rank)
    batch = torch.randn(64, 2048, device=device)
    started = time.time()
    step = 0
    try:
        while True:
            if rank == world - 1 and step == args.kill_step:
                torch.cuda.synchronize()
                with open(os.environ["TORCH_KILL_CHECK_FILE"], "w") as f:
                    f.write(repr(time.time()))
                os.kill(os.getpid(), signal.SIGKILL)
            optimizer.zero_grad()
            ddp(batch).square().mean().backward()
            optimizer.step()
            if step % 10 == 0:
                torch.cuda.synchronize()
            step += 1
            if time.time() - started > args.timeout + 240:
                print(f"rank {rank}: still training at step {step}", flush=True)
                return 4
    except Exception as error:  # the process group's error reached this thread
        now = time.time()
        with open(os.environ["TORCH_KILL_CHECK_FILE"]) as f:
            after = now - float(f.read())
        print(f"rank {rank}: raised {after:.3f} s after the kill, at step {step}: {type(error).__name__}: "
              f"{str(error)[:300]}", flush=True)
        return 3


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=60, help="the process group's timeout, seconds")
    parser.add_argument("--kill-step", type=int, default=30)
    parser.add_argument("--logs", default=".", help="folder of the ranks' logs")
    parser.add_argument("--dump-wait-ms", type=int, help="TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC of every rank")
    parser.add_argument("--torchrun", action="store_true", help="run the ranks under torchrun, as a job")
    parser.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_main:
        sys.exit(rank_main(args))
    sys.exit(launch_torchrun(args) if args.torchrun else launch(args))


if __name__ == "__main__":
    main()
