#!/usr/bin/env python3
# shardfuzz printed reproducer: entry=8b7ebc3b68aad9f0 seconds=19.1
# Printed from the case by shardfuzz (python -m fuzz repro).
# Known torch bug: fully_shard with an int reshard_after_forward and Shard(1) placements:
# IndexError in foreach_all_gather_copy_out, or (a dim-1 size the post-forward mesh splits
# unevenly) as_strided out of bounds in to_sharded_post_forward; upstream: none found.
# Runs the case's training.
# Run: torchrun --nproc-per-node 4 THIS_FILE.py. Exit 1 (REPRODUCED): a rank raised the exception
# in RAISED (its type, in that function of torch); 0 (PASS): every rank ran through; 2: it failed
# another way.
import os
import re
import torch
import torch.distributed as dist
import torch.nn.functional as F
import traceback
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Shard


def on_dim1(p):  # Shard(1) where it splits evenly, else Shard(0) (uneven sharding: dim 0 only)
    return Shard(1) if p.ndim > 1 and p.shape[1] % 4 == 0 else None


def main(rank, world_size):
    torch.manual_seed(0)  # every rank builds the same weights
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    fully_shard(model.get_submodule("1"), reshard_after_forward=2, shard_placement_fn=on_dim1)
    fully_shard(model, reshard_after_forward=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(0)
    x, y = (torch.randn(world_size, 4, generator=gen)[rank :][:1] for _ in range(2))
    F.mse_loss(model(x), y).backward()
    opt.step()
    opt.zero_grad()


RAISED = {'IndexError@torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:foreach_all_gather_copy_out'}


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
