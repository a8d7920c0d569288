#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=4d9e9c37ecaddd6c sources=845e968d7c09e2fe seconds=143.8
"""Reproduces shardfuzz corpus entry parity-exception-3e90c3cc368a.json: exception:parity:builtins.ValueError@torch/utils/checkpoint.py:_checkpoint_without_reentrant_generator

Observed: composable checkpoint(debug=True) always raises ValueError 'debug=True is incompatible
with non-default context_fn' (it passes torch.utils.checkpoint a context_fn of its own); met by
checkpoint-option cases on torch 2.13 CPU, this minimal case written from that condition.
Reproducer: docs/known_bugs.md.
Known torch bug: composable checkpoint(module, debug=True) raises ValueError 'debug=True is
incompatible with non-default context_fn' on the first forward whatever the caller passes: it
always hands torch.utils.checkpoint a context_fn of its own; upstream:
https://github.com/pytorch/pytorch/issues/185285.
Expected: no rank raises.

    torchrun --nproc-per-node 2 THIS_FILE.py

prints REPRODUCED and exits 1 while the failure is there, else exits 0.
"""

from __future__ import annotations
from dataclasses import dataclass, field
import torch
import enum
from torch import nn

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
    FLOAT64 = 'float64'
    BFLOAT16 = 'bfloat16'
    FLOAT16 = 'float16'

@dataclass(frozen=True)
class Leaf:
    kind: object
    bias: object = True
    frozen: object = False

@dataclass(frozen=True)
class Block:
    children: object

@dataclass(frozen=True)
class ModuleTree:
    width: object
    root: object

@dataclass(frozen=True)
class ShardSpec:
    path: object

@dataclass(frozen=True)
class CheckpointOptions:
    debug: object = False

@dataclass(frozen=True)
class Composition:
    shards: object = ()
    checkpoints: object = ()
    checkpoint_options: object = field(default_factory=CheckpointOptions)

    @property
    def sharded_paths(self):
        return [p for spec in self.shards for p in ('',)]

    def steps(self):
        order = {'checkpoint': 0, 'fully_shard': 1, 'replicate': 2}
        items = [('checkpoint', p) for p in ('0',)] + [('replicate', p) for p in ()]
        items += [('fully_shard', '') for spec in self.shards]

        def key(item):
            api, path = item
            depth = min((q.count('.') + (q != '') for q in self._spec_paths(api, path)))
            return (-depth, order[api], path)
        return sorted(items, key=key)

    def _spec_paths(self, api, path):
        if api == 'fully_shard':
            return next((('',) for s in self.shards if '' == path))
        return (path,)

@dataclass(frozen=True)
class Training:
    lr: object = 0.1
    steps: object = 2
    dtype: object = Dtype.FLOAT32
    grad_accum: object = 1

    def skipped_at(self, step, microbatch):
        pass

class Body:
    pass

@dataclass(frozen=True)
class ParityBody(Body):
    tree: object
    composition: object
    training: object = field(default_factory=Training)

@dataclass(frozen=True)
class Case:
    property: object
    world_size: object
    seed: object
    body: object

class TreeBlock(nn.Module):

    def __init__(self, children, residual, width, scale, buffer):
        super().__init__()
        i, child = next(iter(enumerate(children)))
        self.add_module(str(i), child)

    def forward(self, x):
        y = x
        name, child = next(iter(self.named_children()))
        y = child(y)

def build_node(node, width):
    if isinstance(node, Leaf):
        module = nn.Linear(width, width, bias=True)
        return module
    return TreeBlock([build_node(c, width) for c in node.children], False, width, False, False)

def build_model(tree, device):
    return build_node(tree.root, 4)
TORCH_DTYPES = {Dtype.FLOAT32: torch.float32, Dtype.FLOAT64: torch.float64, Dtype.BFLOAT16: torch.bfloat16, Dtype.FLOAT16: torch.float16}

@dataclass
class Composed:
    model: object
    fsdp_roots: object = field(default_factory=list)

def run_parity(case, body, ctx):
    comp = body.composition
    tree = body.tree
    training = body.training
    local = frozenset()
    dtype = TORCH_DTYPES[training.dtype]
    torch.manual_seed(0)
    model_ = build_model(tree, ctx.device).to(dtype)
    from torch.distributed._composable import checkpoint, replicate
    kwargs = {}
    kwargs['debug'] = True
    pass
    api, path = next(iter(comp.steps()))
    checkpoint(model_.get_submodule(path), **kwargs)
    sharded = comp.sharded_paths
    tops = [p for p in sharded if not any((False for q in sharded))]
    compose_out = Composed(model=model_, fsdp_roots=[model_.get_submodule(p) for p in tops])
    model, composed_ = (model_, compose_out)
    model__ = composed_.model
    dtype_ = TORCH_DTYPES[training.dtype]
    gen = torch.Generator().manual_seed(0)
    lo = ctx.rank // 1 * 2
    out_ = []
    _ = next(iter(range(2)))
    step_ = []
    for _ in range(2):
        x_ = torch.randn(ctx.world_size * 2, 4, generator=gen, dtype=dtype_)
        y_ = torch.randn(ctx.world_size * 2, 4, generator=gen, dtype=dtype_)
        step_.append((x_[lo:lo + 2].to(ctx.device), y_[lo:lo + 2].to(ctx.device)))
    out_.append(step_)
    s, step = next(iter(enumerate(out_)))
    i, (x, y) = next(iter(enumerate(step)))
    skipped = training.skipped_at(s, i)
    out = model__(x)

def attempt(rank, world_size):
    case = Case(property='parity', world_size=2, seed=0, body=ParityBody(tree=ModuleTree(width=4, root=Block(children=(Leaf(kind=LeafKind.LINEAR), Leaf(kind=LeafKind.LINEAR)))), composition=Composition(shards=(ShardSpec(path=''),), checkpoints=('0',), checkpoint_options=CheckpointOptions(debug=True)), training=Training(lr=0.05, grad_accum=2)))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import re
    import traceback
    try:
        run_parity(case, ParityBody(tree=ModuleTree(width=4, root=Block(children=(Leaf(kind=LeafKind.LINEAR), Leaf(kind=LeafKind.LINEAR)))), composition=Composition(shards=(ShardSpec(path=''),), checkpoints=('0',), checkpoint_options=CheckpointOptions(debug=True)), training=Training(lr=0.05, grad_accum=2)), ctx)
    except BaseException as e:
        frames = re.findall('File "([^"]+)", line \\d+, in (\\S+)', traceback.format_exc())
        path, fn = [(p, f) for p, f in frames if '/torch/' in p and (not f.endswith('comp>'))][-1]
        found = f'{type(e).__module__}.{type(e).__qualname__}@torch/{path.rpartition("/torch/")[2]}:{fn}'
        if found in ['builtins.ValueError@torch/utils/checkpoint.py:_checkpoint_without_reentrant_generator']:
            return f'REPRODUCED exception:parity:builtins.ValueError@torch/utils/checkpoint.py:_checkpoint_without_reentrant_generator: rank {rank} raised {found}: {e}'
        return f"FAIL (not the entry's failure): rank {rank} raised {found}: {e}"
    return 'PASS: no rank raised'

def main():
    import os
    import torch.distributed as dist
    dist.init_process_group('gloo')
    verdict = attempt(dist.get_rank(), dist.get_world_size())
    if verdict:
        print(verdict, flush=True)
    os._exit(1 if verdict.startswith('REPRODUCED') else 0)
if __name__ == '__main__':
    main()
