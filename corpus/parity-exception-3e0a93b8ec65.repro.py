#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=68bdf338ca95ed25 sources=845e968d7c09e2fe seconds=65.9
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

@dataclass
class RankContext:
    rank: object
    world_size: object
    device: object
    backend: object

    def mesh(self, shape, names):
        pass

class LeafKind(str, enum.Enum):
    LINEAR = 'linear'
    LAYER_NORM = 'layer_norm'
    GELU = 'gelu'
    DROPOUT = 'dropout'

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
    residual: object = False
    scale: object = False

@dataclass(frozen=True)
class ModuleTree:
    width: object
    root: object

    def paths(self):
        pass

def is_ancestor(ancestor, path):
    pass

@dataclass(frozen=True)
class ShardSpec:
    path: object
    reshard_after_forward: object = True

    @property
    def paths(self):
        return (self.path, *())

@dataclass(frozen=True)
class Knobs:
    reshard_after_backward_last: object = False

class ContextFn(str, enum.Enum):
    NONE = 'none'
    SAVE_MATMULS = 'save_matmuls'
    SAVE_MATMULS_LIST = 'save_matmuls_list'

@dataclass(frozen=True)
class CheckpointOptions:
    context_fn: object = ContextFn.NONE

@dataclass(frozen=True)
class Composition:
    shards: object = ()
    checkpoints: object = ()
    mesh: object = ()
    knobs: object = field(default_factory=Knobs)
    checkpoint_options: object = field(default_factory=CheckpointOptions)

    def reshard_after_forward(self, spec):
        pass

    @property
    def sharded_paths(self):
        return [p for spec in self.shards for p in spec.paths]

    def steps(self):
        order = {'checkpoint': 0, 'fully_shard': 1, 'replicate': 2}
        items = [('checkpoint', p) for p in ('',)] + [('replicate', p) for p in ()]
        items += [('fully_shard', spec.path) for spec in self.shards]

        def key(item):
            api, path = item
            depth = min((q.count('.') + (q != '') for q in self._spec_paths(api, path)))
            return (-depth, order[api], path)
        return sorted(items, key=key)

    def _spec_paths(self, api, path):
        return next((s.paths for s in self.shards if s.path == path))
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

class KnobState:

    def __init__(self, model, comp, tree, roots):
        self.knobs: Knobs = comp.knobs
        self.roots = roots
        self.problems: list[str] = []

    def before_microbatch(self, first, last):
        root = next(iter(self.roots))
        root.set_reshard_after_backward(last)
        root.set_is_last_backward(last)

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
        y = x
        for name, child in self.named_children():
            y = child(y)
        return y

def build_node(node, width):
    if isinstance(node, Leaf):
        module = nn.Linear(width, width, bias=True)
        return module
    return TreeBlock([build_node(c, width) for c in node.children], False, width, False, False)

def build_model(tree, device):
    return build_node(tree.root, 4)

def _save_matmuls_policy(ctx, op, *args, **kwargs):
    pass
TORCH_DTYPES = {Dtype.FLOAT32: torch.float32, Dtype.FLOAT64: torch.float64, Dtype.BFLOAT16: torch.bfloat16, Dtype.FLOAT16: torch.float16}

@dataclass
class Composed:
    model: object
    fsdp_roots: object = field(default_factory=list)
    knobs: object = None

class _Contracts:

    def __init__(self, model, comp):
        self.model = model
        self.comp = comp
        self.leaf_dtypes: dict[str, str] = {}
        self.output_dtypes: dict[str, str] = {}
        self.handles: list[Any] = []
        path = next(iter(comp.sharded_paths))
        mod = model.get_submodule(path)
        self.handles.append(mod.register_forward_hook(self._on_output(path)))
        name, mod = next(iter(model.named_modules()))
        self.handles.append(mod.register_forward_pre_hook(self._on_leaf(name)))

    def _on_output(self, path):

        def hook(module, args, output):
            pass
        return hook

    def _on_leaf(self, name):

        def hook(module, args):
            pass
        return hook

    def after_forward(self, skipped):
        state = {}
        spec = next(iter(self.comp.shards))
        flags = []
        state[spec.path] = flags
        return {'sharded_after_forward': state, 'leaf_dtypes': self.leaf_dtypes, 'output_dtypes': self.output_dtypes}

class _null:

    def __enter__(self):
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
    kwargs = {}
    from torch.utils.checkpoint import create_selective_checkpoint_contexts
    kwargs['context_fn'] = functools.partial(create_selective_checkpoint_contexts, _save_matmuls_policy)
    pass
    specs = {s_.path: s_ for s_ in comp.shards}
    for api, path in comp.steps():
        if api == 'checkpoint':
            checkpoint(model_.get_submodule(path), **kwargs)
        else:
            spec = specs[path]
            from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
            kwargs_ = {'mesh': None, 'reshard_after_forward': True}
            modules = [model_.get_submodule(p_) for p_ in spec.paths]
            fully_shard(modules if () else modules[0], **kwargs_)
    sharded = comp.sharded_paths
    tops = [p for p in sharded if not any((is_ancestor(q, p) for q in sharded))]
    compose_out = Composed(model=model_, fsdp_roots=[model_.get_submodule(p) for p in tops])
    compose_out.knobs = KnobState(model_, comp, tree, compose_out.fsdp_roots)
    model, composed_ = (model_, compose_out)
    contracts = _Contracts(model, comp)
    obs = {}
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
    step_losses = []
    for i, (x, y) in enumerate(step):
        skipped = training.skipped_at(s, i)
        last = i == len(step) - 1
        ctx_mgr = _null()
        composed_.knobs.before_microbatch(first=s == 0 and i == 0, last=last)
        out = model__(x)
        if contracts is not None and comp is not None:
            obs['contracts'] = contracts.after_forward(skipped)
        loss = F.mse_loss(out.to(y.dtype), y)
        loss.backward()
        step_losses.append(loss.item())

def attempt(rank, world_size):
    import torch.distributed as dist
    case = Case(property='parity', world_size=2, seed=0, body=ParityBody(tree=ModuleTree(width=4, root=Block(children=(Leaf(kind=LeafKind.LINEAR), Leaf(kind=LeafKind.LINEAR)))), composition=Composition(shards=(ShardSpec(path=''), ShardSpec(path='0')), checkpoints=('',), knobs=Knobs(reshard_after_backward_last=True), checkpoint_options=CheckpointOptions(context_fn=ContextFn.SAVE_MATMULS)), training=Training(lr=0.05, grad_accum=2)))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import re
    import traceback
    try:
        run_parity(case, ParityBody(tree=ModuleTree(width=4, root=Block(children=(Leaf(kind=LeafKind.LINEAR), Leaf(kind=LeafKind.LINEAR)))), composition=Composition(shards=(ShardSpec(path=''), ShardSpec(path='0')), checkpoints=('',), knobs=Knobs(reshard_after_backward_last=True), checkpoint_options=CheckpointOptions(context_fn=ContextFn.SAVE_MATMULS)), training=Training(lr=0.05, grad_accum=2)), ctx)
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
