#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=fa2d3ff0502bcfd3 sources=cc3165b517eb5e55 seconds=979.8
# Reproduces shardfuzz corpus entry parity-mismatch-48aab936fb0d.json: mismatch:parity@fsdp1:unfrozen-frozen-unit
# Known torch bug: FSDP1 NO_SHARD, a unit all frozen at wrapping: a leaf unfrozen later never
# trains; upstream: https://github.com/pytorch/pytorch/issues/85831.
# Observed: rank 0 gradient norm at step 1 is 0.011955796740949154, expected 0.8571569304369612
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

@dataclass
class RankContext:
    rank: object
    world_size: object
    device: object

class PointwiseConv1d(nn.Conv1d):
    pass

def train(ctx):
    module = PointwiseConv1d(1, 1, kernel_size=1)
    module.requires_grad_(False)
    model_ = nn.Sequential(module, nn.Sequential(PointwiseConv1d(1, 1, kernel_size=1)))
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    strategy = ShardingStrategy.NO_SHARD
    wrap_out = FSDP(model_, sharding_strategy=strategy, device_id=ctx.device, use_orig_params=True, auto_wrap_policy=ModuleWrapPolicy({nn.Sequential}))
    lo = ctx.rank
    i, (x, y) = (0, (torch.randn(ctx.world_size, 1)[lo:lo + 1], torch.randn(ctx.world_size, 1)[lo:lo + 1]))
    wrap_out(x).backward()
    total = torch.zeros(())
    p____ = next(wrap_out.parameters())
    if p____.grad is not None:
        total += p____.grad.sum()
    return {'grad_norms': [total]}

def attempt(rank, world_size):
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'))
    obs = {**train(ctx), 'ref': {'grad_norms': train(ctx)['grad_norms']}}
    outs = [None, None]
    dist.all_gather_object(outs, obs)
    if rank != 0:
        return ''
    rank_, obs__ = [r for r in (o for r, o in enumerate(outs))]
    norms = [(i, g, w) for i, (g, w) in enumerate(zip(obs__['grad_norms'][:None], obs__['ref']['grad_norms'][:None]))]
    step, got_norm, want_norm = next(iter(norms))
    actual = [got_norm]
    expected = [want_norm]
    worst = None
    i_, (a, e) = next(enumerate(zip(actual, expected)))
    if not abs(a - e) <= 7.228746175765992e-06:
        worst = e
    bad = worst
    failure_ = 'rank 0 gradient norm at step 0 is 1.214159607887268, expected -0.27835938334465027' if bad is not None else None
    if failure_ is not None:
        return f'REPRODUCED mismatch:parity@fsdp1:unfrozen-frozen-unit: {failure_}'
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
