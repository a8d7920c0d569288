#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=05f2a60d585ed364 sources=5f5e88fa2ae7132f seconds=524.9
# Reproduces shardfuzz corpus entry state_dict-exception-f3b1eb1083d5.json: exception:state_dict:builtins.RuntimeError@torch/distributed/checkpoint/state_dict.py:_split_optim_state_dict
# Known torch bug: a module whose state-dict hooks hide a child, declared through its fqn
# modifiers method (StateDictOptions.dsd_fqn_modifiers): get_optimizer_state_dict keys that
# child's parameters by named_parameters' names ('0.fused.weight'), set_optimizer_state_dict looks
# them up by the model state dict's ('0.weight'), so a get/set round trip of the optimizer fails:
# strict raises RuntimeError 'Missing optimizer state for parameter', non-strict drops that state,
# flattened raises KeyError 'param_groups.<fqn>.lr'. Any model, sharded or not; upstream: none
# found.
# Observed: rank 0 raised builtins.RuntimeError: Missing optimizer state for parameter
# '0.1.weight' in checkpoint. The parameter requires gradients but has no saved optimizer ...
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: while the failure is there a rank raises
# builtins.RuntimeError in torch/distributed/checkpoint/state_dict.py:_split_optim_state_dict and
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

    def key_modifiers(self):
        return {atom: FUSED_CHILD for atom in self._atoms}

def attempt(rank, world_size):
    build_model_out = nn.Sequential(nn.Sequential(PointwiseConv1d(1, 1, kernel_size=1), PointwiseConv1d(1, 1, kernel_size=1), PointwiseConv1d(1, 1, kernel_size=1)))
    owner = build_model_out.get_submodule('0')
    owner.add_module('2', FusedLeaf(owner.get_submodule('2'), DEFAULT_FQN_MODIFIERS))
    params = list(build_model_out.parameters())
    src_opt = torch.optim.SGD(params, momentum=0.9)
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
    msd_ = get_model_state_dict(build_model_out)
    msd, osd = (msd_, get_optimizer_state_dict(build_model_out, src_opt))
    build_model_out_ = nn.Sequential(nn.Sequential(PointwiseConv1d(1, 1, kernel_size=1), PointwiseConv1d(1, 1, kernel_size=1), PointwiseConv1d(1, 1, kernel_size=1)))
    params_ = list(build_model_out_.parameters())
    tgt_opt = torch.optim.SGD(params_)
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict
    set_optimizer_state_dict(build_model_out_, tgt_opt, osd)

if __name__ == "__main__":
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import torch.distributed as dist
    dist.init_process_group("gloo")
    attempt(dist.get_rank(), dist.get_world_size())
    print('PASS: no rank raised', flush=True)
    os._exit(0)  # a rank must not wait for the others at exit
