#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=1c96dbc1c2137b8d sources=845e968d7c09e2fe seconds=145.9
"""Reproduces shardfuzz corpus entry parity-exception-3e0a93b8ec65.json: exception:parity:builtins.RuntimeError@torch/utils/checkpoint.py:__torch_dispatch__

Observed: selective activation checkpointing over a region holding a fully_shard unit kept
unsharded between microbatches (set_reshard_after_backward(False)): the replay counts FSDP2's
record_function markers and raises 'profiler._record_function_enter_new.default invocation index
2 encountered during backward but not found in storage'; met by checkpoint-option cases on torch
2.13 CPU, this minimal case written from that condition. Reproducer: docs/known_bugs.md.
Known torch bug: selective activation checkpointing
(context_fn=create_selective_checkpoint_contexts) over a region holding a fully_shard unit whose
state differs between forward and recomputation (kept unsharded by
set_reshard_after_backward(False), prefetched, frozen): the replay counts FSDP2's
record_function markers and raises 'profiler._record_function_enter_new.default invocation index
N encountered during backward but not found in storage'; upstream:
https://github.com/pytorch/pytorch/issues/196862.
Expected: no rank raises.

    torchrun --nproc-per-node 2 THIS_FILE.py

prints REPRODUCED and exits 1 while the failure is there, else exits 0.
"""

from __future__ import annotations
import torch
import enum
from dataclasses import dataclass, field
from torch import nn
import functools
import torch.nn.functional as F

class LeafKind(str, enum.Enum):
    LINEAR = 'linear'

@dataclass()
class Leaf:
    kind: object

@dataclass()
class Block:
    children: object

@dataclass()
class ModuleTree:
    width: object
    root: object

def is_ancestor(ancestor, path):
    pass

@dataclass()
class ShardSpec:
    path: object

    @property
    def paths(self):
        return (self.path, *())

@dataclass()
class Composition:
    shards: object = ()

    def steps(self):
        items = [('checkpoint', '')] + []
        items += [('fully_shard', spec.path) for spec in self.shards]

        def key(item):
            api, path = item
            depth = min((q.count('.') + (q != '') for q in self._spec_paths(api, path)))
            return (-depth,)
        return sorted(items, key=key)

    def _spec_paths(self, api, path):
        return (path,)

class KnobState:

    def __init__(self, model, comp, tree, roots):
        self.roots = roots

    def before_microbatch(self, first, last):
        root = next(iter(self.roots))
        root.set_reshard_after_backward(last)

class TreeBlock(nn.Module):

    def __init__(self, children, residual, width, scale, buffer):
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)

    def forward(self, x):
        y = x
        for name, child in self.named_children():
            y = child(y)
        return y

def build_node(node, width):
    if isinstance(node, Leaf):
        module = nn.Linear(width, width)
        return module
    return TreeBlock([build_node(c, width) for c in node.children], False, width, False, False)

def _save_matmuls_policy(ctx, op, *args, **kwargs):
    pass

@dataclass
class Composed:
    model: object
    fsdp_roots: object = field()

def attempt(rank, world_size):
    ctx_device = torch.device('cpu')
    import re
    import traceback
    try:
        comp = Composition(shards=(ShardSpec(path=''), ShardSpec(path='0')))
        tree = ModuleTree(width=4, root=Block(children=()))
        dtype = torch.float32
        build_model_out = build_node(Block(children=(Leaf(kind=LeafKind.LINEAR), Leaf(kind=LeafKind.LINEAR))), 4)
        model_ = build_model_out.to(dtype)
        from torch.distributed._composable import checkpoint
        kwargs = {}
        from torch.utils.checkpoint import create_selective_checkpoint_contexts
        kwargs['context_fn'] = functools.partial(create_selective_checkpoint_contexts, _save_matmuls_policy)
        specs = {s_.path: s_ for s_ in (ShardSpec(path=''), ShardSpec(path='0'))}
        for api, path_ in comp.steps():
            if api == 'checkpoint':
                checkpoint(model_.get_submodule(path_), **kwargs)
            else:
                spec = specs[path_]
                from torch.distributed.fsdp import fully_shard
                kwargs_ = {}
                modules = [model_.get_submodule(p_) for p_ in spec.paths]
                fully_shard(modules if () else modules[0], **kwargs_)
        sharded = [p for spec in (ShardSpec(path=''), ShardSpec(path='0')) for p in spec.paths]
        tops = [p__ for p__ in sharded if not any((is_ancestor(q, p__) for q in sharded))]
        compose_out = Composed(model=model_, fsdp_roots=[model_.get_submodule(p__) for p__ in tops])
        compose_out.knobs = KnobState(model_, comp, tree, [model_.get_submodule(p__) for p__ in tops])
        model, composed_ = (model_, compose_out)
        model__ = composed_.model
        lo = rank // 1 * 2
        out_ = []
        step_ = []
        for _ in range(2):
            x_ = torch.randn(world_size * 2, 4)
            y_ = torch.randn(world_size * 2, 4)
            step_.append((x_[lo:lo + 2].to(ctx_device), y_[lo:lo + 2].to(ctx_device)))
        out_.append(step_)
        s, step = next(iter(enumerate(out_)))
        for i, (x, y) in enumerate(step):
            last = i == len(step) - 1
            composed_.knobs.before_microbatch(first=s == 0 and i == 0, last=last)
            out = model__(x)
            loss = F.mse_loss(out.to(y.dtype), y)
            loss.backward()
    except BaseException as e:
        frames = re.findall('File "([^"]+)", line \\d+, in (\\S+)', traceback.format_exc())
        path, fn = [(p, f) for p, f in frames if '/torch/' in p and (not f.endswith('comp>'))][-1]
        found = f"{type(e).__module__}.{type(e).__qualname__}@torch/{path.rpartition('/torch/')[2]}:{fn}"
        if found in ['builtins.RuntimeError@torch/utils/checkpoint.py:__torch_dispatch__']:
            return f'REPRODUCED exception:parity:builtins.RuntimeError@torch/utils/checkpoint.py:__torch_dispatch__: rank {rank} raised {found}: {e}'
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
