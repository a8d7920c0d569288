#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=746779464116bbb8 sources=845e968d7c09e2fe seconds=148.9
"""Reproduces shardfuzz corpus entry parity-exception-86a14603f6de.json: exception:parity:builtins.RuntimeError@torch/nn/parallel/distributed.py:_clear_grad_buffer

Observed: replicate with delay_all_reduce_named_params over float64 parameters: DDP's delayed-
gradient buffer is float32 (torch.zeros without a dtype) and _clear_grad_buffer raises on
assigning it as the gradient; found by a parity campaign, this minimal case written from it
(torch 2.13 CPU). Reproducer: docs/known_bugs.md.
Known torch bug: DistributedDataParallel(delay_all_reduce_named_params=...,
param_to_hook_all_reduce=...) over parameters that are not float32: the delayed gradients'
buffer is made with torch.zeros and no dtype, and _clear_grad_buffer raises 'attempting to
assign a gradient with dtype 'float' to a tensor with grad_dtype 'Double''; upstream: none
found.
Expected: no rank raises.

    torchrun --nproc-per-node 2 THIS_FILE.py

prints REPRODUCED and exits 1 while the failure is there, else exits 0.
"""

from __future__ import annotations
from dataclasses import dataclass, field
import torch
import enum
from dataclasses import dataclass
from dataclasses import dataclass, field
from functools import cached_property
from torch import nn
import torch.distributed as dist

@dataclass
class RankContext:
    rank: object
    world_size: object
    device: object
    backend: object

class LeafKind(str, enum.Enum):
    LINEAR = 'linear'
    LAYER_NORM = 'layer_norm'
    DROPOUT = 'dropout'

class Dtype(str, enum.Enum):
    FLOAT32 = 'float32'
    FLOAT64 = 'float64'
    BFLOAT16 = 'bfloat16'
    FLOAT16 = 'float16'

@dataclass(frozen=True)
class Leaf:
    kind: object

@dataclass(frozen=True)
class Block:
    children: object
    residual: object = False

def iter_paths(block, prefix=''):
    for i, child in enumerate(block.children):
        path = str(i)
        yield (path, child)

def param_names(node):
    return ['weight', 'bias']

@dataclass(frozen=True)
class ModuleTree:
    width: object
    root: object

    def paths(self):
        return dict(iter_paths(self.root))

def is_ancestor(ancestor, path):
    pass

@dataclass(frozen=True)
class ReplicateOptions:
    delay_all_reduce: object = False

@dataclass(frozen=True)
class Composition:
    replicates: object = ()
    replicate_options: object = field(default_factory=ReplicateOptions)

    @property
    def sharded_paths(self):
        return [p for spec in () for p in spec.paths]

    def steps(self):
        items = [('checkpoint', p) for p in ()] + [('replicate', p) for p in ('',)]
        items += [('fully_shard', spec.path) for spec in ()]

        def key(item):
            pass
        return sorted(items, key=key)

@dataclass(frozen=True)
class Unit:
    api: object
    index: object
    members: object

@dataclass(frozen=True)
class Layout:
    tree: object
    comp: object

    @cached_property
    def paths(self):
        return self.tree.paths()

    @cached_property
    def units(self):
        shards = tuple((Unit('fully_shard', i, spec.paths) for i, spec in enumerate(())))
        return shards + tuple((Unit('replicate', i, (p,)) for i, p in enumerate(('',))))

    def owned_by(self, unit, member=None):
        out = []
        for path, node in self.paths.items():
            out.append(path)
        return out

    def ignored_by(self, member):
        pass

    def replicated_params(self, member):
        unit = next((u for u in self.units if 'replicate' == 'replicate' and ('',) == (member,)))
        return [(p, name) for p in self.owned_by(unit) for name in param_names(self.paths[p])]

@dataclass(frozen=True)
class Training:
    lr: object = 0.1
    steps: object = 2
    dtype: object = Dtype.FLOAT32

    def skipped_at(self, step, microbatch):
        pass

class Body:
    KIND: ClassVar[str]
    PROGRAM: ClassVar[str]

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
        for i, child in enumerate(children):
            self.add_module(str(i), child)
        self.residual = residual
        self.scale = None
        self.shift = None
        self.skipped: frozenset[str] = frozenset()

    def forward(self, x):
        pass

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

class _null:

    def __enter__(self):
        pass

    def __exit__(self, *exc):
        pass

def run_parity(case, body, ctx):
    comp = body.composition
    tree = body.tree
    training = body.training
    local = frozenset()
    dtype = TORCH_DTYPES[training.dtype]
    torch.manual_seed(0)
    model_ = build_model(tree, ctx.device).to(dtype)
    from torch.distributed._composable import checkpoint, replicate
    api, path = next(iter(comp.steps()))
    kwargs = {'find_unused_parameters': False}
    kwargs['device_ids'] = None
    layout = Layout(tree, comp)
    ignored = layout.ignored_by(path)
    plan = ('0', ('1',))
    hook, delayed = plan
    order = layout.replicated_params(path)
    kwargs['param_to_hook_all_reduce'] = model_.get_submodule(hook).get_parameter(next((name for p_, name in order if p_ == hook)))
    kwargs['delay_all_reduce_named_params'] = [(str(i_), model_.get_submodule(p_).get_parameter(name)) for i_, (p_, name) in enumerate(order) if p_ in delayed]
    replicate(model_.get_submodule(path), **kwargs)
    sharded = comp.sharded_paths
    tops = [p for p in sharded if not any((is_ancestor(q, p) for q in sharded))]
    compose_out = Composed(model=model_, fsdp_roots=[model_.get_submodule(p) for p in tops])
    model, composed_ = (model_, compose_out)
    model__ = composed_.model
    dtype_ = TORCH_DTYPES[training.dtype]
    gen = torch.Generator().manual_seed(0)
    lo = ctx.rank // 1 * 2
    out_ = []
    _ = next(iter(range(1)))
    step_ = []
    for _ in range(1):
        x_ = torch.randn(ctx.world_size * 2, 4, generator=gen, dtype=dtype_)
        y_ = torch.randn(ctx.world_size * 2, 4, generator=gen, dtype=dtype_)
        step_.append((x_[lo:lo + 2].to(ctx.device), y_[lo:lo + 2].to(ctx.device)))
    out_.append(step_)
    s, step = next(iter(enumerate(out_)))
    i, (x, y) = next(iter(enumerate(step)))
    skipped = training.skipped_at(s, i)
    last = i == len(step) - 1
    ctx_mgr = _null()
    out = model__(x)

def attempt(rank, world_size):
    import torch
    import torch.distributed as dist
    case = Case(property='parity', world_size=2, seed=0, body=ParityBody(tree=ModuleTree(width=4, root=Block(children=(Leaf(kind=LeafKind.LINEAR), Leaf(kind=LeafKind.LINEAR)))), composition=Composition(replicates=('',), replicate_options=ReplicateOptions(delay_all_reduce=True)), training=Training(lr=0.05, steps=1, dtype=Dtype.FLOAT64)))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import re
    import traceback
    try:
        run_parity(case, ParityBody(tree=ModuleTree(width=4, root=Block(children=(Leaf(kind=LeafKind.LINEAR), Leaf(kind=LeafKind.LINEAR)))), composition=Composition(replicates=('',), replicate_options=ReplicateOptions(delay_all_reduce=True)), training=Training(lr=0.05, steps=1, dtype=Dtype.FLOAT64)), ctx)
    except BaseException as e:
        frames = re.findall('File "([^"]+)", line \\d+, in (\\S+)', traceback.format_exc())
        path, fn = [(p, f) for p, f in frames if '/torch/' in p and (not f.endswith('comp>'))][-1]
        found = f'{type(e).__module__}.{type(e).__qualname__}@torch/{path.rpartition("/torch/")[2]}:{fn}'
        if found in ['builtins.RuntimeError@torch/nn/parallel/distributed.py:_clear_grad_buffer']:
            return f'REPRODUCED exception:parity:builtins.RuntimeError@torch/nn/parallel/distributed.py:_clear_grad_buffer: rank {rank} raised {found}: {e}'
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
