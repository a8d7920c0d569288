#!/usr/bin/env python3
# shardfuzz printed reproducer: entry=891107a19cd069f6 seconds=31.1
# Printed from the case by shardfuzz (python -m fuzz repro).
# Known torch bug: set_optimizer_state_dict(full_state_dict=True) for an optimizer without tensor
# state: 'Expected device to be set'; upstream: https://github.com/pytorch/pytorch/issues/133415.
# Trains a model, saves its state with dcp.save into a fresh directory, loads it with dcp.load
# into a freshly built one and trains both on.
# Run: torchrun --nproc-per-node 2 THIS_FILE.py. Exit 1 (REPRODUCED): a rank raised the exception
# in RAISED (its type, in that function of torch); 0 (PASS): every rank ran through; 2: it failed
# another way.
import os
import re
import tempfile
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
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
    path = [tempfile.mkdtemp(prefix="dcp-") if rank == 0 else None]
    dist.broadcast_object_list(path)  # one fresh directory for every rank
    torch.manual_seed(0)
    model = build()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train(model, opt, data[0:1])
    state = {"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, opt)}
    dcp.save(state, checkpoint_id=path[0])
    torch.manual_seed(0 + 0x5EED)  # other weights: a load that does nothing shows
    target = build()
    target_opt = torch.optim.SGD(target.parameters(), lr=0.1)
    template = StateDictOptions(full_state_dict=True)
    load = StateDictOptions(full_state_dict=True)
    state = {
        "model": get_model_state_dict(target, options=template),
        "optimizer": get_optimizer_state_dict(target, target_opt, options=template),
    }
    dcp.load(state, checkpoint_id=path[0])  # in place
    set_model_state_dict(target, state["model"], options=load)
    set_optimizer_state_dict(target, target_opt, state["optimizer"], options=load)


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
