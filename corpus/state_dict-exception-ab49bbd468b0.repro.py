#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=8017b5f35ca482a2 sources=a75dcc528b2e5f17 seconds=27.4
"""Reproduces shardfuzz corpus entry state_dict-exception-ab49bbd468b0.json: exception:state_dict:builtins.AssertionError@torch/distributed/fsdp/_state_dict_utils.py:_common_unshard_post_state_dict_hook

Observed: FSDP1 NO_SHARD (use_orig_params) with an auto-wrapped unit whose parameters are all
frozen: after a training step state_dict() raises 'FSDP assumes ... is in the state_dict'.
docs/state_dict.md. (rank 0 raised builtins.AssertionError: FSDP assumes 0.weight is in the
state_dict but the state_dict only has odict_keys(['1.0.weight', '1.0.bias']). prefix=,
module_name=0., param_name=weight rank=0.)
Known torch bug: FSDP1 NO_SHARD with an auto-wrapped unit of frozen parameters: state_dict()
after training raises 'FSDP assumes ... is in the state_dict'; upstream:
https://github.com/pytorch/pytorch/issues/85831.
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
class CheckpointOptions:

    def names(self):
        pass

@dataclass(frozen=True)
class Composition:
    shards: object = ()
    replicates: object = ()
    checkpoints: object = ()
    wrapper: object = Wrapper.NONE
    auto_wrap: object = False
    checkpoint_options: object = field(default_factory=CheckpointOptions)

    def steps(self):
        items = [('checkpoint', p) for p in self.checkpoints] + [('replicate', p) for p in self.replicates]
        items += [('fully_shard', spec.path) for spec in self.shards]

        def key(item):
            pass
        return sorted(items, key=key)

@dataclass(frozen=True)
class Training:
    lr: object = 0.1
    momentum: object = 0.0
    steps: object = 2
    dtype: object = Dtype.FLOAT32
    set_to_none: object = True
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

class Api(str, enum.Enum):
    SPLIT = 'split'
    COMBINED = 'combined'
    MODULE = 'module'
    FSDP1 = 'fsdp1_optim_state_dict'

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
    api: object = Api.SPLIT
    save: object = field(default_factory=Options)
    load: object = field(default_factory=Options)
    frozen_in_optimizer: object = False
    empty_group: object = False
    requires_grad: object = ()

    def __post_init__(self):
        save, load = (self.save, self.load)
        return

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

def build_leaf(leaf, width):
    module = _build_leaf(leaf, width)
    if leaf.frozen:
        module.requires_grad_(False)
    return module

def _build_leaf(leaf, width):
    return nn.Linear(width, width, bias=True)

def build_node(node, width):
    if isinstance(node, Leaf):
        return build_leaf(node, width)
    return TreeBlock([build_node(c, width) for c in node.children], False, width, False, False)

def build_model(tree, device):
    with torch.device(device):
        return build_node(tree.root, 2)

def checkpoint_kwargs(opts):
    kwargs = {}
    return kwargs
TORCH_DTYPES = {Dtype.FLOAT32: torch.float32, Dtype.FLOAT64: torch.float64, Dtype.BFLOAT16: torch.bfloat16, Dtype.FLOAT16: torch.float16}
_WRAPPER_PREFIXES = ('_fsdp_wrapped_module.', 'module.', '_checkpoint_wrapped_module.')

def clean_name(name):
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, '')
    return name

@dataclass
class Composed:
    model: object
    wrapper: object = Wrapper.NONE
    param_names: object = field(default_factory=list)

def compose(model, comp, ctx, tree=None):
    from torch.distributed._composable import checkpoint, replicate
    ckpt_kwargs = checkpoint_kwargs(comp.checkpoint_options)
    names = [n for n, _ in model.named_parameters()]
    return Composed(model=_wrap(model, comp, ctx), wrapper=comp.wrapper, param_names=names)

def _wrap(model, comp, ctx):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    strategy = {Wrapper.FSDP1_FULL_SHARD: ShardingStrategy.FULL_SHARD, Wrapper.FSDP1_SHARD_GRAD_OP: ShardingStrategy.SHARD_GRAD_OP, Wrapper.FSDP1_NO_SHARD: ShardingStrategy.NO_SHARD, Wrapper.FSDP1_HYBRID_SHARD: ShardingStrategy.HYBRID_SHARD}[comp.wrapper]
    kwargs = {'sharding_strategy': strategy, 'device_id': ctx.device, 'use_orig_params': True}
    kwargs['auto_wrap_policy'] = ModuleWrapPolicy({TreeBlock})
    return FSDP(model, **kwargs)

def make_optimizer(params, training, later=()):
    held = {id(p) for p in later}
    params = [p for p in params if p.requires_grad or id(p) in held]
    groups = params
    foreach = None
    return torch.optim.SGD(groups, lr=0.1, momentum=0.9, foreach=foreach)

def batches(case, training, width, ctx, tp_size=1):
    dtype = TORCH_DTYPES[training.dtype]
    gen = torch.Generator().manual_seed(37)
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
        pass

def build_side(tree, comp, training, ctx, *, seed, meta=False, schedule=()):
    torch.manual_seed(seed)
    device = ctx.device
    model = build_model(tree, device).to(TORCH_DTYPES[training.dtype])
    composed = compose(model, comp, ctx)
    return Side(composed=composed, comp=comp, training=training, schedule=schedule)

def change_requires_grad(side, step):
    return

def requires_grad(side):
    pass

def add_optimizer(side, training, *, frozen_in_optimizer=False, empty_group=False):
    params = list(side.model.parameters())
    frozen = []
    side.opt = make_optimizer(params, training, later=frozen)
    side.param_names = {id(p): clean_name(n) for n, p in side.model.named_parameters()}
    return side.opt

def body_optimizer(side, training, body):
    return add_optimizer(side, training, frozen_in_optimizer=False, empty_group=False)

def seed_segment(case, ctx, segment):
    torch.manual_seed((37 * 7919 + segment * 104729 + ctx.rank + 1) % 2 ** 63)

def all_batches(case, training, steps, tree, ctx):
    return [step[0] for step in batches(case, replace(training, steps=steps), 2, ctx)]

def train_steps(side, data, ctx):
    assert side.opt is not None
    losses = []
    for x, y in data:
        change_requires_grad(side, side.step)
        side.step += 1
        loss = F.mse_loss(side.model(x).to(y.dtype), y)
        loss.backward()
        side.opt.step()
        side.opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses

def fsdp1_state_dict_type(side, *, full, offload, rank0_only=False):
    from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig, ShardedOptimStateDictConfig, ShardedStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    FSDP.set_state_dict_type(side.model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(offload_to_cpu=offload, rank0_only=rank0_only), FullOptimStateDictConfig(offload_to_cpu=offload, rank0_only=rank0_only))

def fsdp1_optim_state_dict(side):
    pass

def torch_kwargs(fn, kwargs):
    params = inspect.signature(fn).parameters
    missing = sorted((k for k in kwargs if k not in params))
    return kwargs

def state_dict_options(o):
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    extra = {n: True for n in ('ignore_frozen_params', 'flatten_optimizer_state_dict') if getattr(o, n)}
    return StateDictOptions(full_state_dict=True, cpu_offload=False, broadcast_from_rank0=False, strict=True, **torch_kwargs(StateDictOptions, extra))

def _take(body, side):
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict, get_state_dict
    options = state_dict_options(body.save)
    assert side.opt is not None
    only0 = False
    fsdp1_state_dict_type(side, full=True, offload=False, rank0_only=only0)
    return (side.model.state_dict(), fsdp1_optim_state_dict(side))

def run_state_dict(case, body, ctx):
    t = body.training
    data = all_batches(case, t, 2 + 1, body.tree, ctx)
    src = build_side(body.tree, body.source, t, ctx, seed=37, schedule=())
    body_optimizer(src, t, body)
    seed_segment(case, ctx, 0)
    obs = {'losses_before': train_steps(src, data[:2], ctx)}
    msd, osd = _take(body, src)

def main():
    import os
    import torch
    import torch.distributed as dist
    case = Case(property='state_dict', world_size=2, seed=37, body=StateDictBody(tree=ModuleTree(width=2, root=Block(children=(Leaf(kind=LeafKind.LINEAR, frozen=True), Block(children=(Leaf(kind=LeafKind.LINEAR),))))), source=Composition(wrapper=Wrapper.FSDP1_NO_SHARD, auto_wrap=True), target=Composition(wrapper=Wrapper.FSDP1_NO_SHARD), training=Training(momentum=0.9), api=Api.FSDP1, save=Options(full_state_dict=True), load=Options(full_state_dict=True)))
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
        if found in ['builtins.AssertionError@torch/distributed/fsdp/_state_dict_utils.py:_common_unshard_post_state_dict_hook']:
            print(f'REPRODUCED exception:state_dict:builtins.AssertionError@torch/distributed/fsdp/_state_dict_utils.py:_common_unshard_post_state_dict_hook: rank {ctx.rank} raised {found}: {e}', flush=True)
            os._exit(1)
        print(f"FAIL (not the entry's failure): rank {ctx.rank} raised {found}: {e}", flush=True)
        os._exit(0)
    print('PASS: no rank raised')
if __name__ == '__main__':
    main()
