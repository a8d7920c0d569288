#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=87e3671b7d30ca95 sources=001b716bb8af1bc0 seconds=9401.8
# Reproduces shardfuzz corpus entry dcp-hang-96de59c34a50.json: hang:dcp@torch/distributed/_state_dict_utils.py:_broadcast_state_dict:rank0-alone
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
from dataclasses import replace
from typing import ClassVar
import json
import os
import tempfile
from torch import nn
import torch.distributed as dist
import inspect
import hashlib
import shutil

@dataclass
class RankContext:
    rank: object
    world_size: object
    device: object
    _cases: object = 0

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

@dataclass(frozen=True)
class Leaf:
    bias: object = True
    frozen: object = False

@dataclass(frozen=True)
class Block:
    pass

@dataclass(frozen=True)
class ModuleTree:
    width: object
    root: object

    def paths(self):
        pass

def is_ancestor():
    pass

@dataclass(frozen=True)
class ShardSpec:
    path: object
    group: object = ()

    @property
    def paths(self):
        return (self.path, *self.group)

@dataclass(frozen=True)
class Composition:
    shards: object = ()
    replicates: object = ()
    checkpoints: object = ()

    def steps(self):
        items = [('checkpoint', p) for p in self.checkpoints] + [('replicate', p) for p in self.replicates]
        items += [('fully_shard', spec.path) for spec in self.shards]

        def key(item):
            pass
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

def case_to_json():
    pass

def case_to_text():
    return json.dumps(case_to_json(), sort_keys=True)

def dcp_root(driver_pid):
    return os.path.join(tempfile.gettempdir(), f'shardfuzz-dcp-{driver_pid}')

def is_plain():
    pass

@dataclass(frozen=True)
class Options:
    full_state_dict: object = False
    cpu_offload: object = False
    broadcast_from_rank0: object = False
    strict: object = True
    ignore_frozen_params: object = False
    flatten_optimizer_state_dict: object = False

class DcpItem(str, enum.Enum):
    MODEL = 'model'
    OPTIMIZER = 'optimizer'
    APP = 'app'
    SCALARS = 'scalars'
    COUNTER = 'counter'
    EXTRA = 'extra'

@dataclass(frozen=True)
class DcpBody(Body):
    KIND: ClassVar[str] = 'dcp'
    PROGRAM: ClassVar[str] = 'fuzz._rank.dcp:run_dcp'
    tree: object
    source: object
    target: object
    entries: object
    training: object = field(default_factory=Training)
    steps_after: object = 1
    load_full_state_dict: object = False
    load_cpu_offload: object = False
    requires_grad: object = ()

def build_model(device):
    with torch.device(device):
        return nn.Sequential(nn.Linear(2, 2, bias=True))

@dataclass
class Composed:
    model: object
    fsdp_roots: object = field(default_factory=list)

def compose(model, comp):
    for api, path in comp.steps():
        if api == 'fully_shard':
            pass
    sharded = [p for spec in (ShardSpec(path=''),) for p in spec.paths]
    tops = [p for p in sharded if not any((is_ancestor() for q in sharded))]
    return Composed(model=model, fsdp_roots=[model.get_submodule(p) for p in tops])

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
    schedule: object = ()

    @property
    def model(self):
        return self.composed.model

    @property
    def plain(self):
        pass

def build_side(comp, training, ctx, *, seed, schedule=()):
    torch.manual_seed(seed)
    device = ctx.device
    model = build_model(device).to(torch.float32)
    composed = Composed(model) if is_plain() else compose(model, comp)
    return Side(composed=composed, comp=comp, training=training, schedule=schedule)

def requires_grad(side):
    pass

def fresh_training(training):
    momentum = 0.5 if training.optimizer is Optimizer.SGD and training.momentum else 0.0
    return replace(training, lr=training.lr * 0.37, momentum=momentum, eps=training.eps * 10)

def add_optimizer(side, training):
    params = list(side.model.parameters())
    frozen = []
    side.opt = make_optimizer(params, training, later=frozen)
    return side.opt

def body_optimizer(side, training):
    return add_optimizer(side, training)

def dropped_keys():
    pass

def torch_kwargs(fn, kwargs):
    params = inspect.signature(fn).parameters
    missing = sorted((k for k in kwargs if k not in params))
    return kwargs

def state_dict_options(o):
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    extra = {n: True for n in ('ignore_frozen_params', 'flatten_optimizer_state_dict') if getattr(o, n)}
    return StateDictOptions(full_state_dict=o.full_state_dict, cpu_offload=o.cpu_offload, broadcast_from_rank0=o.broadcast_from_rank0, strict=o.strict, **torch_kwargs(StateDictOptions, extra))

def case_dir(ctx):
    digest = hashlib.sha1(case_to_text().encode()).hexdigest()[:12]
    count = getattr(ctx, '_cases', 0)
    return os.path.join(dcp_root(os.environ.get('SHARDFUZZ_PARENT_PID', os.getppid())), f'{digest}-{count}')

class App:

    def __init__(self, side, get, put):
        self.side, self.get, self.put = (side, get, put)

    def state_dict(self):
        from torch.distributed.checkpoint.state_dict import get_state_dict
        assert self.side.opt is not None
        msd, osd = get_state_dict(self.side.model, self.side.opt, options=state_dict_options(self.get))
        return {'model': msd, 'optimizer': osd}

    def load_state_dict(self, state_dict):
        from torch.distributed.checkpoint.state_dict import set_state_dict
        assert self.side.opt is not None
        set_state_dict(self.side.model, self.side.opt, model_state_dict=state_dict['model'], optim_state_dict=state_dict['optimizer'], options=state_dict_options(self.put))

def _options(full, offload, *, load, strict=True):
    return Options(full_state_dict=full, cpu_offload=offload, broadcast_from_rank0=load and full and offload, strict=strict)

def _values(side, get, put):
    out = {}
    for entry in (DcpItem.APP,):
        if entry is DcpItem.APP:
            out[entry] = App(side, get, put)
    return out

def _arrange(values):
    order = range(len((DcpItem.APP,)))
    return {(DcpItem.APP,)[i].value: values[(DcpItem.APP,)[i]] for i in order if (DcpItem.APP,)[i] in values}

def _tensors():
    pass

def _in_place_problem():
    pass

def _writer_kwargs(path):
    kwargs = {'checkpoint_id': path}
    return kwargs

def _save(state, path):
    import torch.distributed.checkpoint as dcp
    kwargs = _writer_kwargs(path)
    dcp.save(state, **kwargs)

def _load(state, path):
    import torch.distributed.checkpoint as dcp
    dcp.load(state, checkpoint_id=path)

def run_dcp(ctx):
    return _run_dcp(ctx)

def _run_dcp(ctx):
    t = Training(momentum=0.9, steps=1, batch_per_rank=1)
    get_save = _options(False, False, load=False)
    get_load = _options(True, True, load=False)
    put = _options(True, True, load=True, strict=not ())
    path = '' or case_dir(ctx)
    if True and ctx.rank == 0:
        shutil.rmtree(path, ignore_errors=True)
    src = None
    src = build_side(Composition(shards=(ShardSpec(path=''),)), t, ctx, seed=0, schedule=())
    body_optimizer(src, t)
    values = _values(src, get_save, put)
    state = _arrange(values)
    _save(state, path)
    tgt = build_side(Composition(shards=(ShardSpec(path=''),)), t, ctx, seed=FRESH_SEED, schedule=())
    body_optimizer(tgt, fresh_training(t))
    dropped = dropped_keys()
    values = _values(tgt, get_load, put)
    state = _arrange(values)
    plain = {k: v for k, v in state.items() if isinstance(v, (dict, torch.Tensor))}
    tensors = {k: _tensors() for k, v in plain.items()}
    before = requires_grad(tgt)
    _load(state, path)
    obs = {'dropped': dropped, 'in_place': _in_place_problem(), 'requires_grad': {'before': before, 'after': requires_grad(tgt)}}
    dist.barrier()
    if ctx.rank == 0:
        shutil.rmtree(path, ignore_errors=True)
    return obs

def attempt(rank, world_size):
    import torch
    case = Case(property='dcp', world_size=2, seed=0, body=DcpBody(tree=ModuleTree(width=2, root=Block()), source=Composition(shards=(ShardSpec(path=''),)), target=Composition(shards=(ShardSpec(path=''),)), entries=(DcpItem.APP,), training=Training(momentum=0.9, steps=1, batch_per_rank=1), steps_after=0, load_full_state_dict=True, load_cpu_offload=True))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'))
    run_dcp(ctx)

def main():
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import torch
    import torch.distributed as dist
    dist.init_process_group('gloo')
    rank, world_size = (dist.get_rank(), dist.get_world_size())
    import sys
    import threading
    import time
    import traceback
    finished = threading.Event()

    def watch():
        time.sleep(20)
        frames = traceback.extract_stack(sys._current_frames()[threading.main_thread().ident])
        if any((f"torch/{f.filename.rpartition('/torch/')[2]}:{f.name}" in ['torch/distributed/_state_dict_utils.py:_broadcast_state_dict'] for f in frames)):
            print(f'REPRODUCED hang:dcp@torch/distributed/_state_dict_utils.py:_broadcast_state_dict:rank0-alone: rank {rank} is stuck', flush=True)
            os._exit(1)
        if finished.is_set():
            print('PASS: every rank finished', flush=True)
        else:
            where = f'{frames[-1].filename}:{frames[-1].name}' if frames else '?'
            print(f"FAIL (not the entry's failure): rank {rank} is still running, in {where}", flush=True)
        os._exit(0)
    threading.Thread(target=watch, daemon=True).start()
    attempt(rank, world_size)
    finished.set()
    time.sleep(20 + 5)
    os._exit(0)
if __name__ == '__main__':
    main()
