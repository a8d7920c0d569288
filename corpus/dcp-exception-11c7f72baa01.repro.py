#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=0845a1e0c476c07f sources=9d7be58e4208c9df seconds=1071.8
# Reproduces shardfuzz corpus entry dcp-exception-11c7f72baa01.json: exception:dcp:torch.distributed.checkpoint.api.CheckpointException@torch/distributed/checkpoint/default_planner.py:create_default_local_load_plan
# Known torch bug: dcp.load of an FSDP1 sharded state dict where a rank holds no chunk of a
# parameter: the planner guesses a pre-2.4 checkpoint, 'Missing key in checkpoint state_dict';
# upstream: https://github.com/pytorch/pytorch/issues/163480.
# Observed: rank 0 raised torch.distributed.checkpoint.api.CheckpointException:
# CheckpointException ranks:dict_keys([1]) Traceback (most recent call last): (RANK 1) File ...
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: while the failure is there a rank raises
# torch.distributed.checkpoint.api.CheckpointException in
# torch/distributed/checkpoint/default_planner.py:create_default_local_load_plan and torchrun
# exits 1; else every rank prints PASS and it exits 0.

from __future__ import annotations
import torch
import enum
import json
import os
import tempfile
from typing import ClassVar
from torch import nn
from dataclasses import dataclass, field, replace
import hashlib
import shutil

@dataclass
class RankContext:
    rank: object
    world_size: object
    device: object
    backend: object

class LeafKind(str, enum.Enum):
    LINEAR = 'linear'
    LAYER_NORM = 'layer_norm'
    TANH = 'tanh'

class Dtype(str, enum.Enum):
    FLOAT32 = 'float32'
    FLOAT64 = 'float64'
    BFLOAT16 = 'bfloat16'
    FLOAT16 = 'float16'

@dataclass(frozen=True)
class Leaf:
    kind: object
    bias: object = True

@dataclass(frozen=True)
class Block:
    children: object
    residual: object = False
    scale: object = False
    buffer: object = False

@dataclass(frozen=True)
class ModuleTree:
    width: object
    root: object

class Wrapper(str, enum.Enum):
    NONE = 'none'
    FSDP1_FULL_SHARD = 'fsdp1_full_shard'
    FSDP1_SHARD_GRAD_OP = 'fsdp1_shard_grad_op'
    FSDP1_NO_SHARD = 'fsdp1_no_shard'
    FSDP1_HYBRID_SHARD = 'fsdp1_hybrid_shard'

@dataclass(frozen=True)
class CheckpointOptions:
    pass

@dataclass(frozen=True)
class Composition:
    wrapper: object = Wrapper.NONE

@dataclass(frozen=True)
class Training:
    momentum: object = 0.0
    steps: object = 2
    dtype: object = Dtype.FLOAT32

class Body:
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

class DcpItem(str, enum.Enum):
    MODEL = 'model'
    SCALARS = 'scalars'

class DcpMode(str, enum.Enum):
    ROUND_TRIP = 'round_trip'

@dataclass(frozen=True)
class DcpBody(Body):
    tree: object
    source: object
    target: object
    entries: object
    training: object = field(default_factory=Training)
    orders: object = ()
    drop: object = ()
    save_full_state_dict: object = False
    save_cpu_offload: object = False
    load_full_state_dict: object = False
    load_cpu_offload: object = False
    target_meta_init: object = False
    checkpoint_dir: object = ''
    no_dist: object = False
    requires_grad: object = ()

    @property
    def classic_fsdp1(self):
        pass

class TreeBlock(nn.Module):

    def __init__(self, children, residual, width, scale, buffer):
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(width)) if scale else None

def build_node(node, width):
    if isinstance(node, Leaf):
        return None
    return TreeBlock([build_node(c, width) for c in node.children], node.residual, width, node.scale, node.buffer)

def build_model(tree, device):
    return build_node(tree.root, tree.width)
TORCH_DTYPES = {Dtype.FLOAT32: torch.float32, Dtype.FLOAT64: torch.float64, Dtype.BFLOAT16: torch.bfloat16, Dtype.FLOAT16: torch.float16}

@dataclass
class Composed:
    model: object
    wrapper: object = Wrapper.NONE
    param_names: object = field(default_factory=list)

def compose(model, comp, ctx):
    names = [n for n, _ in model.named_parameters()]
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy
    strategy = {Wrapper.FSDP1_FULL_SHARD: ShardingStrategy.FULL_SHARD, Wrapper.FSDP1_SHARD_GRAD_OP: ShardingStrategy.SHARD_GRAD_OP, Wrapper.FSDP1_NO_SHARD: ShardingStrategy.NO_SHARD, Wrapper.FSDP1_HYBRID_SHARD: ShardingStrategy.HYBRID_SHARD}[comp.wrapper]
    kwargs = {'sharding_strategy': strategy, 'device_id': ctx.device, 'use_orig_params': True}
    wrap_out = FSDP(model, **kwargs)
    return Composed(model=wrap_out, wrapper=comp.wrapper, param_names=names)
FRESH_SEED = 24301

@dataclass
class Side:
    composed: object
    comp: object
    training: object
    schedule: object = ()

    @property
    def model(self):
        return self.composed.model

    @property
    def fsdp1(self):
        pass

def build_side(tree, comp, training, ctx, *, seed, meta=False, schedule=()):
    device = torch.device('meta') if meta else ctx.device
    model = build_model(tree, device).to(TORCH_DTYPES[training.dtype])
    composed = compose(model, comp, ctx)
    return Side(composed=composed, comp=comp, training=training, schedule=schedule)

def requires_grad(side):
    pass

def case_dir(ctx):
    case_to_json_out = None
    case_to_text_out = json.dumps(case_to_json_out, sort_keys=True)
    digest = hashlib.sha1(case_to_text_out.encode()).hexdigest()[:12]
    count = getattr(ctx, '_cases', 0)
    driver_pid = os.environ.get('SHARDFUZZ_PARENT_PID', os.getppid())
    dcp_root_out = os.path.join(tempfile.gettempdir(), f'shardfuzz-dcp-{driver_pid}')
    return os.path.join(dcp_root_out, f'{digest}-{count}')

class Scalars:

    def __init__(self, values):
        self.values = dict(values)

    def state_dict(self):
        return dict(self.values)

    def load_state_dict(self, state_dict):
        ...

def _options(full, offload, *, load, strict=True):
    return Options(full_state_dict=full, cpu_offload=offload, broadcast_from_rank0=load and full and offload, strict=strict)

def _values(body, case, side, ctx, fresh):
    out = {}
    salt = ctx.rank if body.no_dist else 0
    for entry in body.entries:
        if entry is DcpItem.MODEL:
            out[entry] = side.model.state_dict()
        else:
            s = (case.seed + (salt * 7919 if body.no_dist else 0)) % 100003
            values = {'step': body.training.steps, 'loss': s / 7.0, 'tag': f'case-{s}', 'done': bool(s % 2), 'history': [s / 3.0, -1.5, 1e-300]}
            out[entry] = Scalars({k: type(v)() if fresh else v for k, v in values.items()})
    return out

def prepare_side(body, side, options):
    offload = options.cpu_offload
    from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig, ShardedOptimStateDictConfig, ShardedStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    FSDP.set_state_dict_type(side.model, StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig(offload_to_cpu=offload), ShardedOptimStateDictConfig(offload_to_cpu=offload))

def _arrange(body, values, ctx):
    order = body.orders[ctx.rank] if body.orders else range(len(body.entries))
    return {body.entries[i].value: values[body.entries[i]] for i in order if body.entries[i] in values}

def run_dcp(case, body, ctx):
    t = body.training
    get_save = _options(body.save_full_state_dict, body.save_cpu_offload, load=False)
    path = body.checkpoint_dir or case_dir(ctx)
    own = os.path.join(path, f'rank-{ctx.rank}') if body.no_dist else path
    src = build_side(body.tree, body.source, t, ctx, seed=case.seed, schedule=body.requires_grad)
    prepare_side(body, src, get_save)
    values = _values(body, case, src, ctx, fresh=False)
    state = _arrange(body, values, ctx)
    import torch.distributed.checkpoint as dcp
    kwargs_ = {'no_dist': True} if body.no_dist else {}
    kwargs_['checkpoint_id'] = own
    kwargs = kwargs_
    dcp.save(state, **kwargs)
    tgt = build_side(body.tree, body.target, t, ctx, seed=case.seed + FRESH_SEED, meta=body.target_meta_init, schedule=body.requires_grad)
    plain = {k: v for k, v in state.items() if isinstance(v, (dict, torch.Tensor))}
    before = requires_grad(tgt)
    import torch.distributed.checkpoint as dcp_
    kwargs__ = {'no_dist': True} if body.no_dist else {}
    dcp_.load(state, checkpoint_id=own, **kwargs__)
    return None

def attempt(rank, world_size):
    import torch
    import torch.distributed as dist
    case = Case(property='dcp', world_size=2, seed=34, body=DcpBody(tree=ModuleTree(width=1, root=Block(children=(Leaf(kind=LeafKind.LINEAR), Block(children=(Leaf(kind=LeafKind.LINEAR), Leaf(kind=LeafKind.TANH), Leaf(kind=LeafKind.LAYER_NORM)), scale=True), Leaf(kind=LeafKind.LINEAR, bias=False)), buffer=True)), source=Composition(wrapper=Wrapper.FSDP1_FULL_SHARD), target=Composition(wrapper=Wrapper.FSDP1_FULL_SHARD), entries=(DcpItem.MODEL, DcpItem.SCALARS), training=Training(momentum=0.9)))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    run_dcp(case, case.body, ctx)

if __name__ == "__main__":
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import torch.distributed as dist
    dist.init_process_group("gloo")
    attempt(dist.get_rank(), dist.get_world_size())
    print('PASS: no rank raised', flush=True)
    os._exit(0)  # a rank must not wait for the others at exit
