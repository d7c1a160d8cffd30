#!/usr/bin/env python3
"""torch.distributed (backend "nccl") through whichever libnccl.so.2 the process got: the shim (LD_PRELOAD) or
the real NCCL. Run by run_torch_check.sh, once per library, under torchrun (one process per GPU):

    python3 -m torch.distributed.run --standalone --nproc-per-node N torch_shim_check.py --mode shim|nccl --out DIR

Every input is a seeded tensor of small integers (never 0), chosen so that every result is exact in float32 and
bfloat16 in any summation order: a correct library's outputs are then bitwise those of any other. Each output is
checked here against a host reference (computed from the regenerated inputs of all ranks) and saved, moved to
the CPU, into DIR/rank<r>-<mode>.pt; run_torch_check.sh compares the shim's files with the real NCCL's bitwise.
The same sequence is then captured in a CUDA graph (after a warm-up on a side stream, as torch's docs ask) and
replayed with the inputs rewritten between replays.

Then four short trainings of one small MLP (seeded alike on every rank, per-rank seeded batches, SGD): DDP, FSDP2
(fully_shard per block, then the root), FSDP2 with its collectives' buffers from the process group's allocator
(section fsdp2pg) and a DDP step whose forward and loss are torch.compile'd (inductor). Each
saves its per-step loss trace and its final full parameters (rank 0; every rank must hold the same) for the same
comparison, and rank 0 prints its mean step time. A section this torch or machine cannot run prints
"<section> skipped: <reason>" and saves a marker, so run_torch_check.sh reports it as skipped, never as passed.
"""
import argparse
import contextlib
import os
import sys
import time
import warnings
import zlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

SIZES = [1, 7, 1000, 4097, 65537, 262147]  # elements; odd ones on purpose (no size is a multiple of 16 bytes)
MAX_MOVE = 65537  # larger sizes run all_reduce only: every output is saved, and the files should stay small
DTYPES = [torch.float32, torch.bfloat16]
GRAPH_COUNT = 65537
GRAPH_REPLAYS = 6
POISON = float("nan")  # written over every output before each call: an unwritten output never compares equal

# The training sections: LAYERS blocks of Linear(width, width) + GELU, float32, BATCH rows a step, WARMUP untimed
# steps (allocation, lazy init, compilation) before the timed ones (--width, --layers, --batch and --steps change
# them).
# --cpu-gloo uses a narrower model: there it only checks the script, on a small CPU.
WIDTH, WIDTH_CPU = 1024, 256
LAYERS = 4
BATCH = 64
WARMUP = 3
TRAIN_STEPS = 20  # timed steps of the DDP and FSDP2 sections (--steps)
COMPILE_STEPS = 10
LR = 0.05  # plain SGD: a small difference in a gradient stays a small difference in the parameters


def dtype_name(dt):
    return str(dt).replace("torch.", "")


class Check:
    def __init__(self, rank, world, device, lenient=False, width=None, layers=LAYERS, batch=BATCH,
                 steps=TRAIN_STEPS):
        self.rank, self.world, self.device = rank, world, device
        self.results = {}  # case name -> output tensor on the CPU (saved for the bitwise comparison)
        self.passed = 0
        self.wrong = []
        self.lenient = lenient  # --cpu-gloo: a collective gloo lacks is left out instead of failing the run
        self.left_out = set()
        self.width = width or (WIDTH_CPU if device.type == "cpu" else WIDTH)
        self.layers = layers
        self.batch, self.steps = batch, steps  # rows a training step, timed steps a training section

    def run(self, what, fn, *args):
        try:
            fn(*args)
        except (RuntimeError, NotImplementedError, ValueError) as e:
            if not self.lenient:
                raise
            if what not in self.left_out and self.rank == 0:
                print(f"torch_shim_check: {what} left out on this backend: {str(e).splitlines()[0][:160]}",
                      flush=True)
            self.left_out.add(what)

    def sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    # ---- inputs: rank r's tensor for a case, regenerable on every rank from (case, r) ----
    def values(self, case, r, n, kind):
        """int64 tensor of n nonzero small integers. 'sum': |x| <= 256 // world, so every partial sum of all ranks
        is an integer <= 256, exact in bfloat16 (8 significant bits). 'any': |x| <= 100 (max, data movement)."""
        g = torch.Generator().manual_seed(zlib.crc32(f"{case}|{r}".encode()))
        limit = max(1, 256 // self.world) if kind == "sum" else 100
        mag = torch.randint(1, limit + 1, (n,), generator=g)
        sign = torch.randint(0, 2, (n,), generator=g) * 2 - 1
        return mag * sign

    def check(self, case, out, expected, save=True):
        out = out.detach().to("cpu")
        expected = expected.to(out.dtype)
        if save:
            self.results[case] = out
        same = out.shape == expected.shape and torch.equal(bits(out), bits(expected))
        if same:
            self.passed += 1
            return
        differ = "shape %s vs %s" % (tuple(out.shape), tuple(expected.shape))
        if out.shape == expected.shape:
            bad = (bits(out).view(out.numel(), -1) != bits(expected).view(out.numel(), -1)).any(dim=1)
            first = int(bad.nonzero()[0]) if bad.any() else -1
            differ = "%d of %d elements differ, first at %d: got %s expected %s" % (
                int(bad.sum()), out.numel(), first, out.flatten()[first].item(), expected.flatten()[first].item())
        self.wrong.append(case)
        print(f"torch_shim_check: rank {self.rank} case {case} WRONG: {differ}", flush=True)

    def to_dev(self, t, dt):
        return t.to(dt).to(self.device)

    def poisoned(self, n, dt):
        return torch.full((n,), POISON, dtype=dt, device=self.device)

    # ---- the collectives, eagerly ----
    def all_reduce(self, dt, n, op_name):
        case = f"all_reduce.{op_name}.{dtype_name(dt)}.{n}"
        kind = "any" if op_name == "max" else "sum"
        inputs = [self.values(case, r, n, kind) for r in range(self.world)]
        stacked = torch.stack(inputs)
        if op_name == "max":
            expected, op = stacked.max(dim=0).values, dist.ReduceOp.MAX
        elif op_name == "avg":
            expected, op = stacked.sum(dim=0).double() / self.world, dist.ReduceOp.AVG
        else:
            expected, op = stacked.sum(dim=0), dist.ReduceOp.SUM
        t = self.to_dev(inputs[self.rank], dt)  # in place: the tensor is input and output
        dist.all_reduce(t, op=op)
        self.check(case, t, expected)

    def reduce_scatter(self, dt, n):
        case = f"reduce_scatter_tensor.sum.{dtype_name(dt)}.{n}"
        inputs = [self.values(case, r, self.world * n, "sum") for r in range(self.world)]
        expected = torch.stack(inputs).sum(dim=0)[self.rank * n:(self.rank + 1) * n]
        out = self.poisoned(n, dt)
        dist.reduce_scatter_tensor(out, self.to_dev(inputs[self.rank], dt), op=dist.ReduceOp.SUM)
        self.check(case, out, expected)

    def all_gather(self, dt, n):
        case = f"all_gather_into_tensor.{dtype_name(dt)}.{n}"
        inputs = [self.values(case, r, n, "any") for r in range(self.world)]
        out = self.poisoned(self.world * n, dt)
        dist.all_gather_into_tensor(out, self.to_dev(inputs[self.rank], dt))
        self.check(case, out, torch.cat(inputs))

    def broadcast(self, dt, n, src):
        case = f"broadcast.src{src}.{dtype_name(dt)}.{n}"
        inputs = [self.values(case, r, n, "any") for r in range(self.world)]
        t = self.to_dev(inputs[self.rank], dt)  # other ranks' own data must be overwritten
        dist.broadcast(t, src=src)
        self.check(case, t, inputs[src])

    def split(self, a, b, n):
        """Elements rank a sends rank b in the uneven all_to_all: 0..4 units, zero-sized splits included."""
        unit = max(1, n // 8)
        return ((a * 7 + b * 3 + 1) % 5) * unit

    def all_to_all(self, dt, n, even):
        case = f"all_to_all_single.{'even' if even else 'uneven'}.{dtype_name(dt)}.{n}"
        W, r = self.world, self.rank
        if even:
            inputs = [self.values(case, q, W * n, "any") for q in range(W)]
            out = self.poisoned(W * n, dt)
            dist.all_to_all_single(out, self.to_dev(inputs[r], dt))
            expected = torch.cat([inputs[q][r * n:(r + 1) * n] for q in range(W)])
        else:
            sizes = [[self.split(a, b, n) for b in range(W)] for a in range(W)]
            inputs = [self.values(case, q, sum(sizes[q]), "any") for q in range(W)]
            parts = []
            for q in range(W):
                start = sum(sizes[q][:r])
                parts.append(inputs[q][start:start + sizes[q][r]])
            expected = torch.cat(parts)
            out = self.poisoned(expected.numel(), dt)
            dist.all_to_all_single(out, self.to_dev(inputs[r], dt), output_split_sizes=[sizes[q][r] for q in range(W)],
                                   input_split_sizes=sizes[r])
        self.check(case, out, expected)

    def ring(self, dt, n):
        case = f"batch_isend_irecv.ring.{dtype_name(dt)}.{n}"
        W, r = self.world, self.rank
        inputs = [self.values(case, q, n, "any") for q in range(W)]
        send, recv = self.to_dev(inputs[r], dt), self.poisoned(n, dt)
        ops = [dist.P2POp(dist.isend, send, (r + 1) % W), dist.P2POp(dist.irecv, recv, (r - 1) % W)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        self.check(case, recv, inputs[(r - 1) % W])

    def pairs(self, dt, n):
        """Plain blocking dist.send/dist.recv between ranks 2k and 2k+1, both directions; even ranks send first."""
        case = f"send_recv.pair.{dtype_name(dt)}.{n}"
        r = self.rank
        peer = r ^ 1
        if peer >= self.world:
            return  # an odd world leaves the last rank out (the same in both runs)
        inputs = [self.values(case, q, n, "any") for q in range(self.world)]
        send, recv = self.to_dev(inputs[r], dt), self.poisoned(n, dt)
        if r % 2 == 0:
            dist.send(send, peer)
            dist.recv(recv, peer)
        else:
            dist.recv(recv, peer)
            dist.send(send, peer)
        self.check(case, recv, inputs[peer])

    def eager(self):
        W = self.world
        avg = W & (W - 1) == 0  # NCCL averages as a sum of x * (1/W): exact only when W is a power of two
        if self.lenient:
            avg = False  # gloo has no AVG
        elif not avg and self.rank == 0:
            print(f"torch_shim_check: {W} ranks is not a power of two: all_reduce AVG left out", flush=True)
        for dt in DTYPES:
            for n in SIZES:
                for op_name in ["sum", "max"] + (["avg"] if avg else []):
                    self.run(f"all_reduce {op_name}", self.all_reduce, dt, n, op_name)
                if n > MAX_MOVE:
                    continue
                self.run("reduce_scatter_tensor", self.reduce_scatter, dt, n)
                self.run("all_gather_into_tensor", self.all_gather, dt, n)
                for src in sorted({0, W - 1}):
                    self.run("broadcast", self.broadcast, dt, n, src)
                self.run("all_to_all_single", self.all_to_all, dt, n, True)
                self.run("all_to_all_single (uneven)", self.all_to_all, dt, n, False)
                self.run("batch_isend_irecv", self.ring, dt, n)
                self.run("send/recv", self.pairs, dt, n)
        self.sync()

    # ---- the same sequence in a CUDA graph ----
    def graph(self, count=GRAPH_COUNT):
        W, r, n, dt = self.world, self.rank, count, torch.bfloat16
        # Two input sets, alternated between replays: a replay must read the buffers as they are when it runs.
        sets = []
        for s in range(2):
            v = lambda what, q, m, kind="any": self.values(f"graph.{what}.set{s}", q, m, kind)
            ar = [v("all_reduce", q, n, "sum") for q in range(W)]
            ag = [v("all_gather", q, n) for q in range(W)]
            rs = [v("reduce_scatter", q, W * n, "sum") for q in range(W)]
            bc = [v("broadcast", q, n) for q in range(W)]
            a2a = [v("all_to_all", q, W * n) for q in range(W)]
            ring = [v("ring", q, n) for q in range(W)]
            sets.append({
                "in": {"all_reduce": ar[r], "all_gather": ag[r], "reduce_scatter": rs[r], "broadcast": bc[r],
                       "all_to_all": a2a[r], "ring": ring[r]},
                "expected": {
                    "all_reduce": torch.stack(ar).sum(dim=0),
                    "all_gather": torch.cat(ag),
                    "reduce_scatter": torch.stack(rs).sum(dim=0)[r * n:(r + 1) * n],
                    "broadcast": bc[W - 1],
                    "all_to_all": torch.cat([a2a[q][r * n:(r + 1) * n] for q in range(W)]),
                    "ring": ring[(r - 1) % W],
                },
            })
        dev = self.device
        ar_buf = torch.empty(n, dtype=dt, device=dev)  # all_reduce and broadcast work in place
        bc_buf = torch.empty(n, dtype=dt, device=dev)
        ag_in, ag_out = torch.empty(n, dtype=dt, device=dev), torch.empty(W * n, dtype=dt, device=dev)
        rs_in, rs_out = torch.empty(W * n, dtype=dt, device=dev), torch.empty(n, dtype=dt, device=dev)
        a2a_in, a2a_out = torch.empty(W * n, dtype=dt, device=dev), torch.empty(W * n, dtype=dt, device=dev)
        ring_send, ring_recv = torch.empty(n, dtype=dt, device=dev), torch.empty(n, dtype=dt, device=dev)
        outputs = {"all_reduce": ar_buf, "all_gather": ag_out, "reduce_scatter": rs_out, "broadcast": bc_buf,
                   "all_to_all": a2a_out, "ring": ring_recv}

        def load(s):
            inp = sets[s]["in"]
            ar_buf.copy_(inp["all_reduce"].to(dt))
            bc_buf.copy_(inp["broadcast"].to(dt))
            ag_in.copy_(inp["all_gather"].to(dt))
            rs_in.copy_(inp["reduce_scatter"].to(dt))
            a2a_in.copy_(inp["all_to_all"].to(dt))
            ring_send.copy_(inp["ring"].to(dt))
            for t in (ag_out, rs_out, a2a_out, ring_recv):
                t.fill_(POISON)

        def sequence():
            dist.all_reduce(ar_buf, op=dist.ReduceOp.SUM)
            dist.all_gather_into_tensor(ag_out, ag_in)
            dist.reduce_scatter_tensor(rs_out, rs_in, op=dist.ReduceOp.SUM)
            dist.broadcast(bc_buf, src=W - 1)
            dist.all_to_all_single(a2a_out, a2a_in)
            reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, ring_send, (r + 1) % W),
                                           dist.P2POp(dist.irecv, ring_recv, (r - 1) % W)])
            for req in reqs:
                req.wait()

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                load(0)
                sequence()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        eager = {k: t.detach().to("cpu") for k, t in outputs.items()}  # the warm-up's last (eager) run of set 0
        for k in outputs:
            self.check(f"graph.{k}.eager", eager[k], sets[0]["expected"][k])

        g = torch.cuda.CUDAGraph()
        load(0)
        with torch.cuda.graph(g):
            sequence()
        for k_replay in range(GRAPH_REPLAYS):
            s = k_replay % 2
            load(s)
            g.replay()
            torch.cuda.synchronize()
            for k, t in outputs.items():
                # Every replay is checked; the first of each input set is also saved for the bitwise comparison.
                self.check(f"graph.{k}.replay{k_replay}", t, sets[s]["expected"][k], save=k_replay < 2)
                if s == 0 and not torch.equal(bits(t.detach().to("cpu")), bits(eager[k])):
                    self.wrong.append(f"graph.{k}.replay{k_replay}.vs_eager")
                    print(f"torch_shim_check: rank {r} graph {k} replay {k_replay} differs from the eager run",
                          flush=True)
        del g

    # ---- training: DDP, FSDP2, a torch.compile'd DDP step ----
    # Losses and parameters are sums of floats of several ranks: unlike the collectives above they are exact only
    # for one summation order. Two ranks have one order (a + b == b + a); run_torch_check.sh says what it accepts
    # for more.
    def mlp(self, section):
        """The section's model, built from the global RNG seeded alike on every rank: the same weights everywhere
        (DDP broadcasts rank 0's anyway; fully_shard keeps each rank's shard of what it was given)."""
        torch.manual_seed(zlib.crc32(f"{section}|model".encode()))
        blocks = [nn.Sequential(nn.Linear(self.width, self.width), nn.GELU()) for _ in range(self.layers)]
        return nn.Sequential(*blocks).to(self.device)

    def batches(self, section, steps):
        """Inputs and targets of every step for this rank, made up front so that no step waits on a copy. One
        tensor each (not views of one): every step hands torch.compile an input of its own, at offset 0."""
        g = torch.Generator().manual_seed(zlib.crc32(f"{section}|{self.rank}|batches".encode()))
        x = torch.randn(steps, self.batch, self.width, generator=g)
        y = torch.randn(steps, self.batch, self.width, generator=g)
        return [t.to(self.device) for t in x.unbind(0)], [t.to(self.device) for t in y.unbind(0)]

    def train(self, step, timed):
        """Runs WARMUP + timed steps, step(i) returning the step's loss. The trace stays on the device until the end
        (no host sync per step). Returns it on the CPU and the mean time of a timed step in ms: host time around the
        timed steps, started once every rank has finished its warm-up, stopped when the device is idle."""
        total = WARMUP + timed
        trace = torch.empty(total, dtype=torch.float32, device=self.device)
        for i in range(WARMUP):
            trace[i] = step(i)
        self.sync()
        dist.barrier()
        self.sync()
        start = time.perf_counter()
        for i in range(WARMUP, total):
            trace[i] = step(i)
        self.sync()
        ms = (time.perf_counter() - start) * 1e3 / timed
        return trace.detach().to("cpu"), ms

    def finish(self, section, trace, ms, timed, named_params):
        """Saves the loss trace (every rank's own) and the final full parameters (rank 0's; every rank must hold
        them bit for bit, checked through a broadcast from rank 0), then prints the section's line."""
        self.results[f"{section}.loss"] = trace
        mine = torch.cat([p.detach().reshape(-1) for _, p in named_params])
        ref = mine.clone()
        dist.broadcast(ref, src=0)
        if not torch.equal(bits(mine.to("cpu")), bits(ref.to("cpu"))):
            self.wrong.append(f"{section}.params.same_on_every_rank")
            print(f"torch_shim_check: rank {self.rank} {section} WRONG: final parameters differ from rank 0's",
                  flush=True)
        if self.rank == 0:
            for name, p in named_params:
                self.results[f"{section}.param.{name}"] = p.detach().to("cpu")
        if not torch.isfinite(trace).all():
            self.wrong.append(f"{section}.loss.finite")
            print(f"torch_shim_check: rank {self.rank} {section} WRONG: loss not finite: {trace.tolist()}",
                  flush=True)
        if self.rank == 0:
            print(f"torch_shim_check: {section} {timed} steps {ms:.3f} ms/step, final loss {trace[-1].item():.7g}",
                  flush=True)

    def skip(self, section, reason):
        """A section this torch or machine cannot run: said in the log, and a marker (the reason's bytes) saved in
        place of its tensors, so the wrapper reports it as skipped, and fails if only one run skipped it."""
        self.results[f"skipped.{section}"] = torch.tensor(list(reason.encode()[:300]), dtype=torch.uint8)
        if self.rank == 0:
            print(f"torch_shim_check: {section} skipped: {reason}", flush=True)

    def ddp_device_ids(self):
        return [self.device.index] if self.device.type == "cuda" else None

    def ddp(self):
        from torch.nn.parallel import DistributedDataParallel as DDP
        section = "ddp"
        net = self.mlp(section)
        model = DDP(net, device_ids=self.ddp_device_ids())
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        xs, ys = self.batches(section, WARMUP + self.steps)

        def step(i):
            loss = F.mse_loss(model(xs[i]), ys[i])
            loss.backward()  # the gradients' all_reduce, bucket by bucket, overlapped with the backward
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.detach()

        trace, ms = self.train(step, self.steps)
        self.finish(section, trace, ms, self.steps, list(net.named_parameters()))

    def fsdp2(self, comm_memory_from_process_group=False):
        """FSDP2; with comm_memory_from_process_group, its all-gathers' and reduce-scatters' buffers come from the
        process group's allocator (ncclMemAlloc, registered with the communicator), as FSDP2 offers for zero
        copy: section fsdp2pg."""
        section = "fsdp2pg" if comm_memory_from_process_group else "fsdp2"
        fully_shard = import_fully_shard()
        if fully_shard is None:
            return self.skip(section, "no fully_shard in this torch (neither torch.distributed.fsdp nor "
                                      "torch.distributed._composable.fsdp has it)")
        try:
            from torch.distributed.device_mesh import init_device_mesh
            mesh = init_device_mesh(self.device.type, (self.world,))
            model = self.mlp(section)
            for block in model:
                fully_shard(block, mesh=mesh)  # per block and step: all-gathers (forward, backward), a reduce-scatter
            fully_shard(model, mesh=mesh)
            if comm_memory_from_process_group:
                if self.lenient or not hasattr(model, "set_allocate_memory_from_process_group_for_comm"):
                    return self.skip(section, "FSDP2 here cannot take its collectives' buffers from the process "
                                              "group (set_allocate_memory_from_process_group_for_comm; not on gloo)")
                for m in list(model) + [model]:
                    m.set_allocate_memory_from_process_group_for_comm(True)
            if self.lenient:
                # FSDP2 reduce-scatters float32 gradients with AVG, which gloo lacks: sum, then divide.
                for m in model.modules():
                    if hasattr(m, "set_force_sum_reduction_for_comms"):
                        m.set_force_sum_reduction_for_comms(True)
            opt = torch.optim.SGD(model.parameters(), lr=LR)  # after fully_shard: over the sharded parameters
            xs, ys = self.batches(section, WARMUP + self.steps)

            def step(i):
                loss = F.mse_loss(model(xs[i]), ys[i])
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                return loss.detach()

            trace, ms = self.train(step, self.steps)
            with torch.no_grad():  # full_tensor() all-gathers a DTensor parameter: every rank, in the same order
                full = [(name, p.full_tensor() if hasattr(p, "full_tensor") else p)
                        for name, p in model.named_parameters()]
        except Exception as e:
            if not self.lenient:
                raise
            # Every rank takes the same path on gloo, so all of them get here (or none).
            return self.skip(section, f"FSDP2 on CPU through gloo: {type(e).__name__}: {message_start(e)}")
        self.finish(section, trace, ms, self.steps, full)

    def compile_probe(self):
        """Compiles a tiny function and runs it forward and backward. A toolchain missing on this machine (triton,
        a C compiler, Python's headers, a Python dynamo does not support) fails here, before any collective; every
        rank learns whether any rank failed, so all of them skip together. Returns the reason, or ''."""
        reason = ""
        try:
            fn = torch.compile(lambda t: F.gelu(t) * 2 + 1, mode=None)
            t = torch.linspace(-2, 2, 64, device=self.device, requires_grad=True)
            fn(t).sum().backward()
            self.sync()
        except Exception as e:
            reason = f"{type(e).__name__}: {message_start(e)}"
            if self.rank != 0:
                print(f"torch_shim_check: rank {self.rank} torch.compile probe failed: {reason}", flush=True)
        failed = torch.tensor([1.0 if reason else 0.0], device=self.device)
        dist.all_reduce(failed, op=dist.ReduceOp.MAX)
        if failed.item() and not reason:
            reason = "torch.compile failed on another rank (its line above)"
        return reason

    def compiled(self):
        from torch.nn.parallel import DistributedDataParallel as DDP
        section = "compile"
        reason = self.compile_probe()
        if reason:
            return self.skip(section, reason)
        net = self.mlp(section)
        # The documented way: compile the DDP module (dynamo's DDP optimizer splits the graph at bucket bounds, so
        # the all_reduces still overlap the compiled backward); the loss is inside, so it is compiled too.
        model = torch.compile(DDP(WithLoss(net), device_ids=self.ddp_device_ids()), mode=None)
        opt = torch.optim.SGD(net.parameters(), lr=LR)
        xs, ys = self.batches(section, WARMUP + COMPILE_STEPS)

        def step(i):
            loss = model(xs[i], ys[i])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.detach()

        try:
            with deterministic_kernels():  # compilation happens in the first (warm-up) step
                trace, ms = self.train(step, COMPILE_STEPS)
        except Exception as e:
            if not self.lenient:
                raise  # on GPUs the probe vouched for the toolchain: a failure here is a failure
            # Every rank compiles the same graphs on gloo, so all of them get here (or none).
            return self.skip(section, f"compiled DDP on CPU through gloo: {type(e).__name__}: {message_start(e)}")
        self.finish(section, trace, ms, COMPILE_STEPS, list(net.named_parameters()))


class WithLoss(nn.Module):
    """The model and its loss as one module, so that torch.compile of the DDP wrapper compiles both."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x, y):
        return F.mse_loss(self.net(x), y)


def import_fully_shard():
    """FSDP2's fully_shard: public in torch.distributed.fsdp from torch 2.6, in torch.distributed._composable.fsdp
    before. None where this torch has neither."""
    try:
        from torch.distributed.fsdp import fully_shard
        return fully_shard
    except ImportError:
        pass
    try:
        from torch.distributed._composable.fsdp import fully_shard
        return fully_shard
    except ImportError:
        return None


@contextlib.contextmanager
def deterministic_kernels():
    """Inductor times several launch configurations of some reduction kernels and keeps the fastest; configurations
    can sum in different orders, so two runs could keep different ones and differ in the last bits. With
    deterministic algorithms on, it generates one configuration. warn_only, with cuBLAS's warning about its workspace
    silenced: the matmuls run on one stream, where cuBLAS is deterministic anyway. Deterministic mode would also fill
    every new tensor's memory; that stays off, so the timed steps do no work a normal run would not."""
    was_on = torch.are_deterministic_algorithms_enabled()
    was_warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        import torch.utils.deterministic as tud
        was_fill = tud.fill_uninitialized_memory
    except (ImportError, AttributeError):
        tud = None
    torch.use_deterministic_algorithms(True, warn_only=True)
    if tud is not None:
        tud.fill_uninitialized_memory = False
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="(?s).*CUBLAS_WORKSPACE_CONFIG")
            yield
    finally:
        torch.use_deterministic_algorithms(was_on, warn_only=was_warn_only)
        if tud is not None:
            tud.fill_uninitialized_memory = was_fill


def message_start(e):
    """The start of an exception's message, on one line: dynamo's errors say what failed on their second line
    ("backend='inductor' raised:", then the cause)."""
    text = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
    return text[:240] if text else "(no message)"


def bits(t):
    """The tensor's bytes, for bitwise comparison (NaN-safe, -0.0 distinct from 0.0)."""
    return t.contiguous().flatten().view(torch.uint8)


def mapped_nccl_libraries():
    paths = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split()
            if len(parts) >= 6 and "libnccl" in parts[-1]:
                paths.add(os.path.realpath(parts[-1]))
    return sorted(paths)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=["shim", "nccl"], required=True, help="names the output files")
    parser.add_argument("--out", required=True, help="folder for rank<r>-<mode>.pt")
    parser.add_argument("--no-graph", action="store_true", help="leave the CUDA graph section out")
    parser.add_argument("--graph-count", type=int, default=GRAPH_COUNT,
                        help="elements of the CUDA graph section's calls (beyond the LL sizes, the captured calls "
                             "register their buffers automatically)")
    parser.add_argument("--no-ddp", action="store_true", help="leave the DDP training section out")
    parser.add_argument("--no-fsdp", action="store_true", help="leave the FSDP2 training section out")
    parser.add_argument("--no-compile", action="store_true", help="leave the torch.compile'd DDP section out")
    parser.add_argument("--width", type=int, default=None,
                        help=f"the training model's width (default {WIDTH}, {WIDTH_CPU} with --cpu-gloo): a layer's "
                             "float32 weight is width^2 * 4 bytes, what FSDP2 all-gathers and reduce-scatters per "
                             "layer (4096: 64 MiB)")
    parser.add_argument("--layers", type=int, default=LAYERS, help="the training model's blocks")
    parser.add_argument("--batch", type=int, default=BATCH, help="rows of a DDP and FSDP2 training step")
    parser.add_argument("--steps", type=int, default=TRAIN_STEPS,
                        help="timed steps of the DDP and FSDP2 sections (their mean is printed)")
    parser.add_argument("--cpu-gloo", action="store_true",
                        help="check this script itself without GPUs: gloo on CPU tensors, no graphs, no AVG; "
                             "collectives gloo lacks are left out, FSDP2 is skipped if it fails on gloo, and the "
                             "training model is narrower. Tests nothing of NCCL")
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    if args.cpu_gloo:
        device = torch.device("cpu")
        dist.init_process_group(backend="gloo")
    else:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl", device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()

    libs = mapped_nccl_libraries()
    if rank == 0:
        version = "-" if args.cpu_gloo else torch.cuda.nccl.version()
        print(f"torch_shim_check: mode {args.mode}, {world} ranks, torch {torch.__version__}, "
              f"torch.cuda.nccl.version() {version}", flush=True)
        print(f"torch_shim_check: mapped NCCL libraries: {libs}", flush=True)
    preload = [os.path.realpath(p) for p in os.environ.get("LD_PRELOAD", "").replace(":", " ").split() if p]
    shim_mapped = any(p in libs for p in preload)
    if args.mode == "shim" and not shim_mapped:
        print(f"torch_shim_check: rank {rank}: mode shim but LD_PRELOAD={preload} is not among the mapped "
              f"libraries {libs}: this run would test the real NCCL", flush=True)
        sys.exit(3)

    if (args.width is not None and args.width < 1) or min(args.layers, args.batch, args.steps) < 1:
        parser.error("--width, --layers, --batch and --steps must be at least 1")
    check = Check(rank, world, device, lenient=args.cpu_gloo, width=args.width, layers=args.layers,
                  batch=args.batch, steps=args.steps)
    if rank == 0:
        print(f"torch_shim_check: training model: width {check.width}, layers {check.layers}, batch {check.batch}, "
              f"timed steps {check.steps}", flush=True)
    check.eager()
    if not args.no_graph and not args.cpu_gloo:
        check.graph(args.graph_count)
    if not args.no_ddp:
        check.ddp()
    if not args.no_fsdp:
        check.fsdp2()
        check.fsdp2(comm_memory_from_process_group=True)
    if not args.no_compile:
        check.compiled()
    os.makedirs(args.out, exist_ok=True)
    torch.save(check.results, os.path.join(args.out, f"rank{rank}-{args.mode}.pt"))
    print(f"torch_shim_check: rank {rank} mode {args.mode}: {check.passed} outputs right, "
          f"{len(check.wrong)} wrong", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(1 if check.wrong else 0)


if __name__ == "__main__":
    main()
