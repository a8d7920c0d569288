#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=3602c42a89141394 sources=5c3a8b0f263890d1 seconds=716.2
# Reproduces shardfuzz corpus entry state_dict-exception-67e354131411.json: exception:state_dict:builtins.KeyError@torch/distributed/checkpoint/state_dict.py:_get_model_state_dict
# Known torch bug: get_model_state_dict(ignore_frozen_params=True) raises KeyError for a frozen
# parameter of a module whose state-dict hooks hide a child (declared through its fqn modifiers
# method): it pops the parameter's named_parameters name ('0.fused.weight'), which the state dict,
# keyed '0.weight', lacks; upstream: none found.
# Observed: rank 0 raised builtins.KeyError: '0.1.0.fused.weight'
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: while the failure is there a rank raises
# builtins.KeyError in torch/distributed/checkpoint/state_dict.py:_get_model_state_dict and
# torchrun exits 1; else every rank prints PASS and it exits 0.

from __future__ import annotations
import torch
from torch import nn
DEFAULT_FQN_MODIFIERS = '_fqn_modifiers'

class PointwiseConv1d(nn.Conv1d):
    pass
FUSED_CHILD = 'fused'

class FusedLeaf(nn.Module):

    def __init__(self, leaf, method=DEFAULT_FQN_MODIFIERS):
        super().__init__()
        self.add_module(FUSED_CHILD, leaf)
        self._atoms = [n for n, _ in leaf.named_parameters()]
        object.__setattr__(self, method, self.key_modifiers)
        self.register_state_dict_post_hook(FusedLeaf._hide)

    def key_modifiers(self):
        return {atom: FUSED_CHILD for atom in self._atoms}

    @staticmethod
    def _hide(module, state_dict, prefix, local_metadata):
        atom = next(iter(module.key_modifiers()))
        key = f'{prefix}{FUSED_CHILD}.{atom}'
        state_dict[f'{prefix}{atom}'] = state_dict.pop(key)

def attempt(rank, world_size):
    module = PointwiseConv1d(1, 1, kernel_size=1)
    module_ = PointwiseConv1d(1, 1, kernel_size=1, bias=False)
    module_.requires_grad_(False)
    build_model_out = nn.Sequential(nn.Sequential(module, nn.Sequential(module_)))
    owner = build_model_out.get_submodule('0.1')
    owner.add_module('0', FusedLeaf(owner.get_submodule('0'), DEFAULT_FQN_MODIFIERS))
    params = list(build_model_out.parameters())
    src_opt = torch.optim.AdamW(params)
    from torch.distributed.checkpoint.state_dict import get_state_dict, StateDictOptions
    options = StateDictOptions(ignore_frozen_params=True)
    msd, osd = get_state_dict(build_model_out, src_opt, options=options)

if __name__ == "__main__":
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import torch.distributed as dist
    dist.init_process_group("gloo")
    attempt(dist.get_rank(), dist.get_world_size())
    print('PASS: no rank raised', flush=True)
    os._exit(0)  # a rank must not wait for the others at exit
