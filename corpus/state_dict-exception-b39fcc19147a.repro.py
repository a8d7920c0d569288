#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=f79d1e3b59a0cdd2 sources=8dc1694f16ffdb1f seconds=411.0
# Reproduces shardfuzz corpus entry state_dict-exception-b39fcc19147a.json: exception:state_dict:builtins.KeyError@torch/distributed/_state_dict_utils.py:_unflatten_state_dict
# Known torch bug: set_optimizer_state_dict(full_state_dict=True,
# flatten_optimizer_state_dict=True) raises KeyError 'param_groups.0.params.0' for any model: the
# full-state branch takes the optimizer's local state dict with the flatten option still on, so
# the loaded and the local dicts have different keys; upstream: none found.
# Observed: rank 0 raised builtins.KeyError: 'param_groups.0.params.0'
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: while the failure is there a rank raises
# builtins.KeyError in torch/distributed/_state_dict_utils.py:_unflatten_state_dict and torchrun
# exits 1; else every rank prints PASS and it exits 0.

from __future__ import annotations
import torch
from torch import nn

class TreeBlock(nn.Module):

    def __init__(self, children, scale):
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(4)) if scale else None

def attempt(rank, world_size):
    build_model_out = TreeBlock([TreeBlock([], True)], False)
    params = list(build_model_out.parameters())
    groups = [{'params': params[0::2]}]
    src_opt = torch.optim.Adam(groups)
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
    msd_ = get_model_state_dict(build_model_out)
    msd, osd = (msd_, get_optimizer_state_dict(build_model_out, src_opt))
    build_model_out_ = TreeBlock([TreeBlock([], True)], False)
    params_ = list(build_model_out_.parameters())
    groups_ = [{'params': params_[0::2]}]
    tgt_opt = torch.optim.Adam(groups_)
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict, StateDictOptions
    options_ = StateDictOptions(full_state_dict=True, flatten_optimizer_state_dict=True)
    set_optimizer_state_dict(build_model_out_, tgt_opt, osd, options=options_)

if __name__ == "__main__":
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import torch.distributed as dist
    dist.init_process_group("gloo")
    attempt(dist.get_rank(), dist.get_world_size())
    print('PASS: no rank raised', flush=True)
    os._exit(0)  # a rank must not wait for the others at exit
