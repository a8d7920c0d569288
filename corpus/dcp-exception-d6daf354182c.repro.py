#!/usr/bin/env python3
# shardfuzz printed reproducer: entry=bc8ec400c405abdb seconds=46.6
# Printed from the case by shardfuzz (python -m fuzz repro).
# Known torch bug: dcp.async_save's default stager calls data_ptr() on ShardedTensors; upstream:
# none found.
# Trains a model and saves its state with dcp.save into a fresh directory: the case fails there
# (what would follow is not printed).
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


def build():
    return Block([
        nn.Linear(4, 4),
        Block([nn.Linear(4, 4), nn.Tanh(), nn.LayerNorm(4)], 4, scale=True),
        nn.Linear(4, 4, bias=False),
    ], 4, buffer=True)


def compose(model):
    return FSDP(model, sharding_strategy=ShardingStrategy.FULL_SHARD, use_orig_params=True,
                device_id=torch.device("cpu"))


def train(model, opt, batches):
    for x, y in batches:
        F.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()


RAISED = {'RuntimeError@torch/distributed/_shard/sharded_tensor/api.py:dispatch'}


def main(rank, world_size):
    gen = torch.Generator().manual_seed(35)  # the global batches, the same on every rank
    batches = (torch.randn(world_size * 2, 4, generator=gen)[rank * 2 :][:2] for _ in range(2 * 3))
    data = [(x, next(batches)) for x in batches]  # (input, target) of each step
    path = [tempfile.mkdtemp(prefix="dcp-") if rank == 0 else None]
    dist.broadcast_object_list(path)  # one fresh directory for every rank
    torch.manual_seed(35)
    model = compose(build())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train(model, opt, data[0:2])
    FSDP.set_state_dict_type(model, StateDictType.SHARDED_STATE_DICT)
    state = {"model": model.state_dict()}
    dcp.async_save(state, checkpoint_id=path[0]).result()  # written


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
