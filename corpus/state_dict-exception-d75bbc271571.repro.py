#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=af1b565e41fad220 sources=2836a7ca10136e42 seconds=433.1
# Reproduces shardfuzz corpus entry state_dict-exception-d75bbc271571.json: exception:state_dict:builtins.AssertionError@torch/distributed/checkpoint/state_dict.py:_load_optim_state_dict
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
    params = list(module.parameters())
    src_opt = torch.optim.SGD(params)
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
    msd_ = get_model_state_dict(module)
    msd, osd = (msd_, get_optimizer_state_dict(module, src_opt))
    module_ = nn.Linear(2, 2)
    params_ = list(module_.parameters())
    tgt_opt = torch.optim.SGD(params_)
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict, StateDictOptions
    options_ = StateDictOptions(full_state_dict=True)
    set_optimizer_state_dict(module_, tgt_opt, osd, options=options_)

if __name__ == "__main__":
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import torch.distributed as dist
    dist.init_process_group("gloo")
    attempt(dist.get_rank(), dist.get_world_size())
    print('PASS: no rank raised', flush=True)
    os._exit(0)  # a rank must not wait for the others at exit
