#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=627b92f9c75a2fc3 sources=14c7281674c70e1f seconds=2222.2
# Reproduces shardfuzz corpus entry state_dict-crash-81ffab405f7f.json: crash:state_dict:signal SIGSEGV@torch/distributed/fsdp/_state_dict_utils.py:param_hook
# Known torch bug: FSDP1 FULL_STATE_DICT with offload_to_cpu on CPU: state_dict() clones a freed
# buffer (SIGSEGV), optim_state_dict aliases the gathered states; upstream:
# https://github.com/pytorch/pytorch/issues/188989.
# Observed: rank 0 died (signal SIGSEGV)
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: prints REPRODUCED and exits 1 while the failure
# is there, else exits 0 (expected: no rank dies).

from __future__ import annotations
from dataclasses import dataclass, field
import torch
import enum
from dataclasses import dataclass
from dataclasses import dataclass, field
from typing import ClassVar
import os
from typing import ClassVar
from torch import nn
import copy
import torch.distributed as dist
from dataclasses import dataclass, field

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
    buffer: object = False

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
class Composition:
    shards: object = ()
    replicates: object = ()
    wrapper: object = Wrapper.NONE

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

def is_plain(comp):
    return not comp.shards and (not comp.replicates) and (comp.wrapper is Wrapper.NONE)
DEFAULT_FQN_MODIFIERS = '_fqn_modifiers'

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

@dataclass(frozen=True)
class StateDictBody(Body):
    KIND: ClassVar[str] = 'state_dict'
    PROGRAM: ClassVar[str] = 'fuzz._rank.state_dict:run_state_dict'
    tree: object
    source: object
    target: object
    training: object = field(default_factory=Training)
    steps_after: object = 1
    api: object = Api.SPLIT
    save: object = field(default_factory=Options)
    load: object = field(default_factory=Options)
    target_meta_init: object = False
    drop: object = ()
    frozen_in_optimizer: object = False
    empty_group: object = False
    requires_grad: object = ()
    fused: object = ()
    fqn_modifiers: object = DEFAULT_FQN_MODIFIERS

class TreeBlock(nn.Module):

    def __init__(self, children, residual, width, scale, buffer):
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)
        self.residual = residual
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(width)) if scale else None
        self.shift = None
        self.skipped: frozenset[str] = frozenset()

    def forward(self, x):
        pass

class PointwiseConv1d(nn.Conv1d):

    def forward(self, x):
        return super().forward(x.unsqueeze(-1)).squeeze(-1)

def build_leaf(leaf, width):
    module = _build_leaf(leaf, width)
    if leaf.frozen:
        module.requires_grad_(False)
    return module

def _build_leaf(leaf, width):
    return PointwiseConv1d(width, width, kernel_size=1, bias=leaf.bias) if leaf.kind is LeafKind.CONV1D else None

def build_node(node, width):
    if isinstance(node, Leaf):
        return build_leaf(node, width)
    return TreeBlock([build_node(c, width) for c in node.children], node.residual, width, node.scale, node.buffer)

def build_model(tree, device):
    with torch.device(device):
        return build_node(tree.root, tree.width)
TORCH_DTYPES = {Dtype.FLOAT32: torch.float32, Dtype.FLOAT64: torch.float64, Dtype.BFLOAT16: torch.bfloat16, Dtype.FLOAT16: torch.float16}

@dataclass
class Composed:
    model: object
    wrapper: object = Wrapper.NONE
    param_names: object = field(default_factory=list)

def compose(model, comp, ctx, tree=None):
    if comp.wrapper is not Wrapper.NONE:
        names = [n for n, _ in model.named_parameters()]
        return Composed(model=_wrap(model, comp, ctx), wrapper=comp.wrapper, param_names=names)

def _wrap(model, comp, ctx):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    strategy = {Wrapper.FSDP1_FULL_SHARD: ShardingStrategy.FULL_SHARD, Wrapper.FSDP1_SHARD_GRAD_OP: ShardingStrategy.SHARD_GRAD_OP, Wrapper.FSDP1_NO_SHARD: ShardingStrategy.NO_SHARD, Wrapper.FSDP1_HYBRID_SHARD: ShardingStrategy.HYBRID_SHARD}[comp.wrapper]
    return FSDP(model, sharding_strategy=strategy, device_id=ctx.device, use_orig_params=True)

def make_optimizer(params, training, later=()):
    held = {id(p) for p in later}
    params = [p for p in params if p.requires_grad or id(p) in held]
    groups = params
    foreach = training.foreach
    return torch.optim.SGD(groups, lr=training.lr, momentum=training.momentum, foreach=foreach) if training.optimizer is Optimizer.SGD else None
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

def build_side(tree, comp, training, ctx, *, seed, meta=False, schedule=(), fused=(), fqn_modifiers=DEFAULT_FQN_MODIFIERS):
    torch.manual_seed(seed)
    device = torch.device('meta') if meta else ctx.device
    model = build_model(tree, device).to(TORCH_DTYPES[training.dtype])
    composed = Composed(model) if is_plain(comp) else compose(model, comp, ctx)
    return Side(composed=composed, comp=comp, training=training, schedule=schedule)

def requires_grad(side):
    pass

def add_optimizer(side, training, *, frozen_in_optimizer=False, empty_group=False):
    params = list(side.model.parameters())
    frozen = [p for p in params if not p.requires_grad] if frozen_in_optimizer else []
    side.opt = make_optimizer(params, training, later=frozen)
    return side.opt

def body_optimizer(side, training, body):
    return add_optimizer(side, training, frozen_in_optimizer=body.frozen_in_optimizer, empty_group=body.empty_group)

def all_batches(case, training, steps, tree, ctx):
    pass

def train_steps(side, data, ctx):
    pass

def dropped_keys(side, drop):
    return [] if not drop else None

def fsdp1_state_dict_type(side, *, full, offload, rank0_only=False):
    from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig, StateDictType, FullyShardedDataParallel as FSDP
    if full:
        FSDP.set_state_dict_type(side.model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(offload_to_cpu=offload, rank0_only=rank0_only), FullOptimStateDictConfig(offload_to_cpu=offload, rank0_only=rank0_only))

def fsdp1_optim_state_dict(side):
    pass

def _take(body, side):
    assert side.opt is not None
    if body.api is Api.FSDP1:
        only0 = body.load.broadcast_from_rank0
        fsdp1_state_dict_type(side, full=body.save.full_state_dict, offload=body.save.cpu_offload, rank0_only=only0)
        return (side.model.state_dict(), fsdp1_optim_state_dict(side))

def _put(body, side, msd, osd, ctx):
    pass

def run_state_dict(case, body, ctx):
    t = body.training
    data = all_batches(case, t, t.steps + body.steps_after, body.tree, ctx)
    src = build_side(body.tree, body.source, t, ctx, seed=0, schedule=body.requires_grad, fused=body.fused, fqn_modifiers=body.fqn_modifiers)
    body_optimizer(src, t, body)
    msd, osd = _take(body, src)
    ignored = []
    msd, osd = copy.deepcopy((msd, osd))
    tgt = build_side(body.tree, body.target, t, ctx, seed=FRESH_SEED, meta=body.target_meta_init, schedule=body.requires_grad, fused=body.fused, fqn_modifiers=body.fqn_modifiers)
    if not body.target_meta_init:
        pass
    dropped = sorted(set(dropped_keys(src, body.drop)) | set(ignored))
    before = requires_grad(tgt)
    result, after = _put(body, tgt, msd, osd, ctx)
    obs = {'losses_before': train_steps(src, data[:t.steps], ctx), 'dropped': dropped, 'requires_grad': {'before': before, 'after': after}}
    if body.steps_after:
        pass
    return obs

def main():
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import re
    import subprocess
    import sys
    if not os.environ.get('REPRO_CHILD'):
        env = {**os.environ, 'REPRO_CHILD': '1'}
        child = subprocess.run([sys.executable, __file__], env=env, stderr=subprocess.PIPE, text=True)
        frames = re.findall('File "[^"]+/torch/([^"]+)", line \\d+ in (\\S+)', child.stderr)
        found = f'signal {child.returncode}@torch/{frames[0][0]}:{frames[0][1]}' if frames else ''
        if found in ['signal -11@torch/distributed/fsdp/_state_dict_utils.py:param_hook']:
            print(f'REPRODUCED crash:state_dict:signal SIGSEGV@torch/distributed/fsdp/_state_dict_utils.py:param_hook: rank {os.environ["RANK"]} died: {found}', flush=True)
            sys.exit(1)
        print(f'PASS or another failure: exit {child.returncode}', flush=True)
        sys.exit(0)
    import faulthandler
    faulthandler.enable()
    import os
    import torch
    import torch.distributed as dist
    case = Case(property='state_dict', world_size=2, seed=0, body=StateDictBody(tree=ModuleTree(width=1, root=Block(children=(Leaf(kind=LeafKind.CONV1D, bias=False), Leaf(kind=LeafKind.CONV1D, bias=False, frozen=True)))), source=Composition(wrapper=Wrapper.FSDP1_FULL_SHARD), target=Composition(wrapper=Wrapper.FSDP1_FULL_SHARD), training=Training(lr=0.01, eps=0.0001, steps=1, batch_per_rank=1, set_to_none=False), api=Api.FSDP1, save=Options(full_state_dict=True, cpu_offload=True), load=Options(full_state_dict=True)))
    dist.init_process_group('gloo')
    rank, world_size = (dist.get_rank(), dist.get_world_size())
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    run_state_dict(case, case.body, ctx)
if __name__ == '__main__':
    main()
