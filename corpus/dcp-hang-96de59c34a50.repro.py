#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=87e3671b7d30ca95 sources=001b716bb8af1bc0 seconds=11140.7
# Reproduces shardfuzz corpus entry dcp-hang-96de59c34a50.json: hang:dcp@torch/distributed/_state_dict_utils.py:_broadcast_state_dict:rank0-alone
# Known torch bug: set_state_dict(broadcast_from_rank0=True) deadlocks when ranks other than 0
# pass an empty model state dict; upstream: https://github.com/pytorch/pytorch/issues/157781.
# Observed: rank 0 broadcasts state in _broadcast_state_dict that rank(s) [1] skipped (rank(s) 0,
# 1 missed the deadline in torch/distributed/distributed_c10d.py:broadcast)
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: prints REPRODUCED and exits 1 while the failure
# is there, else exits 0 (expected: every rank finishes).

from __future__ import annotations
from dataclasses import dataclass
import torch
import enum
from dataclasses import replace
import json
import os
import tempfile
from torch import nn
import hashlib

@dataclass
class RankContext:
    rank: object
    device: object

@dataclass(frozen=True)
class ShardSpec:
    path: object

@dataclass(frozen=True)
class Composition:
    shards: object = ()

@dataclass(frozen=True)
class Training:
    lr: object = 0.1
    momentum: object = 0.0
    eps: object = 0.001
    steps: object = 2

@dataclass(frozen=True)
class Options:
    full_state_dict: object = False
    cpu_offload: object = False
    broadcast_from_rank0: object = False
    strict: object = True
    ignore_frozen_params: object = False
    flatten_optimizer_state_dict: object = False

class DcpItem(str, enum.Enum):
    APP = 'app'

def build_model(device):
    return nn.Sequential(nn.Linear(2, 2, bias=True))

@dataclass
class Composed:
    model: object

def compose(model, comp):
    return Composed(model=model)
FRESH_SEED = 24301

@dataclass
class Side:
    composed: object
    schedule: object = ()

    @property
    def model(self):
        return self.composed.model

def build_side(comp, ctx, *, seed, schedule=()):
    device = ctx.device
    model = build_model(device).to(torch.float32)
    composed = compose(model, comp)
    return Side(composed=composed, schedule=schedule)

def body_optimizer(side, training):
    params = list(side.model.parameters())
    held = set()
    side.opt = torch.optim.SGD(params, lr=training.lr, momentum=training.momentum, foreach=None)

def state_dict_options(o):
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    extra = {n: True for n in ('ignore_frozen_params', 'flatten_optimizer_state_dict') if getattr(o, n)}
    return StateDictOptions(full_state_dict=o.full_state_dict, cpu_offload=o.cpu_offload, broadcast_from_rank0=o.broadcast_from_rank0, strict=o.strict, **extra)

def case_dir(ctx):
    case_to_text_out = json.dumps(None, sort_keys=True)
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
        msd, osd = get_state_dict(self.side.model, self.side.opt, options=state_dict_options(self.get))
        return {'model': msd, 'optimizer': osd}

    def load_state_dict(self, state_dict):
        from torch.distributed.checkpoint.state_dict import set_state_dict
        set_state_dict(self.side.model, self.side.opt, model_state_dict=state_dict['model'], optim_state_dict=state_dict['optimizer'], options=state_dict_options(self.put))

def _values(side, get, put):
    out = {}
    entry = next(iter((DcpItem.APP,)))
    out[entry] = App(side, get, put)
    return out

def _run_dcp(ctx):
    t = Training(momentum=0.9, steps=1)
    get_save = Options(full_state_dict=False, cpu_offload=False, broadcast_from_rank0=False, strict=True)
    get_load = Options(full_state_dict=True, cpu_offload=True, broadcast_from_rank0=False, strict=True)
    put = Options(full_state_dict=True, cpu_offload=True, broadcast_from_rank0=True, strict=True)
    path = '' or case_dir(ctx)
    src = build_side(Composition(shards=(ShardSpec(path=''),)), ctx, seed=0, schedule=())
    body_optimizer(src, t)
    values = _values(src, get_save, put)
    order = range(1)
    state = {(DcpItem.APP,)[i].value: values[DcpItem.APP] for i in order if (DcpItem.APP,)[i] in values}
    import torch.distributed.checkpoint as dcp
    dcp.save(state, checkpoint_id=path)
    tgt = build_side(Composition(shards=(ShardSpec(path=''),)), ctx, seed=FRESH_SEED, schedule=())
    fresh_training_out = replace(t, lr=0.037, momentum=0.5, eps=0.01)
    body_optimizer(tgt, fresh_training_out)
    values = _values(tgt, get_load, put)
    order_ = range(1)
    state = {(DcpItem.APP,)[i_].value: values[DcpItem.APP] for i_ in order_ if (DcpItem.APP,)[i_] in values}
    dcp.load(state, checkpoint_id=path)

def attempt(rank, world_size):
    import torch
    ctx = RankContext(rank=rank, device=torch.device('cpu'))
    _run_dcp(ctx)

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
        if any((f'torch/{f.filename.rpartition("/torch/")[2]}:{f.name}' in ['torch/distributed/_state_dict_utils.py:_broadcast_state_dict'] for f in frames)):
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
