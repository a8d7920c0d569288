#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=fa2d3ff0502bcfd3 sources=cc3165b517eb5e55 seconds=927.7
# Reproduces shardfuzz corpus entry parity-mismatch-48aab936fb0d.json: mismatch:parity@fsdp1:unfrozen-frozen-unit
# Known torch bug: FSDP1 NO_SHARD, a unit all frozen at wrapping: a leaf unfrozen later never
# trains; upstream: https://github.com/pytorch/pytorch/issues/85831.
# Observed: rank 0 gradient norm at step 1 is 0.011955796740949154, expected 0.8571569304369612
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: prints REPRODUCED and exits 1 while the failure
# is there, else exits 0 (expected: the property's judge finds nothing).

from __future__ import annotations
import torch
from dataclasses import dataclass, field
from torch import nn
import torch.nn.functional as F
import torch.distributed as dist
import math

@dataclass
class RankContext:
    rank: object
    world_size: object
    device: object
    backend: object

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
    x_ = torch.randn(ctx.world_size, 1)
    y_ = torch.randn(ctx.world_size, 1)
    step_ = [(x_[lo:lo + 1], y_[lo:lo + 1])]
    i, (x, y) = next(iter(enumerate(step_)))
    out = wrap_out(x)
    loss = F.mse_loss(out, y)
    loss.backward()
    total = torch.zeros(())
    p____ = next(iter(wrap_out.parameters()))
    if p____.grad is not None:
        g = p____.grad
        total += g.sum()
    grad_norm_out = float(total)
    grad_norms = [grad_norm_out]
    obs = {'grad_norms': grad_norms}
    return obs

@dataclass()
class RankReport:
    rank: object
    observation: object = None

@dataclass()
class Failure:
    kind: object
    signature: object
    summary: object
    details: object = field()

@dataclass()
class Mismatch:
    index: object
    actual: object
    expected: object
    error: object
    allowed: object

def attempt(rank, world_size):
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import json
    composed = train(ctx)
    reference = train(ctx)
    run_parity_out = {**composed, 'ref': {k: reference[k] for k in ('grad_norms',) if k in reference}}
    obs = json.loads(json.dumps(run_parity_out))
    outs = [None, None]
    dist.all_gather_object(outs, obs)
    if rank != 0:
        return ''
    reports = tuple((RankReport(rank=r, observation=o) for r, o in enumerate(outs)))
    obs_ = [r.observation for r in reports]
    rank_, obs__ = next(iter(enumerate(obs_)))
    ref = obs__['ref']
    norms = [(i, g, w) for i, (g, w) in enumerate(zip(obs__['grad_norms'][:None], ref['grad_norms'][:None])) if not math.isnan(w)]
    step, got_norm, want_norm = next(iter(norms))
    actual = [got_norm]
    expected = [want_norm]
    worst = None
    i_, (a, e) = next(iter(enumerate(zip(actual, expected))))
    err = abs(a - e)
    if not err <= 7.228746175765992e-06:
        worst = Mismatch(index=i_, actual=a, expected=e, error=err, allowed=7.228746175765992e-06)
    bad = worst
    failure_ = Failure('mismatch', 'mismatch:parity@fsdp1:unfrozen-frozen-unit', 'rank 0 gradient norm at step 0 is 1.214159607887268, expected -0.27835938334465027', {}) if bad is not None else None
    if failure_ is not None and failure_.signature in ['mismatch:parity@fsdp1:unfrozen-frozen-unit']:
        import hashlib
        observed = hashlib.sha256(json.dumps(outs, sort_keys=True).encode()).hexdigest()[:16]
        return f'REPRODUCED {failure_.signature}: observations {observed}: {failure_.summary}'
    return f'PASS or another failure: {failure_ and failure_.signature}'

def main():
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import sys
    import torch.distributed as dist
    dist.init_process_group('gloo')
    verdict = attempt(dist.get_rank(), dist.get_world_size())
    if verdict:
        sys.stdout.write(verdict + '\n')
        sys.stdout.flush()
    os._exit(1 if verdict.startswith('REPRODUCED') else 0)
if __name__ == '__main__':
    main()
