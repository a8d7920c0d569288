#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=0845a1e0c476c07f sources=9d7be58e4208c9df seconds=1534.9
# Reproduces shardfuzz corpus entry dcp-exception-11c7f72baa01.json: exception:dcp:torch.distributed.checkpoint.api.CheckpointException@torch/distributed/checkpoint/default_planner.py:create_default_local_load_plan
# Known torch bug: dcp.load of an FSDP1 sharded state dict where a rank holds no chunk of a
# parameter: the planner guesses a pre-2.4 checkpoint, 'Missing key in checkpoint state_dict';
# upstream: https://github.com/pytorch/pytorch/issues/163480.
# Observed: rank 0 raised torch.distributed.checkpoint.api.CheckpointException:
# CheckpointException ranks:dict_keys([1]) Traceback (most recent call last): (RANK 1) File ...
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: while the failure is there a rank raises
# torch.distributed.checkpoint.api.CheckpointException in
# torch/distributed/checkpoint/default_planner.py:create_default_local_load_plan, prints its
# traceback and REPRODUCED and exits 1; once it is gone rank 0 prints PASS and every rank exits 0
# (expected: no rank raises); a rank exits 2 where the script cannot run (not under torchrun,
# another world size) or the case fails another way (it prints FAIL). torchrun's own status is 1
# whenever a rank's is not 0.

from __future__ import annotations
import torch
import enum
import json
import os
import tempfile
from torch import nn
from dataclasses import dataclass, field, replace
import hashlib

@dataclass
class RankContext:
    rank: object
    world_size: object
    device: object
    backend: object

@dataclass()
class Block:
    children: object

@dataclass()
class ModuleTree:
    width: object
    root: object

@dataclass()
class Composition:
    pass

@dataclass()
class Training:
    pass

class Body:
    pass

class DcpItem(str, enum.Enum):
    MODEL = 'model'
    SCALARS = 'scalars'

@dataclass()
class DcpBody(Body):
    tree: object
    source: object
    target: object
    entries: object
    training: object = field()

class TreeBlock(nn.Module):

    def __init__(self, children, scale):
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(1)) if scale else None

class Scalars:

    def __init__(self, values):
        self.values = dict(values)

    def state_dict(self):
        return dict(self.values)

    def load_state_dict(self, state_dict):
        ...

def attempt(rank, world_size):
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    body = DcpBody(tree=ModuleTree(width=1, root=Block(children=())), source=Composition(), target=Composition(), entries=(), training=Training())
    case_to_json_out = None
    case_to_text_out = json.dumps(case_to_json_out)
    digest = hashlib.sha1(case_to_text_out.encode()).hexdigest()[:12]
    count = getattr(ctx, '_cases', 0)
    driver_pid = os.environ.get('SHARDFUZZ_PARENT_PID', os.getppid())
    dcp_root_out = os.path.join(tempfile.gettempdir(), f'shardfuzz-dcp-{driver_pid}')
    path = os.path.join(dcp_root_out, f'{digest}-{count}')
    own = path
    build_model_out = TreeBlock([TreeBlock([], True)], False)
    model = build_model_out
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP_
    kwargs___ = {'device_id': torch.device('cpu')}
    wrap_out = FSDP_(model, **kwargs___)
    from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig, ShardedOptimStateDictConfig, ShardedStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    FSDP.set_state_dict_type(wrap_out, StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig(), ShardedOptimStateDictConfig())
    out = {}
    for entry in (DcpItem.MODEL, DcpItem.SCALARS):
        if entry is DcpItem.MODEL:
            out[entry] = wrap_out
        else:
            out[entry] = Scalars({})
    values = out
    order = body.orders[rank] if () else range(2)
    state = {(DcpItem.MODEL, DcpItem.SCALARS)[i].value: values[(DcpItem.MODEL, DcpItem.SCALARS)[i]] for i in order if (DcpItem.MODEL, DcpItem.SCALARS)[i] in values}
    import torch.distributed.checkpoint as dcp
    kwargs_ = {}
    kwargs_['checkpoint_id'] = own
    kwargs = kwargs_
    dcp.save(state, **kwargs)
    import torch.distributed.checkpoint as dcp_
    kwargs__ = {}
    dcp_.load(state, checkpoint_id=own, **kwargs__)

def torch_frame(path: str, function: str) -> str | None:
    at = path.rfind('/torch/')
    inner = path[at + 1:]
    if at < 0 or '/fuzz/' in path or '-packages/' in inner or (function in ('<listcomp>', '<dictcomp>', '<setcomp>')):
        return None
    return f'{inner}:{function}'


if __name__ == "__main__":
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
    import re
    import traceback
    try:
        attempt(rank, world_size)
    except BaseException as e:  # torch's CheckpointException is a BaseException
        text = traceback.format_exc()
        sys.stderr.write("".join(f"[rank{rank}]: {line}\n" for line in text.splitlines()))
        frames = [f for f in (torch_frame(p, f) for p, f in re.findall(r'File "([^"]+)", line \d+,? in (\S+)', text)) if f]
        found = f"{type(e).__module__}.{type(e).__qualname__}@{(frames or ['torch/?:?'])[-1]}"
        if found in ['torch.distributed.checkpoint.api.CheckpointException@torch/distributed/checkpoint/default_planner.py:create_default_local_load_plan']:
            print(f"REPRODUCED exception:dcp:torch.distributed.checkpoint.api.CheckpointException@torch/distributed/checkpoint/default_planner.py:create_default_local_load_plan: rank {rank} raised {found}", flush=True)
            os._exit(1)
        print(f"FAIL (not the entry's failure): rank {rank} raised {found}", flush=True)
        os._exit(2)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
    store.add("repro-passed", 1)
    until = time.monotonic() + 60
    while store.add("repro-passed", 0) < world_size:
        if time.monotonic() > until:
            print(f"FAIL (not the entry's failure): rank {rank} finished, another rank did not", flush=True)
            os._exit(2)
        time.sleep(0.05)
    if rank == 0:
        print('PASS: no rank raised', flush=True)
    os._exit(0)  # a rank must not wait for the others at exit
