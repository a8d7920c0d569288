#!/usr/bin/env python3
# shardfuzz printed reproducer: entry=32bab302165bedb8 seconds=26.4
# Printed from the case by shardfuzz (python -m fuzz repro).
# Known torch bug: fully_shard with an int reshard_after_forward and Shard(1) placements:
# IndexError in foreach_all_gather_copy_out, or (a dim-1 size the post-forward mesh splits
# unevenly) as_strided out of bounds in to_sharded_post_forward; upstream: none found.
# Trains a model: the case fails there (what would follow is not printed).
# Run: torchrun --nproc-per-node 4 THIS_FILE.py. Exit 1 (REPRODUCED): a rank raised the exception
# in RAISED (its type, in that function of torch); 0 (PASS): every rank ran through; 2: it failed
# another way.
import os
import re
import tempfile
import torch
import torch.distributed as dist
import torch.nn.functional as F
import traceback
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Shard


def build():
    return nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))


def on_dim1(p):  # Shard(1) where it splits evenly, else Shard(0) (uneven sharding: dim 0 only)
    return Shard(1) if p.ndim > 1 and p.shape[1] % 4 == 0 else None


def compose(model):
    fully_shard(model.get_submodule("1"), reshard_after_forward=2, shard_placement_fn=on_dim1)
    fully_shard(model, reshard_after_forward=True)
    return model


def train(model, opt, batches):
    for x, y in batches:
        F.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()


RAISED = {'IndexError@torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:foreach_all_gather_copy_out'}


def main(rank, world_size):
    gen = torch.Generator().manual_seed(0)  # the global batches, the same on every rank
    batches = (torch.randn(world_size, 4, generator=gen)[rank :][:1] for _ in range(2 * 1))
    data = [(x, next(batches)) for x in batches]  # (input, target) of each step
    path = [tempfile.mkdtemp(prefix="dcp-") if rank == 0 else None]
    dist.broadcast_object_list(path)  # one fresh directory for every rank
    torch.manual_seed(0)
    model = compose(build())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train(model, opt, data[0:1])


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
