#!/usr/bin/env python3
# shardfuzz printed reproducer: entry=0845a1e0c476c07f seconds=41.1
# Printed from the case by shardfuzz (python -m fuzz repro).
# Known torch bug: dcp.load of an FSDP1 sharded state dict where a rank holds no chunk of a
# parameter: the planner guesses a pre-2.4 checkpoint, 'Missing key in checkpoint state_dict';
# upstream: https://github.com/pytorch/pytorch/issues/163480.
# Trains a model, saves its state with dcp.save into a fresh directory, loads it with dcp.load
# into a freshly built one and trains both on.
# Run: torchrun --nproc-per-node 2 THIS_FILE.py. Exit 1 (REPRODUCED): a rank raised the exception
# in RAISED (its type, in that function of torch); 0 (PASS): every rank ran through; 2: it failed
# another way.
import os
import re
import tempfile
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
import traceback
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
from torch.distributed.fsdp import StateDictType


class Block(nn.Module):
    def __init__(self, children, width, scale=False, buffer=False):
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(width)) if scale else None
        self.register_buffer('shift', 0.1 * torch.randn(width) if buffer else None)

    def forward(self, x):
        y = x
        for child in self.children():
            y = child(y)
        y = y if self.scale is None else y * self.scale
        y = y if self.shift is None else y + self.shift
        return y


class Scalars:  # a Stateful holding Python scalars

    def __init__(self, values):
        self.values = dict(values)

    def state_dict(self):
        return dict(self.values)

    def load_state_dict(self, state_dict):
        self.values = dict(state_dict)


def build():
    return Block([
        nn.Linear(1, 1),
        Block([nn.Linear(1, 1), nn.Tanh(), nn.LayerNorm(1)], 1, scale=True),
        nn.Linear(1, 1, bias=False),
    ], 1, buffer=True)


def compose(model):
    return FSDP(model, sharding_strategy=ShardingStrategy.FULL_SHARD, use_orig_params=True,
                device_id=torch.device("cpu"))


def train(model, opt, batches):
    for x, y in batches:
        F.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()


RAISED = {
    'CheckpointException@torch/distributed/checkpoint/default_planner.py:create_default_local_load_plan',
}


def main(rank, world_size):
    gen = torch.Generator().manual_seed(34)  # the global batches, the same on every rank
    batches = (torch.randn(world_size * 2, 1, generator=gen)[rank * 2 :][:2] for _ in range(2 * 3))
    data = [(x, next(batches)) for x in batches]  # (input, target) of each step
    path = [tempfile.mkdtemp(prefix="dcp-") if rank == 0 else None]
    dist.broadcast_object_list(path)  # one fresh directory for every rank
    scalars = {  # what the scalars entry saves
        'step': 2, 'loss': 4.857142857142857, 'tag': 'case-34', 'done': False,
        'history': [11.333333333333334, -1.5, 1e-300],
    }
    torch.manual_seed(34)
    model = compose(build())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train(model, opt, data[0:2])
    FSDP.set_state_dict_type(model, StateDictType.SHARDED_STATE_DICT)
    state = {"model": model.state_dict(), "scalars": Scalars(scalars)}
    dcp.save(state, checkpoint_id=path[0])
    torch.manual_seed(34 + 0x5EED)  # other weights: a load that does nothing shows
    target = compose(build())
    FSDP.set_state_dict_type(target, StateDictType.SHARDED_STATE_DICT)
    state = {"model": target.state_dict(), "scalars": Scalars({k: type(v)() for k, v in scalars.items()})}
    dcp.load(state, checkpoint_id=path[0])  # in place
    target.load_state_dict(state["model"])


if __name__ == "__main__":
    try:
        dist.init_process_group("gloo")
        main(dist.get_rank(), dist.get_world_size())
        dist.barrier()
    except BaseException as e:  # DCP's CheckpointException is one; its text has the ranks' tracebacks
        text = traceback.format_exc()
        frames = re.findall(r'File "[^"]*/(torch/[^"-]+)", line \d+, in (?!<\w+comp>)(\S+)', text)  # torch's own
        raised = f"{type(e).__name__}@{':'.join(frames[-1]) if frames else '?'}"
        said = "REPRODUCED" if raised in RAISED else "FAIL (another failure)"
        print(f"{text}{said}: rank {os.environ.get('RANK')} raised {raised}", flush=True)
        os._exit(1 if raised in RAISED else 2)
    print("PASS: no rank raised", flush=True)
    os._exit(0)
