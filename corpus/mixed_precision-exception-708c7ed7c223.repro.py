#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=b29b69107395f153 sources=c819ef517160c7c9 seconds=704.9
# Reproduces shardfuzz corpus entry mixed_precision-exception-708c7ed7c223.json: exception:mixed_precision:builtins.AttributeError@torch/distributed/fsdp/_fully_shard/_fsdp_param.py:to_accumulated_grad_if_needed
# Known torch bug: MixedPrecisionPolicy(reduce_dtype) with set_requires_gradient_sync(False): a
# unit that never ran forward has no '_unsharded_param' in the root's post-backward; upstream:
# https://github.com/pytorch/pytorch/issues/194058.
# Observed: rank 0 raised builtins.AttributeError: 'FSDPParam' object has no attribute
# '_unsharded_param'
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: while the failure is there a rank raises
# builtins.AttributeError in
# torch/distributed/fsdp/_fully_shard/_fsdp_param.py:to_accumulated_grad_if_needed and torchrun
# exits 1; else every rank prints PASS and it exits 0.

from __future__ import annotations
import torch
from torch import nn
import torch.nn.functional as F

class TreeBlock(nn.Module):

    def __init__(self, children):
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(12))

    def forward(self, x):
        y = x
        y = y * self.scale
        return x + y

def attempt(rank, world_size):
    build_model_out = TreeBlock([nn.LayerNorm(12), nn.LayerNorm(12)])
    from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
    mp_policy_out = MixedPrecisionPolicy(reduce_dtype=torch.float32)
    modules = [build_model_out.get_submodule('1')]
    fully_shard(modules[0], mp_policy=mp_policy_out)
    modules = [build_model_out]
    fully_shard(modules[0])
    lo = rank * 2
    x_ = torch.randn(4, 12)
    y_ = torch.randn(4, 12)
    step_ = [(x_[lo:lo + 2], y_[lo:lo + 2])]
    i, (x, y) = next(iter(enumerate(step_)))
    build_model_out.set_requires_gradient_sync(False)
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
