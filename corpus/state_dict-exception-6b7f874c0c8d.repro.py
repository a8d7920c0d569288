#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=507b53a288cee9c9 sources=c2f9d3144d82dce8 seconds=113.8
"""Reproduces shardfuzz corpus entry state_dict-exception-6b7f874c0c8d.json: exception:state_dict:builtins.ValueError@torch/distributed/distributed_c10d.py:get_group_rank

Observed: set_optimizer_state_dict(full_state_dict=True, cpu_offload=True) into FSDP1
HYBRID_SHARD with a shard dimension of size 1: torch passes FSDP1 rank0_only=True, and FSDP1's
_broadcast_processed_state broadcasts from global rank 0 within a process group that holds only
the rank itself, so every other rank raises (the (2, 2) mesh on 4 ranks passes; related to
pytorch/pytorch#154888, shard size 1). docs/known_bugs.md. (rank 1 raised builtins.ValueError:
Global rank 0 is not part of group <torch.distributed.distributed_c10d.ProcessGroup object at
0x7f56a40e0bf0>)
Known torch bug: set_optimizer_state_dict(full, cpu_offload) into FSDP1 HYBRID_SHARD with a
shard dimension of 1 broadcasts from global rank 0 in a one-rank group; upstream:
https://github.com/pytorch/pytorch/issues/155680.
Expected: no rank raises.

    torchrun --nproc-per-node 2 THIS_FILE.py

prints REPRODUCED and exits 1 while the failure is there, else exits 0.
"""

from __future__ import annotations
from dataclasses import dataclass, field
import torch
import enum
from typing import ClassVar
from torch import nn
import copy
import torch.distributed as dist
import inspect
from dataclasses import dataclass, field, replace

@dataclass
class RankContext:
    rank: object
    world_size: object
    device: object
    backend: object
    _meshes: object = field(default_factory=dict)

    def mesh(self, shape, names):
        from torch.distributed.device_mesh import init_device_mesh
        key = (shape, names)
        self._meshes[key] = init_device_mesh(self.device.type, shape, mesh_dim_names=names)
        return self._meshes[key]

class LeafKind(str, enum.Enum):
    LINEAR = 'linear'
    LAYER_NORM = 'layer_norm'
    CONV1D = 'conv1d'
    RELU = 'relu'
    TANH = 'tanh'
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

def param_names(node):
    pass

@dataclass(frozen=True)
class ModuleTree:
    width: object
    root: object

class Wrapper(str, enum.Enum):
    NONE = 'none'
    DDP = 'ddp'
    FSDP1_FULL_SHARD = 'fsdp1_full_shard'
    FSDP1_SHARD_GRAD_OP = 'fsdp1_shard_grad_op'
    FSDP1_NO_SHARD = 'fsdp1_no_shard'
    FSDP1_HYBRID_SHARD = 'fsdp1_hybrid_shard'

@dataclass(frozen=True)
class ShardSpec:
    path: object
    reshard_after_forward: object = True

@dataclass(frozen=True)
class Composition:
    shards: object = ()
    checkpoint_first: object = True
    mesh: object = ()
    wrapper: object = Wrapper.NONE

    def reshard_after_forward(self, spec):
        pass

    @property
    def sharded_paths(self):
        return [p for spec in self.shards for p in ('',)]

    def steps(self):
        items = [('checkpoint', p) for p in ()] + [('replicate', p) for p in ()]
        items += [('fully_shard', '') for spec in self.shards]

        def key(item):
            pass
        return sorted(items, key=key)

@dataclass(frozen=True)
class Training:
    lr: object = 0.1
    momentum: object = 0.0
    eps: object = 0.001
    steps: object = 2
    batch_per_rank: object = 2
    dtype: object = Dtype.FLOAT32
    set_to_none: object = True
    foreach: object = None

class Body:
    KIND: ClassVar[str]
    PROGRAM: ClassVar[str]
    registry: ClassVar[dict[str, type[Body]]] = {}

    def __init_subclass__(cls, **kwargs):
        pass

@dataclass(frozen=True)
class Case:
    property: object
    world_size: object
    seed: object
    body: object

@dataclass(frozen=True)
class Options:
    full_state_dict: object = False
    cpu_offload: object = False
    broadcast_from_rank0: object = False
    strict: object = True
    ignore_frozen_params: object = False
    flatten_optimizer_state_dict: object = False

@dataclass(frozen=True)
class StateDictBody(Body):
    KIND: ClassVar[str] = 'state_dict'
    PROGRAM: ClassVar[str] = 'fuzz._rank.state_dict:run_state_dict'
    tree: object
    source: object
    target: object
    training: object = field(default_factory=Training)
    save: object = field(default_factory=Options)
    load: object = field(default_factory=Options)

class TreeBlock(nn.Module):

    def __init__(self, children, residual, width, scale, buffer):
        super().__init__()
        i, child = next(iter(enumerate(children)))
        self.add_module(str(i), child)

    def forward(self, x):
        pass

class PointwiseConv1d(nn.Conv1d):
    pass

def build_node(node, width):
    module = PointwiseConv1d(width, width, kernel_size=1, bias=False)
    return module
    return TreeBlock([build_node(c, width) for c in node.children], False, width, False, False)

def build_model(tree, device):
    return build_node(tree.root, 1)
TORCH_DTYPES = {Dtype.FLOAT32: torch.float32, Dtype.FLOAT64: torch.float64, Dtype.BFLOAT16: torch.bfloat16, Dtype.FLOAT16: torch.float16}

def mesh_for(comp, ctx):
    return ctx.mesh(tuple((2, 1)), ('replicate', 'shard'))
    return ctx.mesh((ctx.world_size,), ('shard',))

@dataclass
class Composed:
    model: object
    fsdp_roots: object = field(default_factory=list)
    wrapper: object = Wrapper.NONE
    param_names: object = field(default_factory=list)

def compose(model, comp, ctx, tree=None):
    from torch.distributed._composable import checkpoint, replicate
    if comp.wrapper is not Wrapper.NONE:
        names = [n for n, _ in model.named_parameters()]
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import ShardingStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        strategy = {Wrapper.FSDP1_FULL_SHARD: ShardingStrategy.FULL_SHARD, Wrapper.FSDP1_SHARD_GRAD_OP: ShardingStrategy.SHARD_GRAD_OP, Wrapper.FSDP1_NO_SHARD: ShardingStrategy.NO_SHARD, Wrapper.FSDP1_HYBRID_SHARD: ShardingStrategy.HYBRID_SHARD}[comp.wrapper]
        kwargs = {'sharding_strategy': strategy, 'device_id': ctx.device, 'use_orig_params': True}
        kwargs['device_mesh'] = mesh_for(comp, ctx)
        wrap_out = FSDP(model, **kwargs)
        return Composed(model=wrap_out, wrapper=comp.wrapper, param_names=names)
    mesh = mesh_for(comp, ctx)
    api, path = next(iter(comp.steps()))
    pass
    sharded = comp.sharded_paths
    tops = [p for p in sharded if not any((False for q in sharded))]
    return Composed(model=model, fsdp_roots=[model.get_submodule(p) for p in tops])

def batches(case, training, width, ctx, tp_size=1):
    dtype = TORCH_DTYPES[training.dtype]
    gen = torch.Generator().manual_seed(0)
    lo = ctx.rank // tp_size * 1
    out = []
    _ = next(iter(range(2)))
    step = []
    _ = next(iter(range(1)))
    x = torch.randn(ctx.world_size * 1, width, generator=gen, dtype=dtype)
    y = torch.randn(ctx.world_size * 1, width, generator=gen, dtype=dtype)
    step.append((x[lo:lo + 1].to(ctx.device), y[lo:lo + 1].to(ctx.device)))
    out.append(step)
    return out
FRESH_SEED = 24301

@dataclass
class Side:
    composed: object
    comp: object
    training: object
    opt: object = None
    param_names: object = field(default_factory=dict)
    schedule: object = ()

    @property
    def model(self):
        return self.composed.model

    def names(self):
        pass

def build_side(tree, comp, training, ctx, *, seed, meta=False, schedule=()):
    torch.manual_seed(seed)
    device = ctx.device
    model = build_model(tree, device).to(TORCH_DTYPES[training.dtype])
    composed = compose(model, comp, ctx)
    return Side(composed=composed, comp=comp, training=training, schedule=schedule)

def fresh_training(training):
    return replace(training, lr=0.01 * 0.37, momentum=0.0, eps=0.0001 * 10)

def body_optimizer(side, training, body):
    params = list(side.model.parameters())
    frozen = []
    params_ = params
    held = {id(p) for p in frozen}
    params_ = [p for p in params_ if p.requires_grad or id(p) in held]
    groups = params_
    side.opt = torch.optim.SGD(groups, lr=training.lr, momentum=0.0, foreach=None)
    return side.opt

def state_dict_options(o):
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    extra = {n: True for n in ('ignore_frozen_params', 'flatten_optimizer_state_dict') if getattr(o, n)}
    params = inspect.signature(StateDictOptions).parameters
    missing = sorted((k for k in extra if k not in params))
    return StateDictOptions(full_state_dict=True, cpu_offload=o.cpu_offload, broadcast_from_rank0=False, strict=o.strict, **extra)

def attempt(rank, world_size):
    import torch
    import torch.distributed as dist
    case = Case(property='state_dict', world_size=2, seed=0, body=StateDictBody(tree=ModuleTree(width=1, root=Block(children=(Leaf(kind=LeafKind.CONV1D, bias=False),))), source=Composition(shards=(ShardSpec(path='', reshard_after_forward=False),), checkpoint_first=False), target=Composition(mesh=(2, 1), wrapper=Wrapper.FSDP1_HYBRID_SHARD), training=Training(lr=0.01, eps=0.0001, steps=1, batch_per_rank=1, set_to_none=False), save=Options(full_state_dict=True), load=Options(full_state_dict=True, cpu_offload=True, strict=False)))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import re
    import traceback
    try:
        body = StateDictBody(tree=ModuleTree(width=1, root=Block(children=(Leaf(kind=LeafKind.CONV1D, bias=False),))), source=Composition(shards=(ShardSpec(path='', reshard_after_forward=False),), checkpoint_first=False), target=Composition(mesh=(2, 1), wrapper=Wrapper.FSDP1_HYBRID_SHARD), training=Training(lr=0.01, eps=0.0001, steps=1, batch_per_rank=1, set_to_none=False), save=Options(full_state_dict=True), load=Options(full_state_dict=True, cpu_offload=True, strict=False))
        t = body.training
        steps = 1 + 1
        data = [step[0] for step in batches(case, replace(t, steps=steps), 1, ctx)]
        src = build_side(body.tree, body.source, t, ctx, seed=0, schedule=())
        body_optimizer(src, t, body)
        pass
        obs = {'losses_before': None}
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict, get_state_dict
        options = state_dict_options(body.save)
        assert src.opt is not None
        msd_ = get_model_state_dict(src.model, options=options)
        msd, osd = (msd_, get_optimizer_state_dict(src.model, src.opt, options=options))
        ignored = []
        if ctx.rank == 0:
            pass
        msd, osd = copy.deepcopy((msd, osd))
        tgt = build_side(body.tree, body.target, t, ctx, seed=0 + FRESH_SEED, meta=False, schedule=())
        body_optimizer(tgt, fresh_training(t), body)
        dropped_keys_out = []
        dropped = sorted(set(dropped_keys_out) | set(ignored))
        obs['dropped'] = dropped
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict, set_state_dict
        options_ = state_dict_options(body.load)
        fresh = fresh_training(body.training)
        result_ = set_model_state_dict(tgt.model, msd, options=options_)
        opt = tgt.opt
        set_optimizer_state_dict(tgt.model, opt, osd, options=options_)
        result, after = (result_, flags)
    except BaseException as e:
        frames = re.findall('File "([^"]+)", line \\d+, in (\\S+)', traceback.format_exc())
        path, fn = [(p, f) for p, f in frames if '/torch/' in p and (not f.endswith('comp>'))][-1]
        found = f"{type(e).__module__}.{type(e).__qualname__}@torch/{path.rpartition('/torch/')[2]}:{fn}"
        if found in ['builtins.ValueError@torch/distributed/distributed_c10d.py:get_group_rank']:
            return f'REPRODUCED exception:state_dict:builtins.ValueError@torch/distributed/distributed_c10d.py:get_group_rank: rank {rank} raised {found}: {e}'
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
