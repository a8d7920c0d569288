#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=891107a19cd069f6 sources=9d7be58e4208c9df seconds=77.4
# Reproduces shardfuzz corpus entry dcp-exception-e248d03a903f.json: exception:dcp:builtins.AssertionError@torch/distributed/checkpoint/state_dict.py:_load_optim_state_dict
# Known torch bug: set_optimizer_state_dict(full_state_dict=True) for an optimizer without tensor
# state: 'Expected device to be set'; upstream: https://github.com/pytorch/pytorch/issues/133415.
# Observed: rank 0 raised builtins.AssertionError: Expected device to be set
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: while the failure is there a rank raises
# builtins.AssertionError in torch/distributed/checkpoint/state_dict.py:_load_optim_state_dict and
# torchrun exits 1; else every rank prints PASS and it exits 0.

from __future__ import annotations
import torch
from torch import nn

def attempt(rank, world_size):
    module = nn.Linear(2, 2)
    model = module.to(torch.float32)
    params = list(model.parameters())
    tgt_opt = torch.optim.SGD(params)
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
    out_optimizer = get_optimizer_state_dict(model, tgt_opt)
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict, StateDictOptions
    options = StateDictOptions(full_state_dict=True)
    set_optimizer_state_dict(model, tgt_opt, out_optimizer, options=options)

if __name__ == "__main__":
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import torch.distributed as dist
    dist.init_process_group("gloo")
    attempt(dist.get_rank(), dist.get_world_size())
    print('PASS: no rank raised', flush=True)
    os._exit(0)  # a rank must not wait for the others at exit
