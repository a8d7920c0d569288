#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=c572371c336f35cd sources=5c3a8b0f263890d1 seconds=703.0
# Reproduces shardfuzz corpus entry state_dict-exception-d4322b68deab.json: exception:state_dict:builtins.AttributeError@torch/nn/modules/module.py:__getattr__
# Known torch bug: get_model_state_dict / get_state_dict ignore
# StateDictOptions(dsd_fqn_modifiers=...): they map the model's state-dict keys to FQNs through a
# method of the default name (_fqn_modifiers), so for a module whose state-dict hooks hide a child
# and whose method has the name the option gives, _get_fqns raises AttributeError ('<module>
# object has no attribute <key atom>'). Only set_model_state_dict reads the option. Any model,
# sharded or not; upstream: none found.
# Observed: rank 0 raised builtins.AttributeError: 'FusedLeaf' object has no attribute 'weight'
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: while the failure is there a rank raises
# builtins.AttributeError in torch/nn/modules/module.py:__getattr__ and torchrun exits 1; else
# every rank prints PASS and it exits 0.

from __future__ import annotations
from torch import nn

class PointwiseConv1d(nn.Conv1d):
    pass
FUSED_CHILD = 'fused'

class FusedLeaf(nn.Module):

    def __init__(self, leaf):
        super().__init__()
        self.add_module(FUSED_CHILD, leaf)
        self._atoms = [n for n, _ in leaf.named_parameters()]
        object.__setattr__(self, 'hidden_children', self.key_modifiers)
        self.register_state_dict_post_hook(FusedLeaf._hide)

    def key_modifiers(self):
        return {atom: FUSED_CHILD for atom in self._atoms}

    @staticmethod
    def _hide(module, state_dict, prefix, local_metadata):
        atom = next(iter(module.key_modifiers()))
        state_dict[f'{prefix}{atom}'] = state_dict

def attempt(rank, world_size):
    build_model_out = nn.Sequential(PointwiseConv1d(1, 1, kernel_size=1))
    build_model_out.add_module('0', FusedLeaf(build_model_out.get_submodule('0')))
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, StateDictOptions
    options = StateDictOptions(dsd_fqn_modifiers='hidden_children')
    msd_ = get_model_state_dict(build_model_out, options=options)

if __name__ == "__main__":
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import torch.distributed as dist
    dist.init_process_group("gloo")
    attempt(dist.get_rank(), dist.get_world_size())
    print('PASS: no rank raised', flush=True)
    os._exit(0)  # a rank must not wait for the others at exit
