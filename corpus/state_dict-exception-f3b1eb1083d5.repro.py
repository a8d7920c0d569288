#!/usr/bin/env python3
# shardfuzz printed reproducer: entry=05f2a60d585ed364 seconds=9.8
# Printed from the case by shardfuzz (python -m fuzz repro).
# Known torch bug: a module whose state-dict hooks hide a child, declared through its fqn
# modifiers method (StateDictOptions.dsd_fqn_modifiers): get_optimizer_state_dict keys that
# child's parameters by named_parameters' names ('0.fused.weight'), set_optimizer_state_dict looks
# them up by the model state dict's ('0.weight'), so a get/set round trip of the optimizer fails:
# strict raises RuntimeError 'Missing optimizer state for parameter', non-strict drops that state,
# flattened raises KeyError 'param_groups.<fqn>.lr'. Any model, sharded or not; upstream: none
# found.
# Trains a model, takes its state through get/set_model_state_dict and
# get/set_optimizer_state_dict and loads it into a freshly built one in memory: the case fails
# there (what would follow is not printed).
# Run: torchrun --nproc-per-node 2 THIS_FILE.py. Exit 1 (REPRODUCED): a rank raised the exception
# in RAISED (its type, in that function of torch); 0 (PASS): every rank ran through; 2: it failed
# another way.
import copy
import os
import re
import torch
import torch.distributed as dist
import torch.nn.functional as F
import traceback
from torch import nn
from torch.distributed._composable import checkpoint
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict
from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict
from torch.distributed.fsdp import fully_shard


class Block(nn.Module):
    def __init__(self, children, width, scale=False, residual=False):
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(width)) if scale else None
        self.residual = residual

    def forward(self, x):
        y = x
        for child in self.children():
            y = child(y)
        y = y if self.scale is None else y * self.scale
        return x + y if self.residual else y


class Conv(nn.Conv1d):
    """A one-tap Conv1d over a (batch, width) activation, as a length-1 sequence."""

    def forward(self, x):
        return super().forward(x.unsqueeze(-1)).squeeze(-1)


class Fused(nn.Module):  # a leaf under a child "fused" that its state dict hides; _fqn_modifiers says so
    def __init__(self, leaf):
        super().__init__()
        self.fused = leaf
        self.register_state_dict_post_hook(lambda m, sd, prefix, _: m.rename(sd, prefix + "fused.", prefix))
        self.register_load_state_dict_pre_hook(lambda m, sd, prefix, *_: m.rename(sd, prefix, prefix + "fused."))

    def _fqn_modifiers(self):
        return {name: "fused" for name, _ in self.fused.named_parameters()}

    def forward(self, x):
        return self.fused(x)

    def rename(self, state_dict, old, new):
        for name in self._fqn_modifiers():
            if old + name in state_dict:
                state_dict[new + name] = state_dict.pop(old + name)


def fuse(model):
    for path in ('0.1', '0.2'):  # the leaves built as fused modules
        owner, _, name = path.rpartition(".")
        model.get_submodule(owner).add_module(name, Fused(model.get_submodule(path)))
    return model


def build():
    return Block([Block([nn.ReLU(), Conv(1, 1, 1), Conv(1, 1, 1, bias=False)], 1, scale=True, residual=True)], 1)


def compose_source(model):
    fully_shard(model, reshard_after_forward=False)
    return model


def compose_target(model):
    checkpoint(model)
    fully_shard(model, reshard_after_forward=True)
    return model


def train(model, opt, batches):
    for x, y in batches:
        F.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()


RAISED = {
    'AttributeError@torch/optim/sgd.py:_single_tensor_sgd',
    'KeyError@torch/distributed/checkpoint/state_dict.py:_unflatten_optim_state_dict',
    'KeyError@torch/optim/adam.py:step',
    'KeyError@torch/optim/sgd.py:step',
    'RuntimeError@torch/distributed/checkpoint/state_dict.py:_split_optim_state_dict',
    'TypeError@torch/optim/adam.py:__setstate__',
}


def main(rank, world_size):
    gen = torch.Generator().manual_seed(6424)  # the global batches, the same on every rank
    batches = (torch.randn(world_size * 2, 1, generator=gen)[0 :][:2] for _ in range(2 * 2))
    data = [(x, next(batches)) for x in batches]  # (input, target) of each step
    torch.manual_seed(6424)
    model = compose_source(fuse(build()))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    train(model, opt, data[0:2])
    save = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd = get_model_state_dict(model, options=save)
    optim_sd = get_optimizer_state_dict(model, opt, options=save)
    model_sd, optim_sd = copy.deepcopy((model_sd, optim_sd))  # as a checkpoint read back would be
    torch.manual_seed(6424 + 0x5EED)  # other weights: a load that does nothing shows
    target = compose_target(fuse(build()))
    target_opt = torch.optim.SGD(target.parameters(), lr=0.01, momentum=0.9)
    if rank != 0:
        model_sd, optim_sd = {}, {}  # broadcast_from_rank0: rank 0 alone holds the state
    load = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(target, model_sd, options=load)
    set_optimizer_state_dict(target, target_opt, optim_sd, options=load)


if __name__ == "__main__":
    try:
        dist.init_process_group("gloo")
        main(dist.get_rank(), dist.get_world_size())
        dist.barrier()
    except BaseException as e:  # DCP's CheckpointException is one; its text has the ranks' tracebacks
        text = traceback.format_exc()
        frames = re.findall(r'File "[^"]*/(torch/[^"-]+)", line \d+, in (?!<\w+comp>)(\S+)', text)  # torch's own
        raised = f"{type(e).__name__}@{':'.join(frames[-1]) if frames else '?'}"
        said = "REPRODUCED" if raised in RAISED else "FAIL (another failure)"
        print(f"{text}{said}: rank {os.environ.get('RANK')} raised {raised}", flush=True)
        os._exit(1 if raised in RAISED else 2)
    print("PASS: no rank raised", flush=True)
    os._exit(0)
