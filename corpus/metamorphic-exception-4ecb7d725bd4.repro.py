#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=046d6314125fae89 sources=ce057bc0da65e4dc seconds=712.7
# Reproduces shardfuzz corpus entry metamorphic-exception-4ecb7d725bd4.json: exception:metamorphic:builtins.IndexError@torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:foreach_all_gather_copy_out
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

class PointwiseConv1d(nn.Conv1d):

    def forward(self, x):
        return super().forward(x.unsqueeze(-1))

def _placement_fn():
    from torch.distributed.tensor import Shard

    def fn(param):
        return Shard(1)
    return fn

def attempt(rank, world_size):
    build_model_out = PointwiseConv1d(4, 4, kernel_size=1, bias=False)
    from torch.distributed.fsdp import fully_shard
    kwargs = {'reshard_after_forward': 2, 'shard_placement_fn': _placement_fn()}
    fully_shard(build_model_out, **kwargs)
    x_ = torch.randn(world_size, 4)
    y_ = torch.randn(world_size, 4)
    step_ = [(x_[rank:rank + 1], y_[rank:rank + 1])]
    i, (x, y) = next(enumerate(step_))
    out = build_model_out(x)
    loss = F.mse_loss(out, y)
    loss.backward()

if __name__ == "__main__":
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import torch.distributed as dist
    dist.init_process_group("gloo")
    attempt(dist.get_rank(), dist.get_world_size())
    print('PASS: no rank raised', flush=True)
    os._exit(0)  # a rank must not wait for the others at exit
