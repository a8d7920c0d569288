#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=f1aad34c9feef555 sources=83fa50b93cab1e70 seconds=1605.8
# Reproduces shardfuzz corpus entry parity-mismatch-5f3ad2a543cd.json: mismatch:parity@fsdp2:unfrozen-unresharded
# Known torch bug: a frozen fully_shard unit without resharding under a replicate'd root is never
# resharded: a leaf unfrozen later never trains (KeyError in get_optimizer_state_dict); upstream:
# none found.
# Observed: rank 0 gradient norm at step 1 is 0.9281261466533012, expected 1.2408355322824975
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: prints REPRODUCED and exits 1 while the failure
# is there, else exits 0 (expected: the property's judge finds nothing).

from __future__ import annotations
import torch
import enum
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

class LeafKind(str, enum.Enum):
    LINEAR = 'linear'

class Dtype(str, enum.Enum):
    FLOAT32 = 'float32'

@dataclass()
class Leaf:
    kind: object
    frozen: object = False

@dataclass()
class Block:
    children: object

@dataclass()
class ModuleTree:
    width: object
    root: object

@dataclass()
class Composition:
    tp_size: object = 1

@dataclass()
class Unfreeze:
    path: object
    step: object

@dataclass()
class Training:
    steps: object = 2
    batch_per_rank: object = 2
    same_input: object = False
    unfreeze: object = ()

def build_node(node, width):
    if isinstance(node, Leaf):
        module = nn.Linear(width, width)
        if node.frozen:
            module.requires_grad_(False)
        return module
    return nn.Sequential(*[build_node(c, width) for c in node.children])

@dataclass
class Composed:
    model: object

def train(tree, training, comp, ctx, tp_size=1):
    if comp is not None:
        torch.manual_seed(1)
        build_model_out = build_node(tree.root, 4)
        from torch.distributed.fsdp import fully_shard
        modules = [build_model_out.get_submodule('0')]
        fully_shard(modules[0])
        compose_out = Composed(model=build_model_out)
        composed = compose_out
    else:
        torch.manual_seed(1)
        build_model_out_ = build_node(tree.root, 4)
        composed = Composed(build_model_out_)
    model_ = composed.model
    out__ = {'0': []}
    name, p_ = next(iter(model_.named_parameters()))
    owner = '.'.join((c for c in name.split('.')[:-1] if c))
    out__[owner].append(p_)
    forward = composed.model
    grad_norms = []
    width = tree.width
    b = training.batch_per_rank
    lo = 0 if training.same_input else ctx.rank // tp_size * b
    out_ = []
    for _ in range(training.steps):
        x_ = torch.randn(ctx.world_size * b, width)
        y_ = torch.randn(ctx.world_size * b, width)
        step_ = [(x_[lo:lo + b], y_[lo:lo + b])]
        out_.append(step_)
    for s, step in enumerate(out_):
        for path in [u.path for u in training.unfreeze if u.step == s]:
            p = next(iter(out__[path]))
            p.requires_grad_(True)
        i, (x, y) = next(iter(enumerate(step)))
        out = forward(x)
        loss = F.mse_loss(out, y)
        loss.backward()
        if comp is None:
            name_, p__ = next(iter(build_model_out_.named_parameters()))
            if p__.grad is not None:
                dist.all_reduce(p__.grad)
                p__.grad /= ctx.world_size
        from torch.distributed.tensor import DTensor
        total = torch.zeros(())
        p___ = next(iter(composed.model.parameters()))
        if p___.grad is not None:
            g = p___.grad.full_tensor() if isinstance(p___.grad, DTensor) else p___.grad
            total += g.sum()
        grad_norm_out = float(total)
        grad_norms.append(grad_norm_out)
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

def compare_runs(observations, tol):
    rank, obs = next(iter(enumerate(observations)))
    ref = obs['ref']
    norms = [(i, g, w) for i, (g, w) in enumerate(zip(obs['grad_norms'][:None], ref['grad_norms'][:None])) if not math.isnan(w)]
    for step, got_norm, want_norm in norms:
        actual = [got_norm]
        expected = [want_norm]
        worst = None
        i_, (a, e) = next(iter(enumerate(zip(actual, expected))))
        allowed = tol.atol + tol.rtol * abs(e)
        err = abs(a - e)
        if not err <= allowed:
            worst = Mismatch(index=i_, actual=a, expected=e, error=err, allowed=allowed)
        bad = worst
        if bad is not None:
            summary = f'rank {rank} gradient norm at step {step} is {got_norm!r}, expected {want_norm!r}'
            details = {}
            family, *tags = 'fsdp2:unfrozen-unresharded'.split(':')
            signature = Signature('mismatch', 'parity', where=family, tags=tuple(tags))
            return Failure('mismatch', str(signature), summary, {**details})

def attempt(rank, world_size):
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import json
    tp = Composition().tp_size
    comp = Composition()
    composed = train(ModuleTree(width=4, root=Block(children=(Leaf(kind=LeafKind.LINEAR, frozen=True), Leaf(kind=LeafKind.LINEAR)))), Training(unfreeze=(Unfreeze(path='0', step=1),)), comp, ctx, tp)
    reference = train(ModuleTree(width=4, root=Block(children=(Leaf(kind=LeafKind.LINEAR, frozen=True), Leaf(kind=LeafKind.LINEAR)))), Training(unfreeze=(Unfreeze(path='0', step=1),)), None, ctx, tp)
    run_parity_out = {**composed, 'ref': {k: reference[k] for k in ('grad_norms',) if k in reference}}
    obs = json.loads(json.dumps(run_parity_out))
    outs = [None] * world_size
    dist.all_gather_object(outs, obs)
    if rank != 0:
        return ''
    reports = tuple((RankReport(rank=r, observation=o) for r, o in enumerate(outs)))
    obs_ = [r.observation for r in reports]
    dtype = Dtype.FLOAT32.value
    tolerance_out = POLICY[dtype]
    failure_ = compare_runs(obs_, tolerance_out)
    if failure_ is not None and failure_.signature in ['mismatch:parity@fsdp2:shard1:unfrozen-unresharded', 'mismatch:parity@fsdp2:unfrozen-unresharded']:
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
