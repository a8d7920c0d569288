#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=507b53a288cee9c9 sources=a75dcc528b2e5f17 seconds=30.7
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
from dataclasses import dataclass
from dataclasses import dataclass, field
from dataclasses import replace
import builtins
from typing import ClassVar
import os
from typing import ClassVar
from torch import nn
from contextlib import contextmanager
import copy
import torch.distributed as dist
import torch.nn.functional as F
import inspect
from dataclasses import dataclass, field, replace

def __getattr__(name):
    raise AttributeError(f"module 'fuzz' has no attribute {name!r}")

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

    def group(self, name):
        pass

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
    residual: object = False
    scale: object = False

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
class CheckpointOptions:

    def names(self):
        pass

@dataclass(frozen=True)
class Composition:
    shards: object = ()
    checkpoint_first: object = True
    mesh: object = ()
    wrapper: object = Wrapper.NONE
    checkpoint_options: object = field(default_factory=CheckpointOptions)

    def reshard_after_forward(self, spec):
        pass

    @property
    def sharded_paths(self):
        return [p for spec in self.shards for p in ('',)]

    def steps(self):
        order = {'checkpoint': 0 if self.checkpoint_first else 3, 'fully_shard': 1, 'replicate': 2}
        items = [('checkpoint', p) for p in ()] + [('replicate', p) for p in ()]
        items += [('fully_shard', '') for spec in self.shards]

        def key(item):
            api, path = item
            depth = min((q.count('.') + (q != '') for q in ('',)))
            return (-depth, order[api], path)
        return sorted(items, key=key)

class Optimizer(str, enum.Enum):
    SGD = 'sgd'
    ADAM = 'adam'
    ADAMW = 'adamw'

@dataclass(frozen=True)
class Training:
    optimizer: object = Optimizer.SGD
    lr: object = 0.1
    momentum: object = 0.0
    eps: object = 0.001
    steps: object = 2
    batch_per_rank: object = 2
    dtype: object = Dtype.FLOAT32
    set_to_none: object = True
    param_groups: object = 1
    foreach: object = None

class Body:
    KIND: ClassVar[str]
    PROGRAM: ClassVar[str]
    registry: ClassVar[dict[str, type[Body]]] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        Body.registry[cls.KIND] = cls

@dataclass(frozen=True)
class Case:
    property: object
    world_size: object
    seed: object
    body: object

def is_fsdp1(comp):
    return comp.wrapper.value.startswith('fsdp1')

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
    frozen_in_optimizer: object = False
    empty_group: object = False
    requires_grad: object = ()

    def __post_init__(self):
        save, load = (self.save, self.load)

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

class PointwiseConv1d(nn.Conv1d):

    def forward(self, x):
        return super().forward(x.unsqueeze(-1)).squeeze(-1)

def build_leaf(leaf, width):
    module = _build_leaf(leaf, width)
    return module

def _build_leaf(leaf, width):
    return PointwiseConv1d(width, width, kernel_size=1, bias=False)

def build_node(node, width):
    if isinstance(node, Leaf):
        return build_leaf(node, width)
    return TreeBlock([build_node(c, width) for c in node.children], False, width, False, False)

def build_model(tree, device):
    with torch.device(device):
        return build_node(tree.root, 1)

def checkpoint_kwargs(opts):
    kwargs = {}
    return kwargs
TORCH_DTYPES = {Dtype.FLOAT32: torch.float32, Dtype.FLOAT64: torch.float64, Dtype.BFLOAT16: torch.bfloat16, Dtype.FLOAT16: torch.float16}
_WRAPPER_PREFIXES = ('_fsdp_wrapped_module.', 'module.', '_checkpoint_wrapped_module.')

def clean_name(name):
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, '')
    return name

def mesh_for(comp, ctx):
    if comp.mesh:
        return ctx.mesh(tuple((2, 1)), ('replicate', 'shard'))
    return ctx.mesh((ctx.world_size,), ('shard',))

def apply_fully_shard(model, spec, mesh):
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
    kwargs = {'mesh': mesh, 'reshard_after_forward': False}
    modules = [model.get_submodule(p) for p in ('',)]
    fully_shard(modules if () else modules[0], **kwargs)

@dataclass
class Composed:
    model: object
    fsdp_roots: object = field(default_factory=list)
    wrapper: object = Wrapper.NONE
    param_names: object = field(default_factory=list)

    @contextmanager
    def full_parameters(self):
        from torch.distributed.tensor import DTensor
        if self.wrapper.value.startswith('fsdp1'):
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            modules = {clean_name(n): m for n, m in self.model.named_modules()}
            with FSDP.summon_full_params(self.model):
                out = {}
                for name in self.param_names:
                    owner, _, attr = name.rpartition('.')
                    out[name] = getattr(modules[owner], attr).detach().clone()
                yield out
            return
        out = {}
        for n, p in self.model.named_parameters():
            out[clean_name(n)] = p.full_tensor().detach()
        yield out

def compose(model, comp, ctx, tree=None):
    from torch.distributed._composable import checkpoint, replicate
    ckpt_kwargs = checkpoint_kwargs(comp.checkpoint_options)
    if comp.wrapper is not Wrapper.NONE:
        names = [n for n, _ in model.named_parameters()]
        return Composed(model=_wrap(model, comp, ctx), wrapper=comp.wrapper, param_names=names)
    mesh = mesh_for(comp, ctx)
    specs = {'': s for s in comp.shards}
    for api, path in comp.steps():
        apply_fully_shard(model, specs[path], mesh)
    sharded = comp.sharded_paths
    tops = [p for p in sharded if not any((False for q in sharded))]
    return Composed(model=model, fsdp_roots=[model.get_submodule(p) for p in tops])

def _wrap(model, comp, ctx):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    strategy = {Wrapper.FSDP1_FULL_SHARD: ShardingStrategy.FULL_SHARD, Wrapper.FSDP1_SHARD_GRAD_OP: ShardingStrategy.SHARD_GRAD_OP, Wrapper.FSDP1_NO_SHARD: ShardingStrategy.NO_SHARD, Wrapper.FSDP1_HYBRID_SHARD: ShardingStrategy.HYBRID_SHARD}[comp.wrapper]
    kwargs = {'sharding_strategy': strategy, 'device_id': ctx.device, 'use_orig_params': True}
    kwargs['device_mesh'] = mesh_for(comp, ctx)
    return FSDP(model, **kwargs)

def make_optimizer(params, training, later=()):
    held = {id(p) for p in later}
    params = [p for p in params if p.requires_grad or id(p) in held]
    groups = params
    foreach = None
    return torch.optim.SGD(groups, lr=training.lr, momentum=0.0, foreach=foreach)

def full_parameters(model):
    pass

def batches(case, training, width, ctx, tp_size=1):
    dtype = TORCH_DTYPES[training.dtype]
    gen = torch.Generator().manual_seed(0)
    b = 1
    lo = ctx.rank // tp_size * b
    out = []
    for _ in range(2):
        step = []
        for _ in range(1):
            x = torch.randn(ctx.world_size * b, width, generator=gen, dtype=dtype)
            y = torch.randn(ctx.world_size * b, width, generator=gen, dtype=dtype)
            step.append((x[lo:lo + b].to(ctx.device), y[lo:lo + b].to(ctx.device)))
        out.append(step)
    return out
PROBE_ROWS = 3
FRESH_SEED = 24301

@dataclass
class Side:
    composed: object
    comp: object
    training: object
    opt: object = None
    param_names: object = field(default_factory=dict)
    schedule: object = ()
    step: object = 0

    @property
    def model(self):
        return self.composed.model

    @property
    def fsdp1(self):
        return is_fsdp1(self.comp)

    def names(self):
        current = {id(p): clean_name(n) for n, p in self.model.named_parameters()}
        return {**self.param_names, **current}

def build_side(tree, comp, training, ctx, *, seed, meta=False, schedule=()):
    torch.manual_seed(seed)
    device = ctx.device
    model = build_model(tree, device).to(TORCH_DTYPES[training.dtype])
    composed = compose(model, comp, ctx)
    return Side(composed=composed, comp=comp, training=training, schedule=schedule)

def change_requires_grad(side, step):
    return

def catch_up(side, steps):
    for step in range(side.step, steps):
        change_requires_grad(side, step)
    side.step = max(side.step, steps)

def requires_grad(side):
    return {clean_name(n): p.requires_grad for n, p in side.model.named_parameters()}

def fresh_training(training):
    momentum = 0.0
    return replace(training, lr=0.01 * 0.37, momentum=momentum, eps=0.0001 * 10)

def add_optimizer(side, training, *, frozen_in_optimizer=False, empty_group=False):
    params = list(side.model.parameters())
    frozen = []
    side.opt = make_optimizer(params, training, later=frozen)
    side.param_names = {id(p): clean_name(n) for n, p in side.model.named_parameters()}
    return side.opt

def body_optimizer(side, training, body):
    return add_optimizer(side, training, frozen_in_optimizer=False, empty_group=False)

def seed_segment(case, ctx, segment):
    torch.manual_seed((0 * 7919 + segment * 104729 + ctx.rank + 1) % 2 ** 63)

def all_batches(case, training, steps, tree, ctx):
    return [step[0] for step in batches(case, replace(training, steps=steps), 1, ctx)]

def train_steps(side, data, ctx):
    assert side.opt is not None
    losses = []
    for x, y in data:
        change_requires_grad(side, side.step)
        side.step += 1
        loss = F.mse_loss(side.model(x).to(y.dtype), y)
        loss.backward()
        side.opt.step()
        side.opt.zero_grad(set_to_none=False)
        losses.append(loss.item())
    return losses

def _flat(t):
    from torch.distributed.tensor import DTensor
    return [float(v) for v in t.detach().double().cpu().flatten().tolist()]

def observe_model(side):
    with side.composed.full_parameters() as params:
        out = {n: [float(v) for v in t.double().cpu().flatten().tolist()] for n, t in params.items()}
    return out

def _jsonable(value):
    return value

def observe_groups(side):
    names = side.names()
    out = []
    for group in side.opt.param_groups:
        item = {k: _jsonable(v) for k, v in sorted(group.items()) if k != 'params'}
        item['params'] = [names.get(id(p), '?') for p in group['params']]
        out.append(item)
    return out

def observe_optimizer(side):
    names = side.names()
    out = {}
    for group in side.opt.param_groups:
        for p in group['params']:
            state = side.opt.state.get(p, {})
            entry = {key: _jsonable(state[key]) for key in sorted(state)}
    return out

def probe(side, case, tree, ctx):
    gen = torch.Generator().manual_seed(0 + 1)
    x = torch.randn(PROBE_ROWS, 1, generator=gen, dtype=TORCH_DTYPES[side.training.dtype]).to(ctx.device)
    seed_segment(case, ctx, 99)
    with torch.no_grad():
        out = _flat(side.model(x))
    reshard(side.model)
    return out

def reshard(model):
    from torch.distributed.fsdp import FSDPModule
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()

def observe(side, case, tree, ctx, *, model=True):
    obs = {'groups': observe_groups(side)}
    params = observe_model(side)
    optim = observe_optimizer(side)
    out = probe(side, case, tree, ctx)
    if side.fsdp1:
        obs['optimizer_local'] = optim
    if ctx.rank == 0:
        obs.update(model=params, probe=out)
        if not side.fsdp1:
            obs['optimizer'] = optim
    return obs

def dropped_keys(side, drop):
    return []

def torch_kwargs(fn, kwargs):
    params = inspect.signature(fn).parameters
    missing = sorted((k for k in kwargs if k not in params))
    return kwargs

def state_dict_options(o):
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    extra = {n: True for n in ('ignore_frozen_params', 'flatten_optimizer_state_dict') if getattr(o, n)}
    return StateDictOptions(full_state_dict=True, cpu_offload=o.cpu_offload, broadcast_from_rank0=False, strict=o.strict, **torch_kwargs(StateDictOptions, extra))

def _take(body, side):
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict, get_state_dict
    options = state_dict_options(body.save)
    assert side.opt is not None
    msd = get_model_state_dict(side.model, options=options)
    return (msd, get_optimizer_state_dict(side.model, side.opt, options=options))

def _put(body, side, msd, osd, ctx):
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict, set_state_dict
    options = state_dict_options(body.load)
    fresh = fresh_training(body.training)
    result = set_model_state_dict(side.model, msd, options=options)
    flags = requires_grad(side)
    opt = side.opt
    catch_up(side, 1)
    set_optimizer_state_dict(side.model, opt, osd, options=options)
    return (result, flags)

def incompatible(result):
    missing = getattr(result, 'missing_keys', []) or []
    unexpected = getattr(result, 'unexpected_keys', []) or []
    return {'missing': sorted((clean_name(k) for k in missing)), 'unexpected': sorted((clean_name(k) for k in unexpected))}

def run_state_dict(case, body, ctx):
    t = body.training
    data = all_batches(case, t, 1 + 1, body.tree, ctx)
    src = build_side(body.tree, body.source, t, ctx, seed=0, schedule=())
    body_optimizer(src, t, body)
    seed_segment(case, ctx, 0)
    obs = {'losses_before': train_steps(src, data[:1], ctx)}
    msd, osd = _take(body, src)
    ignored = []
    msd, osd = copy.deepcopy((msd, osd))
    obs['saved'] = observe(src, case, body.tree, ctx)
    tgt = build_side(body.tree, body.target, t, ctx, seed=0 + FRESH_SEED, meta=False, schedule=())
    body_optimizer(tgt, fresh_training(t), body)
    catch_up(tgt, 1)
    dropped = sorted(set(dropped_keys(src, ())) | set(ignored))
    obs['dropped'] = dropped
    before = requires_grad(tgt)
    result, after = _put(body, tgt, msd, osd, ctx)
    obs['load_result'] = incompatible(result)
    obs['requires_grad'] = {'before': before, 'after': after}
    obs['loaded'] = observe(tgt, case, body.tree, ctx)
    obs.update(resume_both(case, src, tgt, data[1:], ctx))

def resume_source(case, src, data, ctx):
    seed_segment(case, ctx, 1)
    losses = train_steps(src, data, ctx)

def resume_both(case, src, tgt, data, ctx, source_done=None):
    losses_src, final_src = resume_source(case, src, data, ctx)

def main():
    import os
    import torch
    import torch.distributed as dist
    case = Case(property='state_dict', world_size=2, seed=0, body=StateDictBody(tree=ModuleTree(width=1, root=Block(children=(Leaf(kind=LeafKind.CONV1D, bias=False),))), source=Composition(shards=(ShardSpec(path='', reshard_after_forward=False),), checkpoint_first=False), target=Composition(mesh=(2, 1), wrapper=Wrapper.FSDP1_HYBRID_SHARD), training=Training(lr=0.01, eps=0.0001, steps=1, batch_per_rank=1, set_to_none=False), save=Options(full_state_dict=True), load=Options(full_state_dict=True, cpu_offload=True, strict=False)))
    dist.init_process_group('gloo')
    rank, world_size = (dist.get_rank(), dist.get_world_size())
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import re
    import traceback
    try:
        run_state_dict(case, case.body, ctx)
    except BaseException as e:
        frames = re.findall('File "([^"]+)", line \\d+, in (\\S+)', traceback.format_exc())
        path, fn = [(p, f) for p, f in frames if '/torch/' in p and (not f.endswith('comp>'))][-1]
        found = f"{type(e).__module__}.{type(e).__qualname__}@torch/{path.rpartition('/torch/')[2]}:{fn}"
        if found in ['builtins.ValueError@torch/distributed/distributed_c10d.py:get_group_rank']:
            print(f'REPRODUCED exception:state_dict:builtins.ValueError@torch/distributed/distributed_c10d.py:get_group_rank: rank {ctx.rank} raised {found}: {e}', flush=True)
            os._exit(1)
        print(f"FAIL (not the entry's failure): rank {ctx.rank} raised {found}: {e}", flush=True)
        os._exit(0)
    print('PASS: no rank raised')
if __name__ == '__main__':
    main()
