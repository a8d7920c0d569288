#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=87e3671b7d30ca95 sources=001b716bb8af1bc0 seconds=10072.2
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
    device: object
    _cases: object = 0

    def group(self, name):
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
    foreach: object = None

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

def build_model(device):
    with torch.device(device):
        return nn.Sequential(nn.Linear(2, 2, bias=True))

@dataclass
class Composed:
    model: object

def compose(model, comp):
    for api, path in comp.steps():
        if api == 'fully_shard':
            pass
    sharded = [p for spec in (ShardSpec(path=''),) for p in spec.paths]
    tops = [p for p in sharded if not any((is_ancestor() for q in sharded))]
    return Composed(model=model)
FRESH_SEED = 24301

@dataclass
class Side:
    composed: object
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
    return Side(composed=composed, schedule=schedule)

def requires_grad():
    pass

def body_optimizer(side, training):
    params = list(side.model.parameters())
    frozen = []
    params_ = params
    held = {id(p) for p in frozen}
    params_ = [p for p in params_ if p.requires_grad or id(p) in held]
    groups = params_
    foreach = training.foreach
    side.opt = torch.optim.SGD(groups, lr=training.lr, momentum=training.momentum, foreach=foreach) if training.optimizer is Optimizer.SGD else None
    return side.opt

def torch_kwargs(fn, kwargs):
    params = inspect.signature(fn).parameters
    missing = sorted((k for k in kwargs if k not in params))
    return kwargs

def state_dict_options(o):
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    extra = {n: True for n in ('ignore_frozen_params', 'flatten_optimizer_state_dict') if getattr(o, n)}
    return StateDictOptions(full_state_dict=o.full_state_dict, cpu_offload=o.cpu_offload, broadcast_from_rank0=o.broadcast_from_rank0, strict=o.strict, **torch_kwargs(StateDictOptions, extra))

def case_dir(ctx):
    pass
    case_to_json_out = None
    case_to_text_out = json.dumps(case_to_json_out, sort_keys=True)
    digest = hashlib.sha1(case_to_text_out.encode()).hexdigest()[:12]
    count = getattr(ctx, '_cases', 0)
    driver_pid = os.environ.get('SHARDFUZZ_PARENT_PID', os.getppid())
    dcp_root_out = os.path.join(tempfile.gettempdir(), f'shardfuzz-dcp-{driver_pid}')
    return os.path.join(dcp_root_out, f'{digest}-{count}')

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
    t = Training(momentum=0.9, steps=1)
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
    momentum = 0.5 if t.optimizer is Optimizer.SGD and t.momentum else 0.0
    fresh_training_out = replace(t, lr=t.lr * 0.37, momentum=momentum, eps=t.eps * 10)
    body_optimizer(tgt, fresh_training_out)
    pass
    dropped = None
    values = _values(tgt, get_load, put)
    state = _arrange(values)
    plain = {k: v for k, v in state.items() if isinstance(v, (dict, torch.Tensor))}
    before = requires_grad()
    _load(state, path)
    obs = {'dropped': dropped, 'in_place': _in_place_problem(), 'requires_grad': {'before': before, 'after': requires_grad()}}
    dist.barrier()
    if ctx.rank == 0:
        shutil.rmtree(path, ignore_errors=True)
    return obs

def attempt(rank, world_size):
    import torch
    ctx = RankContext(rank=rank, device=torch.device('cpu'))
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
