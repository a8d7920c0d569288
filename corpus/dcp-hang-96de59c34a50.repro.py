#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=87e3671b7d30ca95 sources=001b716bb8af1bc0 seconds=11751.2
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
import tempfile
from torch import nn

@dataclass()
class Options:
    full_state_dict: object = False
    cpu_offload: object = False
    broadcast_from_rank0: object = False

class DcpItem(str, enum.Enum):
    APP = 'app'

@dataclass
class Composed:
    model: object

@dataclass
class Side:
    composed: object

    @property
    def model(self):
        return self.composed.model

def build_side():
    build_model_out = nn.Linear(2, 2)
    composed = Composed(model=build_model_out)
    return Side(composed=composed)

class App:

    def __init__(self, side, get, put):
        self.side, self.get, self.put = (side, get, put)

    def state_dict(self):
        from torch.distributed.checkpoint.state_dict import get_state_dict
        msd, osd = get_state_dict(self.side.model, self.side.opt, options=self.get)
        return {'model': msd, 'optimizer': osd}

    def load_state_dict(self, state_dict):
        from torch.distributed.checkpoint.state_dict import set_state_dict
        set_state_dict(self.side.model, self.side.opt, model_state_dict=state_dict['model'], optim_state_dict=state_dict['optimizer'], options=self.put)

def attempt(rank, world_size):
    get_save = Options()
    get_load = Options(full_state_dict=True, cpu_offload=True)
    put = Options(full_state_dict=True, broadcast_from_rank0=True)
    dcp_root_out = tempfile.gettempdir()
    src = build_side()
    params = src.model.parameters()
    src.opt = torch.optim.SGD(params, momentum=0.9)
    out = {}
    out[DcpItem.APP] = App(src, get_save, put)
    values = out
    order = range(1)
    state = {(DcpItem.APP,)[i].value: values[DcpItem.APP] for i in order if (DcpItem.APP,)[i] in values}
    import torch.distributed.checkpoint as dcp
    dcp.save(state, checkpoint_id=dcp_root_out)
    tgt = build_side()
    params_ = tgt.model.parameters()
    tgt.opt = torch.optim.SGD(params_, momentum=0.9)
    out_ = {}
    out_[DcpItem.APP] = App(tgt, get_load, put)
    values = out_
    order_ = range(1)
    state = {(DcpItem.APP,)[i_].value: values[DcpItem.APP] for i_ in order_ if (DcpItem.APP,)[i_] in values}
    dcp.load(state, checkpoint_id=dcp_root_out)

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
