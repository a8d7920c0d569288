#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=905c6279a12f4664 sources=73c958e26ffedc4f seconds=4156.1
# Reproduces shardfuzz corpus entry state_dict-hang-dff6a54ad235.json: hang:state_dict@torch/distributed/_state_dict_utils.py:_broadcast_state_dict:rank0-alone
# Known torch bug: set_state_dict(broadcast_from_rank0=True) deadlocks when ranks other than 0
# pass an empty model state dict; upstream: https://github.com/pytorch/pytorch/issues/157781.
# Observed: rank 0 broadcasts state in _broadcast_state_dict that rank(s) [1] skipped (rank(s) 0,
# 1 missed the deadline in torch/distributed/distributed_c10d.py:broadcast)
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: prints REPRODUCED and exits 1 while the failure
# is there, else exits 0 (expected: every rank finishes).

from __future__ import annotations
from dataclasses import dataclass, field
import torch
import enum
from dataclasses import dataclass
from dataclasses import dataclass, field
from dataclasses import replace
from typing import ClassVar
import os
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

@dataclass(frozen=True)
class ModuleTree:
    width: object
    root: object

@dataclass(frozen=True)
class ShardSpec:
    path: object

@dataclass(frozen=True)
class Composition:
    shards: object = ()

    @property
    def sharded_paths(self):
        return [p for spec in self.shards for p in ('',)]

    def steps(self):
        items = [('fully_shard', '') for spec in self.shards]

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
    steps_after: object = 1
    api: object = Api.SPLIT
    save: object = field(default_factory=Options)
    load: object = field(default_factory=Options)
    requires_grad: object = ()

def build_node(node, width):
    if isinstance(node, Leaf):
        module = nn.Linear(width, width, bias=True)
        return module
    return nn.Sequential(*[build_node(c, width) for c in node.children])

def build_model(tree, device):
    with torch.device(device):
        return build_node(tree.root, 2)
TORCH_DTYPES = {Dtype.FLOAT32: torch.float32, Dtype.FLOAT64: torch.float64, Dtype.BFLOAT16: torch.bfloat16, Dtype.FLOAT16: torch.float16}

@dataclass
class Composed:
    model: object
    fsdp_roots: object = field(default_factory=list)
FRESH_SEED = 24301

@dataclass
class Side:
    composed: object
    comp: object
    training: object
    opt: object = None
    schedule: object = ()

    @property
    def model(self):
        return self.composed.model

def build_side(tree, comp, training, ctx, *, seed, schedule=()):
    torch.manual_seed(seed)
    device = ctx.device
    model = build_model(tree, device).to(TORCH_DTYPES[training.dtype])
    for api, path in comp.steps():
        pass
    sharded = comp.sharded_paths
    tops = [p for p in sharded if not any((False for q in sharded))]
    composed = Composed(model=model, fsdp_roots=[model.get_submodule(p) for p in tops])
    return Side(composed=composed, comp=comp, training=training, schedule=schedule)

def requires_grad(side):
    pass

def body_optimizer(side, training):
    params = list(side.model.parameters())
    params_ = params
    held = set()
    params_ = [p for p in params_ if p.requires_grad or id(p) in held]
    groups = params_
    side.opt = torch.optim.SGD(groups, lr=training.lr, momentum=training.momentum, foreach=None)
    return side.opt

def state_dict_options(o):
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    extra = {n: True for n in ('ignore_frozen_params', 'flatten_optimizer_state_dict') if getattr(o, n)}
    params = inspect.signature(StateDictOptions).parameters
    missing = sorted((k for k in extra if k not in params))
    return StateDictOptions(full_state_dict=True, cpu_offload=False, broadcast_from_rank0=o.broadcast_from_rank0, strict=True, **extra)

def run_state_dict(body, ctx):
    t = body.training
    src = build_side(body.tree, body.source, t, ctx, seed=0, schedule=())
    body_optimizer(src, t)
    obs = {'losses_before': None}
    from torch.distributed.checkpoint.state_dict import get_state_dict
    options = state_dict_options(body.save)
    assert src.opt is not None
    msd, osd = get_state_dict(src.model, src.opt, options=options)
    ignored = []
    if ctx.rank == 0:
        obs['taken_optimizer'] = None
    msd, osd = copy.deepcopy((msd, osd))
    tgt = build_side(body.tree, body.target, t, ctx, seed=FRESH_SEED, schedule=())
    body_optimizer(tgt, replace(t, lr=0.1 * 0.37, momentum=0.5, eps=0.001 * 10))
    dropped_keys_out = []
    dropped = sorted(set(dropped_keys_out) | set(ignored))
    obs['dropped'] = dropped
    if True and ctx.rank != 0:
        msd, osd = ({}, {})
    before = requires_grad(tgt)
    from torch.distributed.checkpoint.state_dict import set_state_dict
    options_ = state_dict_options(body.load)
    fresh = replace(body.training, lr=0.1 * 0.37, momentum=0.5, eps=0.001 * 10)
    assert tgt.opt is not None
    result_ = set_state_dict(tgt.model, tgt.opt, model_state_dict=msd, optim_state_dict=osd, options=options_)
    result, after = (result_, requires_grad(tgt))
    obs['requires_grad'] = {'before': before, 'after': after}
    return obs

def main():
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import torch
    import torch.distributed as dist
    case = Case(property='state_dict', world_size=2, seed=0, body=StateDictBody(tree=ModuleTree(width=2, root=Block(children=(Leaf(kind=LeafKind.LINEAR),))), source=Composition(shards=(ShardSpec(path=''),)), target=Composition(shards=(ShardSpec(path=''),)), training=Training(momentum=0.9, steps=1, batch_per_rank=1), steps_after=0, api=Api.COMBINED, save=Options(full_state_dict=True), load=Options(full_state_dict=True, broadcast_from_rank0=True)))
    dist.init_process_group('gloo')
    rank, world_size = (dist.get_rank(), dist.get_world_size())
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import sys
    import threading
    import time
    import traceback
    finished = threading.Event()

    def watch():
        time.sleep(20)
        frames = traceback.extract_stack(sys._current_frames()[threading.main_thread().ident])
        if any((f"torch/{f.filename.rpartition('/torch/')[2]}:{f.name}" in ['torch/distributed/_state_dict_utils.py:_broadcast_state_dict'] for f in frames)):
            print(f'REPRODUCED hang:state_dict@torch/distributed/_state_dict_utils.py:_broadcast_state_dict:rank0-alone: rank {ctx.rank} is stuck', flush=True)
            os._exit(1)
        if finished.is_set():
            print('PASS: every rank finished', flush=True)
        else:
            where = f'{frames[-1].filename}:{frames[-1].name}' if frames else '?'
            print(f"FAIL (not the entry's failure): rank {ctx.rank} is still running, in {where}", flush=True)
        os._exit(0)
    threading.Thread(target=watch, daemon=True).start()
    run_state_dict(case.body, ctx)
    finished.set()
    time.sleep(20 + 5)
    os._exit(0)
if __name__ == '__main__':
    main()
