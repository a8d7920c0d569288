#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=6d0f1782b1a74e14 sources=845e968d7c09e2fe seconds=179.5
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
import torch
import enum
from dataclasses import dataclass, field
from functools import cached_property
from torch import nn

class LeafKind(str, enum.Enum):
    LINEAR = 'linear'

@dataclass()
class Leaf:
    kind: object

@dataclass()
class Block:
    children: object

def iter_paths(block, prefix=''):
    for i, child in enumerate(block.children):
        path = str(i)
        yield (path, child)

def param_names(node):
    return ['bias']

@dataclass()
class ModuleTree:
    width: object
    root: object

    def paths(self):
        return dict(iter_paths(self.root))

@dataclass()
class Composition:

    def steps(self):
        items = [] + [('replicate', p) for p in ('',)]
        return sorted(items)

@dataclass()
class Unit:
    api: object
    index: object
    members: object

@dataclass()
class Layout:
    tree: object
    comp: object

    @cached_property
    def paths(self):
        return self.tree.paths()

    @cached_property
    def units(self):
        shards = tuple((Unit('fully_shard', i, spec.paths) for i, spec in enumerate(())))
        return shards + tuple((Unit('replicate', i, ()) for i, p in enumerate(('',))))

    def owned_by(self, unit, member=None):
        out = []
        for path, node in self.paths.items():
            out.append(path)
        return out

    def replicated_params(self, member):
        unit = next((u for u in self.units if 'replicate' == 'replicate' and ('',) == (member,)))
        return [(p, name) for p in self.owned_by(unit) for name in param_names(self.paths[p])]

class TreeBlock(nn.Module):

    def __init__(self, children, residual, width, scale, buffer):
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)

    def forward(self, x):
        pass

def build_node(node, width):
    if isinstance(node, Leaf):
        module = nn.Linear(width, width)
        return module
    return TreeBlock([build_node(c, width) for c in node.children], False, width, False, False)

@dataclass
class Composed:
    model: object
    fsdp_roots: object = field()

def attempt(rank, world_size):
    ctx_device = torch.device('cpu')
    import re
    import traceback
    try:
        comp = Composition()
        tree = ModuleTree(width=4, root=Block(children=(Leaf(kind=LeafKind.LINEAR), Leaf(kind=LeafKind.LINEAR))))
        dtype = torch.float64
        build_model_out = build_node(Block(children=(Leaf(kind=LeafKind.LINEAR), Leaf(kind=LeafKind.LINEAR))), 4)
        model_ = build_model_out.to(dtype)
        from torch.distributed._composable import replicate
        api, path_ = next(iter(comp.steps()))
        kwargs = {}
        layout = Layout(tree, comp)
        plan = ('0', ('1',))
        hook, delayed = plan
        order = layout.replicated_params(path_)
        kwargs['param_to_hook_all_reduce'] = model_.get_submodule(hook).get_parameter(next((name for p_, name in order if p_ == hook)))
        kwargs['delay_all_reduce_named_params'] = [(str(i_), model_.get_submodule(p_).get_parameter(name)) for i_, (p_, name) in enumerate(order) if p_ in delayed]
        replicate(model_.get_submodule(path_), **kwargs)
        sharded = []
        tops = [p__ for p__ in sharded if not any((is_ancestor(q, p__) for q in sharded))]
        compose_out = Composed(model=model_, fsdp_roots=[model_.get_submodule(p__) for p__ in tops])
        model, composed_ = (model_, compose_out)
        model__ = composed_.model
        lo = rank // 1 * 2
        out_ = []
        step_ = []
        x_ = torch.randn(world_size * 2, 4)
        y_ = torch.randn(world_size * 2, 4)
        step_.append((x_[lo:lo + 2].to(ctx_device), y_[lo:lo + 2].to(ctx_device)))
        out_.append(step_)
        s, step = next(iter(enumerate(out_)))
        i, (x, y) = next(iter(enumerate(step)))
        out = model__(x)
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
