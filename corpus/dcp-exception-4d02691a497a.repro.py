#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=32bab302165bedb8 sources=9d7be58e4208c9df seconds=730.1
# Reproduces shardfuzz corpus entry dcp-exception-4d02691a497a.json: exception:dcp:builtins.IndexError@torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:foreach_all_gather_copy_out
# Known torch bug: fully_shard with an int reshard_after_forward and Shard(1) placements:
# IndexError in foreach_all_gather_copy_out; upstream: none found.
# Observed: rank 0 raised builtins.IndexError: list index out of range
# Run: torchrun --nproc-per-node 4 THIS_FILE.py: while the failure is there a rank raises
# builtins.IndexError in
# torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:foreach_all_gather_copy_out and
# torchrun exits 1; else every rank prints PASS and it exits 0.

from __future__ import annotations
import torch
from torch import nn
import torch.nn.functional as F

def _placement_fn():
    from torch.distributed.tensor import Shard

    def fn(param):
        return Shard(1) if param.ndim > 1 else None
    return fn

def attempt(rank, world_size):
    x = torch.randn(world_size, 4)
    y = torch.randn(world_size, 4)
    step_ = [(x[rank:rank + 1], y[rank:rank + 1])]
    build_model_out = nn.Linear(4, 4)
    from torch.distributed.fsdp import fully_shard
    kwargs = {'reshard_after_forward': 2, 'shard_placement_fn': _placement_fn()}
    fully_shard(build_model_out, **kwargs)
    data_ = [step_[0]][:1]
    x_, y_ = next(iter(data_))
    loss = F.mse_loss(build_model_out(x_), y_)
    loss.backward()

if __name__ == "__main__":
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import torch.distributed as dist
    dist.init_process_group("gloo")
    attempt(dist.get_rank(), dist.get_world_size())
    print('PASS: no rank raised', flush=True)
    os._exit(0)  # a rank must not wait for the others at exit
