#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=3951471a63742290 sources=c819ef517160c7c9 seconds=358.4
# Reproduces shardfuzz corpus entry parity-exception-f2ce67efc316.json: exception:parity:builtins.RuntimeError@torch/optim/sgd.py:_multi_tensor_sgd
# Known torch bug: foreach optimizers over a mix of DTensor (fully_shard) and plain (replicate)
# parameters raise; upstream: https://github.com/pytorch/pytorch/issues/183207.
# Observed: rank 0 raised builtins.RuntimeError: aten._foreach_add_.List got mixed torch.Tensor
# and DTensor, need to convert all torch.Tensor to DTensor before calling distributed operators!
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: while the failure is there a rank raises
# builtins.RuntimeError in torch/optim/sgd.py:_multi_tensor_sgd and torchrun exits 1; else every
# rank prints PASS and it exits 0.

from __future__ import annotations
import torch
from torch import nn
import torch.nn.functional as F

def attempt(rank, world_size):
    build_model_out = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    from torch.distributed.fsdp import fully_shard
    modules = [build_model_out.get_submodule('0')]
    fully_shard(modules[0])
    params = build_model_out.parameters()
    opt = torch.optim.SGD(params, foreach=True)
    x_ = torch.randn(world_size, 2)
    y_ = torch.randn(world_size, 2)
    step_ = [(x_[rank:rank + 1], y_[rank:rank + 1])]
    i, (x, y) = next(iter(enumerate(step_)))
    out = build_model_out(x)
    loss = F.mse_loss(out, y)
    loss.backward()
    opt.step()

if __name__ == "__main__":
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import torch.distributed as dist
    dist.init_process_group("gloo")
    attempt(dist.get_rank(), dist.get_world_size())
    print('PASS: no rank raised', flush=True)
    os._exit(0)  # a rank must not wait for the others at exit
