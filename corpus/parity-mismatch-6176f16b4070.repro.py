#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=5c3349c879fbaf65 sources=ce057bc0da65e4dc seconds=3643.3
# Reproduces shardfuzz corpus entry parity-mismatch-6176f16b4070.json: mismatch:parity@fsdp2:compiled-unfreeze
# Known torch bug: torch.compile (aot_eager) of a module whose plain (non-DTensor) parameter was
# frozen when it was compiled: after requires_grad_(True) the compiled forward is reused without a
# recompile and the parameter gets no gradient (met through fully_shard's ignored_params, which
# stay plain tensors); upstream: https://github.com/pytorch/pytorch/issues/139476.
# Observed: torch.compile(backend='aot_eager') over fully_shard whose ignored_params (plain
# tensors) are frozen at the first compile and unfrozen before step 1: the compiled forward is ...
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: while the failure is there a rank prints
# REPRODUCED and exits 1; once it is gone rank 0 prints PASS and every rank exits 0 (expected: the
# property's judge finds nothing); a rank exits 2 where the script cannot run (not under torchrun,
# another world size) or the case fails another way (it prints FAIL). torchrun's own status is 1
# whenever a rank's is not 0.

from __future__ import annotations
import torch
from dataclasses import dataclass
from torch import nn
import torch.distributed as dist
import torch.nn.functional as F

@dataclass
class RankContext:
    rank: object
    world_size: object
    device: object
    backend: object

@dataclass()
class Leaf:
    frozen: object = False

@dataclass()
class Composition:
    pass

@dataclass()
class Unfreeze:
    path: object
    step: object

def build_node(node, width):
    if isinstance(node, Leaf):
        module = nn.Linear(width, width)
        if node.frozen:
            module.requires_grad_(False)
        return module
    return nn.Sequential(*[build_node(c, width) for c in node])

def train(tree, training, comp, ctx):
    if comp is not None:
        torch.manual_seed(0)
        model___ = build_node(tree, 2)
        composed = model___
    else:
        torch.manual_seed(0)
        model = build_node(tree, 2)
        composed = model
    model_ = composed
    out___ = {'0': []}
    name_, p__ = next(model_.named_parameters())
    owner = '.'.join((c for c in name_.split('.')[:-1]))
    out___[owner].append(p__)
    forward = torch.compile(composed, backend='aot_eager') if comp is not None else composed
    grad_norms = []
    gen = torch.Generator().manual_seed(0)
    lo = ctx.rank * 2
    out_ = []
    for __ in range(2):
        x_ = torch.randn(ctx.world_size * 2, 2, generator=gen)
        y_ = torch.randn(ctx.world_size * 2, 2, generator=gen)
        step_ = [(x_[lo:lo + 2], y_[lo:lo + 2])]
        out_.append(step_)
    for s, step in enumerate(out_):
        for path in [u.path for u in training if u.step == s]:
            p = next(iter(out___[path]))
            p.requires_grad_(True)
        i, (x, y) = next(enumerate(step))
        out = forward(x)
        loss = F.mse_loss(out, y)
        loss.backward()
        total = torch.zeros(())
        p____ = next(composed.parameters())
        if p____.grad is not None:
            g = p____.grad
            total += g.sum()
        grad_norm_out = total
        grad_norms.append(grad_norm_out)
    obs = {'grad_norms': grad_norms}
    return obs

@dataclass()
class Tolerance:
    rtol: object
    atol: object
POLICY = {'float32': Tolerance(rtol=1e-05, atol=1e-06)}

def compare_runs(observations, tol):
    rank, obs = observations
    ref = obs['ref']
    norms = [(i, g, w) for i, (g, w) in enumerate(zip(obs['grad_norms'][:None], ref['grad_norms'][:None]))]
    for step, got_norm, want_norm in norms:
        actual = [got_norm]
        expected = [want_norm]
        worst_ = None
        i__, (a_, e_) = next(enumerate(zip(actual, expected)))
        allowed_ = tol.atol + tol.rtol * abs(e_)
        err_ = a_ - e_
        if not err_ <= allowed_:
            worst_ = e_
        bad = worst_
        if bad is not None:
            summary = f'rank {rank} gradient norm at step {step} is {got_norm!r}, expected {want_norm!r}'
            return summary

def attempt(rank, world_size):
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    comp = Composition()
    composed = train((Leaf(frozen=True), Leaf()), (Unfreeze(path='0', step=1),), comp, ctx)
    reference = train((Leaf(frozen=True), Leaf()), (Unfreeze(path='0', step=1),), None, ctx)
    run_parity_out = {**composed, 'ref': {'grad_norms': reference['grad_norms']}}
    outs = [None, None]
    dist.all_gather_object(outs, run_parity_out)
    if rank != 0:
        return ''
    reports = (o for r, o in enumerate(outs))
    obs = [r for r in reports]
    tolerance_out = POLICY['float32']
    failure_ = compare_runs(obs, tolerance_out)
    if failure_ is not None:
        return f'REPRODUCED mismatch:parity@fsdp2:compiled-unfreeze: {failure_}'
    return f'PASS or another failure: {failure_ and failure_}'


def main():
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import sys
    if os.environ.get("WORLD_SIZE") != "2":
        print("run it with: torchrun --nproc-per-node 2 " + sys.argv[0], file=sys.stderr)
        sys.exit(2)
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    verdict = attempt(rank, world_size)
    if verdict and verdict not in ['PASS or another failure: None', 'PASS: every loss, gradient and parameter agrees', 'PASS: every rank finished', 'PASS: no rank died', 'PASS: no rank raised']:
        sys.stdout.write(verdict + "\n")  # one write: the ranks share torchrun's output
        sys.stdout.flush()
        os._exit(1 if verdict.startswith("REPRODUCED") else 2)
    if verdict:
        print(verdict, flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
