#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=71d9601af2884473 sources=c819ef517160c7c9 seconds=568.8
# Reproduces shardfuzz corpus entry parity-exception-3e90c3cc368a.json: exception:parity:builtins.ValueError@torch/utils/checkpoint.py:_checkpoint_without_reentrant_generator
# Known torch bug: composable checkpoint(module, debug=True) raises ValueError 'debug=True is
# incompatible with non-default context_fn' on the first forward whatever the caller passes: it
# always hands torch.utils.checkpoint a context_fn of its own; upstream:
# https://github.com/pytorch/pytorch/issues/185285.
# Observed: composable checkpoint(debug=True) always raises ValueError 'debug=True is incompatible
# with non-default context_fn' (it passes torch.utils.checkpoint a context_fn of its own); met ...
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: while the failure is there a rank raises
# builtins.ValueError in torch/utils/checkpoint.py:_checkpoint_without_reentrant_generator and
# torchrun exits 1; else every rank prints PASS and it exits 0.

from __future__ import annotations
import torch
from torch import nn

def attempt(rank, world_size):
    build_model_out = nn.Linear(4, 4)
    from torch.distributed._composable import checkpoint
    kwargs = {'debug': True}
    checkpoint(build_model_out, **kwargs)
    lo = rank * 2
    x_ = torch.randn(4, 4)
    y_ = torch.randn(4, 4)
    step_ = [(x_[lo:lo + 2], y_[lo:lo + 2])]
    i, (x, y) = next(enumerate(step_))
    out = build_model_out(x)

if __name__ == "__main__":
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import torch.distributed as dist
    dist.init_process_group("gloo")
    attempt(dist.get_rank(), dist.get_world_size())
    print('PASS: no rank raised', flush=True)
    os._exit(0)  # a rank must not wait for the others at exit
