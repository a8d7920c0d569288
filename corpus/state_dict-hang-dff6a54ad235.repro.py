#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=905c6279a12f4664 sources=73c958e26ffedc4f seconds=7291.7
# Reproduces shardfuzz corpus entry state_dict-hang-dff6a54ad235.json: hang:state_dict@torch/distributed/_state_dict_utils.py:_broadcast_state_dict:rank0-alone
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
from dataclasses import dataclass, field
import torch
from torch import nn
import torch.distributed as dist
import inspect
from dataclasses import replace

@dataclass(frozen=True)
class Composition:
    shards: object = ()

@dataclass(frozen=True)
class Training:
    lr: object = 0.1
    momentum: object = 0.0
    eps: object = 0.001
    steps: object = 2
    batch_per_rank: object = 2
    foreach: object = None

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
    schedule: object = ()

    @property
    def model(self):
        return self.composed.model

def build_side(comp, training, *, seed, schedule=()):
    torch.manual_seed(seed)
    build_model_out = nn.Sequential(nn.Linear(2, 2, bias=True))
    model = build_model_out.to(torch.float32)
    composed = Composed(model=model, fsdp_roots=[model.get_submodule('')])
    return Side(composed=composed, comp=comp, training=training, schedule=schedule)

def run_state_dict(ctx):
    t = Training(momentum=0.9, steps=1, batch_per_rank=1)
    src = build_side(Composition(shards=('',)), t, seed=0, schedule=())
    params__ = list(src.model.parameters())
    src.opt = torch.optim.SGD(params__, lr=0.1, momentum=0.9, foreach=None)
    from torch.distributed.checkpoint.state_dict import get_state_dict, StateDictOptions
    extra = {}
    params = inspect.signature(StateDictOptions).parameters
    missing = sorted((k for k in extra if k not in params))
    options = StateDictOptions(full_state_dict=True, cpu_offload=False, broadcast_from_rank0=False, strict=True, **extra)
    msd, osd = get_state_dict(src.model, src.opt, options=options)
    tgt = build_side(Composition(shards=('',)), t, seed=FRESH_SEED, schedule=())
    training = replace(t, lr=0.037, momentum=0.5, eps=0.01)
    params___ = list(tgt.model.parameters())
    tgt.opt = torch.optim.SGD(params___, lr=0.037, momentum=0.5, foreach=None)
    tgt.opt
    obs = {'losses_before': None, 'dropped': []}
    if True and ctx != 0:
        msd, osd = ({}, {})
    from torch.distributed.checkpoint.state_dict import set_state_dict
    extra_ = {}
    params_ = inspect.signature(StateDictOptions).parameters
    options_ = StateDictOptions(full_state_dict=True, cpu_offload=False, broadcast_from_rank0=True, strict=True, **extra_)
    assert tgt.opt is not None
    result_ = set_state_dict(tgt.model, tgt.opt, model_state_dict=msd, optim_state_dict=osd, options=options_)
    return obs

def attempt(rank, world_size):
    import torch
    run_state_dict(rank)

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
            print(f"REPRODUCED hang:state_dict@torch/distributed/_state_dict_utils.py:_broadcast_state_dict:rank0-alone: rank {rank} is stuck", flush=True)
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
