#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=8a961ec26fda3260 sources=1ee5b339ab4179e7 seconds=480.0
# Reproduces shardfuzz corpus entry state_dict-exception-ab49bbd468b0.json: exception:state_dict:builtins.AssertionError@torch/distributed/fsdp/_state_dict_utils.py:_common_unshard_post_state_dict_hook
# Known torch bug: FSDP1 NO_SHARD with an auto-wrapped unit of frozen parameters: state_dict()
# after training raises 'FSDP assumes ... is in the state_dict'; upstream:
# https://github.com/pytorch/pytorch/issues/85831.
# Observed: rank 0 raised builtins.AssertionError: FSDP assumes 0.weight is in the state_dict but
# the state_dict only has odict_keys(['1.0.weight', '1.0.bias']). prefix=, module_name=0., ...
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: while the failure is there a rank raises
# builtins.AssertionError in
# torch/distributed/fsdp/_state_dict_utils.py:_common_unshard_post_state_dict_hook and torchrun
# exits 1; else every rank prints PASS and it exits 0.

from __future__ import annotations
import torch
from torch import nn
import torch.nn.functional as F

def attempt(rank, world_size):
    ctx_device = torch.device('cpu')
    lo = rank * 2
    x = torch.randn(4, 2)
    y = torch.randn(4, 2)
    step_ = [(x[lo:lo + 2], y[lo:lo + 2])]
    module = nn.Linear(2, 2)
    module.requires_grad_(False)
    build_model_out = nn.Sequential(module, nn.Sequential(nn.Linear(2, 2)))
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    strategy = ShardingStrategy.NO_SHARD
    wrap_out = FSDP(build_model_out, sharding_strategy=strategy, device_id=ctx_device, use_orig_params=True, auto_wrap_policy=ModuleWrapPolicy({nn.Sequential}))
    data_ = [step_[0]][:2]
    x_, y_ = next(iter(data_))
    loss = F.mse_loss(wrap_out(x_), y_)
    loss.backward()
    msd, osd = (wrap_out.state_dict(), None)

if __name__ == "__main__":
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import torch.distributed as dist
    dist.init_process_group("gloo")
    attempt(dist.get_rank(), dist.get_world_size())
    print('PASS: no rank raised', flush=True)
    os._exit(0)  # a rank must not wait for the others at exit
