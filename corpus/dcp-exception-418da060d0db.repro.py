#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=ddc9107588b830c3 sources=9d7be58e4208c9df seconds=431.3
# Reproduces shardfuzz corpus entry dcp-exception-418da060d0db.json: exception:dcp:builtins.KeyError@torch/distributed/checkpoint/state_dict.py:_get_optim_state_dict
# Known torch bug: a frozen fully_shard unit without resharding under a replicate'd root is never
# resharded: a leaf unfrozen later never trains (KeyError in get_optimizer_state_dict); upstream:
# none found.
# Observed: rank 0 raised builtins.KeyError: 0
# Run: torchrun --nproc-per-node 4 THIS_FILE.py: while the failure is there a rank raises
# builtins.KeyError in torch/distributed/checkpoint/state_dict.py:_get_optim_state_dict and
# torchrun exits 1; else every rank prints PASS and it exits 0.

from __future__ import annotations
import torch
from torch import nn
import torch.nn.functional as F

class PointwiseConv1d(nn.Conv1d):
    pass

def attempt(rank, world_size):
    x = torch.randn(world_size, 1)
    y = torch.randn(world_size, 1)
    step_ = [(x[rank:rank + 1], y[rank:rank + 1])]
    build_model_out = nn.Sequential(PointwiseConv1d(1, 1, kernel_size=1))
    from torch.distributed.fsdp import fully_shard
    fully_shard(build_model_out)
    params = list(build_model_out.parameters())
    src_opt = torch.optim.SGD(params)
    data_ = [step_[0]][:1]
    x_, y_ = next(iter(data_))
    loss = F.mse_loss(build_model_out(x_), y_)
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
    out__counter = get_optimizer_state_dict(build_model_out, src_opt)

if __name__ == "__main__":
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import torch.distributed as dist
    dist.init_process_group("gloo")
    attempt(dist.get_rank(), dist.get_world_size())
    print('PASS: no rank raised', flush=True)
    os._exit(0)  # a rank must not wait for the others at exit
