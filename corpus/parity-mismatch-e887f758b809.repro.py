#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=f0abe9d427fc1f83 sources=845e968d7c09e2fe seconds=9516.4
# Reproduces shardfuzz corpus entry parity-mismatch-e887f758b809.json: mismatch:parity@fsdp2:frozen-int-reshard
# Known torch bug: a frozen fully_shard unit with an int reshard_after_forward under a replicate'd
# root stays in its post-forward state; upstream: none found.
# Observed: FSDP2: a frozen fully_shard unit with an int reshard_after_forward under a replicate'd
# root stays in its post-forward state after backward (its output needs no gradient, so no ...
# Run: torchrun --nproc-per-node 4 THIS_FILE.py: while the failure is there a rank prints
# REPRODUCED and exits 1; once it is gone rank 0 prints PASS and every rank exits 0 (expected: the
# property's judge finds nothing); a rank exits 2 where the script cannot run (not under torchrun,
# another world size) or the case fails another way (it prints FAIL). torchrun's own status is 1
# whenever a rank's is not 0.

from __future__ import annotations
import torch
from dataclasses import dataclass, field
from torch import nn
from contextlib import contextmanager
import torch.distributed as dist
import torch.nn.functional as F
import math

@dataclass
class RankContext:
    rank: object
    world_size: object
    device: object
    backend: object

class PointwiseConv1d(nn.Conv1d):

    def forward(self, x):
        return super().forward(x.unsqueeze(-1)).squeeze(-1)

def build_model():
    module = PointwiseConv1d(2, 2, kernel_size=1)
    return nn.Sequential(module)

@dataclass
class Composed:
    model: object
    fsdp_roots: object = field(default_factory=list)

    @contextmanager
    def full_parameters(self):
        from torch.distributed.tensor import DTensor
        out = {}
        n, p = next(iter(self.model.named_parameters()))
        out[n] = (p.full_tensor() if isinstance(p, DTensor) else p).detach()
        yield out

def train(comp, ctx):
    if comp is not None:
        torch.manual_seed(0)
        model_ = build_model().to(torch.float32)
        from torch.distributed.fsdp import fully_shard
        modules = [model_.get_submodule('0')]
        fully_shard(modules[0], mesh=None, reshard_after_forward=2)
        compose_out = Composed(model=model_, fsdp_roots=[model_.get_submodule('0')])
        composed = compose_out
    else:
        torch.manual_seed(0)
        model = build_model().to(torch.float32)
        composed = Composed(model)
    params = composed.model.parameters()
    forward = composed.model
    params_per_step = []
    gen = torch.Generator().manual_seed(0)
    lo = ctx.rank
    x_ = torch.randn(ctx.world_size, 2)
    y_ = torch.randn(ctx.world_size, 2)
    step_ = [(x_[lo:lo + 1].to(ctx.device), y_[lo:lo + 1].to(ctx.device))]
    i, (x, y) = next(iter(enumerate(step_)))
    out = forward(x)
    loss = F.mse_loss(out.to(y.dtype), y)
    with composed.full_parameters() as full:
        params_per_step.append({n: t.double().cpu().flatten().tolist() for n, t in full.items()})
    obs = {'params': params_per_step}
    return obs

@dataclass(frozen=True)
class Tolerance:
    rtol: object
    atol: object
POLICY = {'float64': Tolerance(rtol=1e-09, atol=1e-12), 'float32': Tolerance(rtol=1e-05, atol=1e-06), 'bfloat16': Tolerance(rtol=0.032, atol=0.001), 'float16': Tolerance(rtol=0.004, atol=0.0001)}

@dataclass(frozen=True)
class Mismatch:
    index: object
    actual: object
    expected: object
    error: object
    allowed: object

def compare_runs(observations, tol):
    first = observations[0]
    step, (got_params, want_params) = next(iter(enumerate(zip(first['params'][:None], first['ref']['params'][:None]))))
    name, want = next(iter(want_params.items()))
    actual = got_params[name]
    worst = None
    for i, (a, e) in enumerate(zip(actual, want)):
        allowed = tol.atol + tol.rtol * abs(e)
        err = abs(a - e)
        if not err <= allowed or not math.isfinite(e):
            worst = Mismatch(index=i, actual=a, expected=e, error=err, allowed=allowed)
    bad = worst
    if bad is not None:
        summary = f'{name}[{bad.index}] after step {step} is {bad.actual!r}, expected {bad.expected!r} (error {bad.error:.3g} > allowed {bad.allowed:.3g})'
        return summary

def check_replicas():
    pass

def attempt(rank, world_size):
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import json
    comp = ('0',)
    composed = train(comp, ctx)
    reference = train(None, ctx)
    run_parity_out = {**composed, 'ref': {k: reference[k] for k in ('losses', 'params', 'grad_norms') if k in reference}}
    obs = json.loads(json.dumps(run_parity_out))
    outs = [None] * world_size
    dist.all_gather_object(outs, obs)
    if rank != 0:
        return ''
    reports = tuple((o for r, o in enumerate(outs)))
    obs_ = [r or {} for r in reports]
    failure_ = compare_runs(obs_, POLICY['float32']) or check_replicas()
    if failure_ is not None:
        return f'REPRODUCED mismatch:parity@fsdp2:frozen-int-reshard: {failure_}'
    return f'PASS or another failure: {failure_ and failure_}'

def torch_frame(path: str, function: str) -> str | None:
    at = path.rfind('/torch/')
    inner = path[at + 1:]
    if at < 0 or '/fuzz/' in path or '-packages/' in inner or (function in ('<listcomp>', '<dictcomp>', '<setcomp>')):
        return None
    return f'{inner}:{function}'

def main():
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import sys
    import time
    if os.environ.get("WORLD_SIZE") != "4":
        print("run it with: torchrun --nproc-per-node 4 " + sys.argv[0], file=sys.stderr)
        sys.exit(2)
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    verdict = attempt(rank, world_size)
    if verdict and verdict not in ['PASS or another failure: None', 'PASS: every rank finished', 'PASS: no rank died', 'PASS: no rank raised']:
        sys.stdout.write(verdict + "\n")  # one write: the ranks share torchrun's output
        sys.stdout.flush()
        os._exit(1 if verdict.startswith("REPRODUCED") else 2)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
    store.add("repro-passed", 1)
    until = time.monotonic() + 60
    while store.add("repro-passed", 0) < world_size:
        if time.monotonic() > until:
            print(f"FAIL (not the entry's failure): rank {rank} finished, another rank did not", flush=True)
            os._exit(2)
        time.sleep(0.05)
    if rank == 0:
        print(verdict or 'PASS: no rank raised', flush=True)
    os._exit(0)  # a rank must not wait for the others at exit


if __name__ == "__main__":
    main()
