#!/usr/bin/env python3
# shardfuzz printed reproducer: entry=c572371c336f35cd seconds=32.9
# Printed from the case by shardfuzz (python -m fuzz repro).
# Known torch bug: get_model_state_dict / get_state_dict ignore
# StateDictOptions(dsd_fqn_modifiers=...): they map the model's state-dict keys to FQNs through a
# method of the default name (_fqn_modifiers), so for a module whose state-dict hooks hide a child
# and whose method has the name the option gives, _get_fqns raises AttributeError ('<module>
# object has no attribute <key atom>'). Only set_model_state_dict reads the option. Any model,
# sharded or not; upstream: none found.
# Trains a model and takes its state through get/set_model_state_dict and
# get/set_optimizer_state_dict: the case fails there (what would follow is not printed).
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
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict
from torch.distributed.fsdp import fully_shard


class Block(nn.Module):
    def __init__(self, children, width, scale=False):
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(width)) if scale else None

    def forward(self, x):
        y = x
        for child in self.children():
            y = child(y)
        y = y if self.scale is None else y * self.scale
        return y


class Conv(nn.Conv1d):
    """A one-tap Conv1d over a (batch, width) activation, as a length-1 sequence."""

    def forward(self, x):
        return super().forward(x.unsqueeze(-1)).squeeze(-1)


class Fused(nn.Module):  # a leaf under a child "fused" that its state dict hides; hidden_children says so
    def __init__(self, leaf):
        super().__init__()
        self.fused = leaf
        self.register_state_dict_post_hook(lambda m, sd, prefix, _: m.rename(sd, prefix + "fused.", prefix))
        self.register_load_state_dict_pre_hook(lambda m, sd, prefix, *_: m.rename(sd, prefix, prefix + "fused."))

    def hidden_children(self):
        return {name: "fused" for name, _ in self.fused.named_parameters()}

    def forward(self, x):
        return self.fused(x)

    def rename(self, state_dict, old, new):
        for name in self.hidden_children():
            if old + name in state_dict:
                state_dict[new + name] = state_dict.pop(old + name)


def fuse(model):
    for path in ('0',):  # the leaves built as fused modules
        owner, _, name = path.rpartition(".")
        model.get_submodule(owner).add_module(name, Fused(model.get_submodule(path)))
    return model


def build():
    return Block([Conv(1, 1, 1, bias=False).requires_grad_(False)], 1, scale=True)


def compose_source(model):
    fully_shard(model, reshard_after_forward=False)
    return model


def train(model, opt, batches):
    for x, y in batches:
        F.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=False)


RAISED = {'AttributeError@torch/nn/modules/module.py:__getattr__'}


def main(rank, world_size):
    gen = torch.Generator().manual_seed(0)  # the global batches, the same on every rank
    batches = (torch.randn(world_size, 1, generator=gen)[rank :][:1] for _ in range(2 * 2))
    data = [(x, next(batches)) for x in batches]  # (input, target) of each step
    torch.manual_seed(0)
    model = compose_source(fuse(build()))
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.01, momentum=0.9)
    train(model, opt, data[0:1])
    save = StateDictOptions(full_state_dict=True, dsd_fqn_modifiers='hidden_children')
    model_sd = get_model_state_dict(model, options=save)
    optim_sd = get_optimizer_state_dict(model, opt, options=save)
    model_sd, optim_sd = copy.deepcopy((model_sd, optim_sd))  # as a checkpoint read back would be


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
