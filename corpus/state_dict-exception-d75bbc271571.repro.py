#!/usr/bin/env python3
# shardfuzz printed reproducer: entry=af1b565e41fad220 seconds=56.3
# Printed from the case by shardfuzz (python -m fuzz repro).
# Known torch bug: set_optimizer_state_dict(full_state_dict=True) for an optimizer without tensor
# state: 'Expected device to be set'; upstream: https://github.com/pytorch/pytorch/issues/133415.
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
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict
from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict


def build():
    return nn.Sequential(nn.Linear(2, 2))


def train(model, opt, batches):
    for x, y in batches:
        F.mse_loss(model(x), y).backward()
        for p in [p for p in model.parameters() if p.grad is not None]:
            dist.all_reduce(p.grad)  # a plain model, data-parallel by hand: gradients averaged
            p.grad /= dist.get_world_size()
        opt.step()
        opt.zero_grad()


RAISED = {'AssertionError@torch/distributed/checkpoint/state_dict.py:_load_optim_state_dict'}


def main(rank, world_size):
    gen = torch.Generator().manual_seed(0)  # the global batches, the same on every rank
    batches = (torch.randn(world_size, 2, generator=gen)[rank :][:1] for _ in range(2 * 1))
    data = [(x, next(batches)) for x in batches]  # (input, target) of each step
    torch.manual_seed(0)
    model = build()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train(model, opt, data[0:1])
    save = StateDictOptions(full_state_dict=True)
    model_sd = get_model_state_dict(model, options=save)
    optim_sd = get_optimizer_state_dict(model, opt, options=save)
    model_sd, optim_sd = copy.deepcopy((model_sd, optim_sd))  # as a checkpoint read back would be
    torch.manual_seed(0 + 0x5EED)  # other weights: a load that does nothing shows
    target = build()
    target_opt = torch.optim.SGD(target.parameters(), lr=0.1)
    load = StateDictOptions(full_state_dict=True)
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
