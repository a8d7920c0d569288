#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=87e3671b7d30ca95 sources=001b716bb8af1bc0 seconds=11751.2
# Reproduces shardfuzz corpus entry dcp-hang-96de59c34a50.json: hang:dcp@torch/distributed/_state_dict_utils.py:_broadcast_state_dict:rank0-alone
# Known torch bug: set_state_dict(broadcast_from_rank0=True) deadlocks when ranks other than 0
# pass an empty model state dict; upstream: https://github.com/pytorch/pytorch/issues/157781.
# Observed: rank 0 broadcasts state in _broadcast_state_dict that rank(s) [1] skipped (rank(s) 0,
# 1 missed the deadline in torch/distributed/distributed_c10d.py:broadcast)
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: while the failure is there a rank prints
# REPRODUCED and exits 1; once it is gone rank 0 prints PASS and every rank exits 0 (expected:
# every rank finishes); a rank exits 2 where the script cannot run (not under torchrun, another
# world size) or the case fails another way (it prints FAIL). torchrun's own status is 1 whenever
# a rank's is not 0.

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

def torch_frame(path: str, function: str) -> str | None:
    at = path.rfind('/torch/')
    inner = path[at + 1:]
    if at < 0 or '/fuzz/' in path or '-packages/' in inner or (function in ('<listcomp>', '<dictcomp>', '<setcomp>')):
        return None
    return f'{inner}:{function}'


def main():
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import sys
    import time
    if os.environ.get("WORLD_SIZE") != "2":
        print("run it with: torchrun --nproc-per-node 2 " + sys.argv[0], file=sys.stderr)
        sys.exit(2)
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    import threading
    import traceback
    finished = threading.Event()

    def watch():
        time.sleep(20)
        if finished.is_set():
            return
        stack = traceback.extract_stack(sys._current_frames()[threading.main_thread().ident])
        frames = [torch_frame(f.filename, f.name) for f in stack]
        print(f"rank {rank} is still in the case after 20 s:", file=sys.stderr)
        sys.stderr.write("".join(traceback.format_list(stack)))
        if any(f in ['torch/distributed/_state_dict_utils.py:_broadcast_state_dict'] for f in frames):
            print(f"REPRODUCED hang:dcp@torch/distributed/_state_dict_utils.py:_broadcast_state_dict:rank0-alone: rank {rank} is stuck", flush=True)
            os._exit(1)
        where = ([f for f in frames if f] or ["?"])[-1]
        print(f"FAIL (not the entry's failure): rank {rank} is still running, in {where}", flush=True)
        os._exit(2)

    threading.Thread(target=watch, daemon=True).start()
    attempt(rank, world_size)
    finished.set()
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
    store.add("repro-passed", 1)
    until = time.monotonic() + 60
    while store.add("repro-passed", 0) < world_size:
        if time.monotonic() > until:
            print(f"FAIL (not the entry's failure): rank {rank} finished, another rank did not", flush=True)
            os._exit(2)
        time.sleep(0.05)
    if rank == 0:
        print('PASS: every rank finished', flush=True)
    os._exit(0)  # a rank must not wait for the others at exit


if __name__ == "__main__":
    main()
