#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=88007dd7d6fc16e9 sources=a75dcc528b2e5f17 seconds=23.7
"""Reproduces shardfuzz corpus entry state_dict-exception-b39fcc19147a.json: exception:state_dict:builtins.KeyError@torch/distributed/_state_dict_utils.py:_unflatten_state_dict

Observed: rank 0 raised builtins.KeyError: 'param_groups.0.params.0'
Known torch bug: set_optimizer_state_dict(full_state_dict=True,
flatten_optimizer_state_dict=True) raises KeyError 'param_groups.0.params.0' for any model: the
full-state branch takes the optimizer's local state dict with the flatten option still on, so
the loaded and the local dicts have different keys; upstream: none found.
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
    buffer: object = False

def param_names(node):
    pass

@dataclass(frozen=True)
class ModuleTree:
    width: object
    root: object

@dataclass(frozen=True)
class Composition:

    def steps(self):
        pass

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
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(width)) if scale else None
        if buffer:
            self.register_buffer('shift', 0.1 * torch.randn(width))
        else:
            self.shift = None
        self.skipped: frozenset[str] = frozenset()

    def forward(self, x):
        y = x
        for name, child in self.named_children():
            y = child(y)
        if self.scale is not None:
            y = y * self.scale
        if self.shift is not None:
            y = y + self.shift
        return y

def build_leaf(leaf, width):
    module = _build_leaf(leaf, width)
    return module

def _build_leaf(leaf, width):
    if leaf.kind is LeafKind.LINEAR:
        return nn.Linear(width, width, bias=leaf.bias)
    if leaf.kind is LeafKind.LAYER_NORM:
        return nn.LayerNorm(width, bias=True)
    return nn.Tanh()

def build_node(node, width):
    if isinstance(node, Leaf):
        return build_leaf(node, width)
    return TreeBlock([build_node(c, width) for c in node.children], False, width, node.scale, node.buffer)

def build_model(tree, device):
    with torch.device(device):
        return build_node(tree.root, 4)
TORCH_DTYPES = {Dtype.FLOAT32: torch.float32, Dtype.FLOAT64: torch.float64, Dtype.BFLOAT16: torch.bfloat16, Dtype.FLOAT16: torch.float16}
_WRAPPER_PREFIXES = ('_fsdp_wrapped_module.', 'module.', '_checkpoint_wrapped_module.')

def clean_name(name):
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, '')
    return name

@dataclass
class Composed:
    model: object
    param_names: object = field(default_factory=list)

    @contextmanager
    def full_parameters(self):
        from torch.distributed.tensor import DTensor
        out = {}
        for n, p in self.model.named_parameters():
            out[clean_name(n)] = p.detach()
        yield out

def make_optimizer(params, training, later=()):
    held = {id(p) for p in later}
    params = [p for p in params if p.requires_grad or id(p) in held]
    groups = params
    groups = [{'params': params[0::2]}, {'params': params[1::2], 'lr': training.lr / 2}]
    groups = [g for g in groups if g['params']]
    foreach = None
    return torch.optim.Adam(groups, lr=training.lr, eps=training.eps, foreach=foreach)

def full_parameters(model):
    pass

def batches(case, training, width, ctx, tp_size=1):
    dtype = TORCH_DTYPES[training.dtype]
    gen = torch.Generator().manual_seed(57)
    b = 2
    lo = ctx.rank // tp_size * b
    out = []
    for _ in range(3):
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

    def names(self):
        current = {id(p): clean_name(n) for n, p in self.model.named_parameters()}
        return {**self.param_names, **current}

def build_side(tree, comp, training, ctx, *, seed, meta=False, schedule=()):
    torch.manual_seed(seed)
    device = ctx.device
    model = build_model(tree, device).to(TORCH_DTYPES[training.dtype])
    composed = Composed(model)
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
    return replace(training, lr=0.05 * 0.37, momentum=momentum, eps=0.001 * 10)

def add_optimizer(side, training, *, frozen_in_optimizer=False, empty_group=False):
    params = list(side.model.parameters())
    frozen = []
    side.opt = make_optimizer(params, training, later=frozen)
    side.param_names = {id(p): clean_name(n) for n, p in side.model.named_parameters()}
    return side.opt

def body_optimizer(side, training, body):
    return add_optimizer(side, training, frozen_in_optimizer=False, empty_group=False)

def seed_segment(case, ctx, segment):
    torch.manual_seed((57 * 7919 + segment * 104729 + ctx.rank + 1) % 2 ** 63)

def all_batches(case, training, steps, tree, ctx):
    return [step[0] for step in batches(case, replace(training, steps=steps), 4, ctx)]

def train_steps(side, data, ctx):
    assert side.opt is not None
    losses = []
    for x, y in data:
        change_requires_grad(side, side.step)
        side.step += 1
        loss = F.mse_loss(side.model(x).to(y.dtype), y)
        loss.backward()
        for p in side.model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= ctx.world_size
        side.opt.step()
        side.opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses

def _flat(t):
    from torch.distributed.tensor import DTensor
    return [float(v) for v in t.detach().double().cpu().flatten().tolist()]

def observe_model(side):
    with side.composed.full_parameters() as params:
        out = {n: [float(v) for v in t.double().cpu().flatten().tolist()] for n, t in params.items()}
    for n, b in side.model.named_buffers():
        out[clean_name(n)] = _flat(b)
    return out

def _jsonable(value):
    if isinstance(value, torch.Tensor):
        return _flat(value)
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
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
            if entry:
                out[names.get(id(p), '?')] = entry
    return out

def probe(side, case, tree, ctx):
    gen = torch.Generator().manual_seed(57 + 1)
    x = torch.randn(PROBE_ROWS, 4, generator=gen, dtype=TORCH_DTYPES[side.training.dtype]).to(ctx.device)
    seed_segment(case, ctx, 99)
    with torch.no_grad():
        out = _flat(side.model(x))
    reshard(side.model)
    return out

def reshard(model):
    from torch.distributed.fsdp import FSDPModule
    for module in model.modules():
        pass

def observe(side, case, tree, ctx, *, model=True):
    obs = {'groups': observe_groups(side)}
    params = observe_model(side)
    optim = observe_optimizer(side)
    out = probe(side, case, tree, ctx)
    if ctx.rank == 0:
        obs.update(model=params, probe=out)
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
    return StateDictOptions(full_state_dict=True, cpu_offload=False, broadcast_from_rank0=False, strict=True, **torch_kwargs(StateDictOptions, extra))

def observe_flat_optimizer(body, side, flat):
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
    assert side.opt is not None
    nested = get_optimizer_state_dict(side.model, side.opt, options=state_dict_options(replace(body.save, flatten_optimizer_state_dict=False)))
    obs = {'flat': {k: _jsonable(flat[k]) for k in sorted(flat)}, 'nested': {'state': {fqn: {k: _jsonable(v) for k, v in sorted(st.items())} for fqn, st in sorted(nested.get('state', {}).items())}, 'param_groups': [{k: _jsonable(v) for k, v in sorted(g.items())} for g in nested.get('param_groups', [])]}}
    return (obs, nested)

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
    catch_up(side, 2)
    set_optimizer_state_dict(side.model, opt, osd, options=options)

def run_state_dict(case, body, ctx):
    t = body.training
    data = all_batches(case, t, 2 + 1, body.tree, ctx)
    src = build_side(body.tree, body.source, t, ctx, seed=57, schedule=())
    body_optimizer(src, t, body)
    seed_segment(case, ctx, 0)
    obs = {'losses_before': train_steps(src, data[:2], ctx)}
    msd, osd = _take(body, src)
    ignored = []
    flat_obs, nested_osd = observe_flat_optimizer(body, src, osd)
    if ctx.rank == 0:
        obs['flat_optimizer'] = flat_obs
    msd, osd = copy.deepcopy((msd, osd))
    obs['saved'] = observe(src, case, body.tree, ctx)
    tgt = build_side(body.tree, body.target, t, ctx, seed=57 + FRESH_SEED, meta=False, schedule=())
    body_optimizer(tgt, fresh_training(t), body)
    catch_up(tgt, 2)
    dropped = sorted(set(dropped_keys(src, ())) | set(ignored))
    obs['dropped'] = dropped
    before = requires_grad(tgt)
    result, after = _put(body, tgt, msd, osd, ctx)

def main():
    import os
    import torch
    import torch.distributed as dist
    case = Case(property='state_dict', world_size=2, seed=57, body=StateDictBody(tree=ModuleTree(width=4, root=Block(children=(Leaf(kind=LeafKind.LINEAR), Block(children=(Leaf(kind=LeafKind.LINEAR), Leaf(kind=LeafKind.TANH), Leaf(kind=LeafKind.LAYER_NORM)), scale=True), Leaf(kind=LeafKind.LINEAR, bias=False)), buffer=True)), source=Composition(), target=Composition(), training=Training(optimizer=Optimizer.ADAM, lr=0.05, dtype=Dtype.FLOAT64, param_groups=2), save=Options(full_state_dict=True, flatten_optimizer_state_dict=True), load=Options(full_state_dict=True, flatten_optimizer_state_dict=True)))
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
        if found in ['builtins.KeyError@torch/distributed/_state_dict_utils.py:_unflatten_state_dict', 'builtins.KeyError@torch/optim/optimizer.py:load_state_dict']:
            print(f'REPRODUCED exception:state_dict:builtins.KeyError@torch/distributed/_state_dict_utils.py:_unflatten_state_dict: rank {ctx.rank} raised {found}: {e}', flush=True)
            os._exit(1)
        print(f"FAIL (not the entry's failure): rank {ctx.rank} raised {found}: {e}", flush=True)
        os._exit(0)
    print('PASS: no rank raised')
if __name__ == '__main__':
    main()
