#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=6d0f1782b1a74e14 sources=c819ef517160c7c9 seconds=677.1
# Reproduces shardfuzz corpus entry parity-exception-86a14603f6de.json: exception:parity:builtins.RuntimeError@torch/nn/parallel/distributed.py:_clear_grad_buffer
# Known torch bug: DistributedDataParallel(delay_all_reduce_named_params=...,
# param_to_hook_all_reduce=...) over parameters that are not float32: the delayed gradients'
# buffer is made with torch.zeros and no dtype, and _clear_grad_buffer raises 'attempting to
# assign a gradient with dtype 'float' to a tensor with grad_dtype 'Double''; upstream: none
# found.
# Observed: replicate with delay_all_reduce_named_params over float64 parameters: DDP's delayed-
# gradient buffer is float32 (torch.zeros without a dtype) and _clear_grad_buffer raises on ...
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: while the failure is there a rank raises
# builtins.RuntimeError in torch/nn/parallel/distributed.py:_clear_grad_buffer and torchrun exits
# 1; else every rank prints PASS and it exits 0.

from __future__ import annotations
import torch
from torch import nn

def attempt(rank, world_size):
    build_model_out = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    model_ = build_model_out.to(torch.float64)
    from torch.distributed._composable import replicate
    plan = ('0', ())
    hook, delayed = plan
    kwargs = {'param_to_hook_all_reduce': model_.get_submodule(hook).get_parameter('bias'), 'delay_all_reduce_named_params': [(i_, model_.get_submodule(p__).get_parameter(name)) for i_, (p__, name) in enumerate([('1', 'bias')])]}
    replicate(model_, **kwargs)
    lo = rank * 2
    x_ = torch.randn(4, 4, dtype=torch.float64)
    y_ = torch.randn(4, 4)
    step_ = [(x_[lo:lo + 2], y_[lo:lo + 2])]
    i, (x, y) = next(enumerate(step_))
    out = model_(x)

if __name__ == "__main__":
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import torch.distributed as dist
    dist.init_process_group("gloo")
    attempt(dist.get_rank(), dist.get_world_size())
    print('PASS: no rank raised', flush=True)
    os._exit(0)  # a rank must not wait for the others at exit
