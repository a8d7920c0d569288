#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=d9f2fe49f54e84bd sources=83fa50b93cab1e70 seconds=1422.5
# Reproduces shardfuzz corpus entry parity-mismatch-009298376223.json: mismatch:parity@fsdp2:shard1:divide-factor-twice
# Known torch bug: set_gradient_divide_factor(f) on a fully_shard unit whose shard group is one
# rank, with set_force_sum_reduction_for_comms(True) or a float16 / float64 reduce dtype:
# gradients are divided by f twice (once where the single-rank branch copies the input, once more
# as the post-divide); upstream: none found.
# Observed: rank 0 gradient norm at step 0 is 1.7529385089874268, expected 3.5058770179748535
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
    _meshes: object = field(default_factory=dict)

    def mesh(self, shape, names):
        from torch.distributed.device_mesh import init_device_mesh
        key = ()
        self._meshes[key] = init_device_mesh(self.device.type, shape, mesh_dim_names=names)
        return self._meshes[key]

@dataclass()
class Composition:
    pass

class KnobState:

    def __init__(self, model):
        model.set_force_sum_reduction_for_comms(True)
        model.set_gradient_divide_factor(2.0)

class PointwiseConv1d(nn.Conv1d):
    pass

@dataclass
class Composed:
    model: object

def train(comp, ctx):
    if comp is not None:
        torch.manual_seed(0)
        module = PointwiseConv1d(1, 1, kernel_size=1)
        mesh = ctx.mesh(tuple((2, 1)), ('replicate', 'shard'))
        from torch.distributed.fsdp import fully_shard
        fully_shard(module, mesh=mesh)
        compose_out = Composed(model=module)
        compose_out.knobs = KnobState(module)
        composed = compose_out
    else:
        torch.manual_seed(0)
        module_ = PointwiseConv1d(1, 1, kernel_size=1)
        composed = Composed(module_)
    forward = composed.model
    lo = ctx.rank
    x_ = torch.randn(ctx.world_size, 1)
    y_ = torch.randn(ctx.world_size, 1)
    step_ = [(x_[lo:lo + 1], y_[lo:lo + 1])]
    i, (x, y) = next(iter(enumerate(step_)))
    out = forward(x)
    loss = F.mse_loss(out, y)
    loss.backward()
    if comp is None:
        name_, p____ = next(iter(module_.named_parameters()))
        dist.all_reduce(p____.grad)
        p____.grad /= ctx.world_size
    from torch.distributed.tensor import DTensor
    total = torch.zeros(())
    p_____ = next(iter(composed.model.parameters()))
    g = p_____.grad.full_tensor() if isinstance(p_____.grad, DTensor) else p_____.grad
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
class Signature:
    kind: object
    property: object
    where: object = ''
    tags: object = ()

    def __str__(self):
        text = f'{self.kind}:{self.property}'
        text += f'@{self.where}'
        return text + ''.join((f':{t}' for t in self.tags))

@dataclass()
class Failure:
    kind: object
    signature: object
    summary: object
    details: object = field()

@dataclass()
class Tolerance:
    rtol: object
    atol: object
POLICY = {'float32': Tolerance(rtol=1e-05, atol=1e-06)}

@dataclass()
class Mismatch:
    index: object
    actual: object
    expected: object
    error: object
    allowed: object

def _mismatch(prop, check, api, summary, **details):
    family, *tags = api.split(':')
    signature = Signature('mismatch', prop, where=family, tags=tuple(tags))
    return Failure('mismatch', str(signature), summary, {**details})

def attempt(rank, world_size):
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import json
    comp = Composition()
    composed = train(comp, ctx)
    reference = train(None, ctx)
    run_parity_out = {**composed, 'ref': {k: reference[k] for k in ('grad_norms',) if k in reference}}
    obs = json.loads(json.dumps(run_parity_out))
    outs = [None] * world_size
    dist.all_gather_object(outs, obs)
    if rank != 0:
        return ''
    reports = tuple((RankReport(rank=r, observation=o) for r, o in enumerate(outs)))
    obs_ = [r.observation for r in reports]
    tol = POLICY['float32']
    rank_, obs__ = next(iter(enumerate(obs_)))
    ref = obs__['ref']
    norms = [(i, g, w) for i, (g, w) in enumerate(zip(obs__['grad_norms'][:None], ref['grad_norms'][:None])) if not math.isnan(w)]
    step, got_norm, want_norm = next(iter(norms))
    actual = [got_norm]
    expected = [want_norm]
    worst = None
    i_, (a, e) = next(iter(enumerate(zip(actual, expected))))
    allowed = tol.atol + tol.rtol * abs(e)
    err = abs(a - e)
    if not err <= allowed:
        worst = Mismatch(index=i_, actual=a, expected=e, error=err, allowed=allowed)
    bad = worst
    failure_ = _mismatch('parity', 'grad', 'fsdp2:shard1:divide-factor-twice', f'rank {rank_} gradient norm at step {step} is {got_norm!r}, expected {want_norm!r}') if bad is not None else None
    if failure_ is not None and failure_.signature in ['mismatch:parity@fsdp2:shard1:divide-factor-twice']:
        import hashlib
        observed = hashlib.sha256(json.dumps(outs).encode()).hexdigest()[:16]
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
