#!/usr/bin/env python3
# shardfuzz printed reproducer: entry=93f443fd28251a3e seconds=47.9
# Printed from the case by shardfuzz (python -m fuzz repro).
# Known torch bug: FileSystemWriter(cache_staged_state_dict=True) pins its staging copy:
# async_save fails on a host without an accelerator; upstream: none found.
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


class Conv(nn.Conv1d):
    """A one-tap Conv1d over a (batch, width) activation, as a length-1 sequence."""

    def forward(self, x):
        return super().forward(x.unsqueeze(-1)).squeeze(-1)


def build():
    return nn.Sequential(Conv(1, 1, 1, bias=False)).to(torch.float64)


def compose(model):
    return FSDP(model, sharding_strategy=ShardingStrategy.FULL_SHARD, use_orig_params=True,
                device_id=torch.device("cpu"))


def train(model, opt, batches):
    for x, y in batches:
        F.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=False)


RAISED = {'RuntimeError@torch/distributed/_state_dict_utils.py:tensor_func'}


def main(rank, world_size):
    gen = torch.Generator().manual_seed(0)  # the global batches, the same on every rank
    batches = (torch.randn(world_size, 1, generator=gen, dtype=torch.float64)[rank :][:1] for _ in range(2 * 3))
    data = [(x, next(batches)) for x in batches]  # (input, target) of each step
    path = [tempfile.mkdtemp(prefix="dcp-") if rank == 0 else None]
    dist.broadcast_object_list(path)  # one fresh directory for every rank
    torch.manual_seed(0)
    model = compose(build())
    opt = torch.optim.Adam(model.parameters(), lr=0.01, eps=0.0001)
    train(model, opt, data[0:1])
    FSDP.set_state_dict_type(model, StateDictType.SHARDED_STATE_DICT)
    group = dist.new_group(backend="gloo")  # the saves' collectives run beside the training's
    writer = dcp.FileSystemWriter(path[0], cache_staged_state_dict=True)  # one writer stages every save
    saves = [os.path.join(path[0], f"early-{i}") for i in range(1)] + [path[0]]  # the last into the checkpoint's
    for k, where in enumerate(saves):
        state = {"model": model.state_dict(), "optimizer": FSDP.optim_state_dict(model, opt)}
        future = dcp.async_save(state, checkpoint_id=where, storage_writer=writer, process_group=group)
        train(model, opt, data[1 + k : 2 + k] if k < 1 else data[2:3])  # on while it is written
        future.result()  # written


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
