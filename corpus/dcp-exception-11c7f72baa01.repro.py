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
# torch/distributed/checkpoint/default_planner.py:create_default_local_load_plan and torchrun
# exits 1; else every rank prints PASS and it exits 0.

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

if __name__ == "__main__":
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import torch.distributed as dist
    dist.init_process_group("gloo")
    attempt(dist.get_rank(), dist.get_world_size())
    print('PASS: no rank raised', flush=True)
    os._exit(0)  # a rank must not wait for the others at exit
