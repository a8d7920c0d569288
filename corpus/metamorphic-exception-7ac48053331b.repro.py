#!/usr/bin/env python3
# shardfuzz printed reproducer: entry=aa96ea87f1dc4963 seconds=20.8
# Printed from the case by shardfuzz (python -m fuzz repro).
# Known torch bug: foreach optimizers over a mix of DTensor (fully_shard) and plain (replicate)
# parameters raise; upstream: https://github.com/pytorch/pytorch/issues/183207.
# Runs the case's training under both compositions.
# Run: torchrun --nproc-per-node 2 THIS_FILE.py. Exit 1 (REPRODUCED): a rank raised the exception
# in RAISED (its type, in that function of torch); 0 (PASS): every rank ran through; 2: it failed
# another way.
import os
import re
import torch
import torch.distributed as dist
import torch.nn.functional as F
import traceback
from torch import nn
from torch.distributed._composable import checkpoint, replicate
from torch.distributed.fsdp import fully_shard


def build():
    return nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))


def compose(model):
    fully_shard(model.get_submodule("0"), reshard_after_forward=True)
    replicate(model)
    return model


def compose_variant(model):
    checkpoint(model.get_submodule("1"))
    fully_shard(model.get_submodule("0"), reshard_after_forward=True)
    replicate(model)
    return model


def train(rank, world_size, compose):
    torch.manual_seed(0)  # every rank builds the same weights
    model = compose(build())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=True)
    gen = torch.Generator().manual_seed(0)
    x, y = (torch.randn(world_size, 2, generator=gen)[rank :][:1] for _ in range(2))
    F.mse_loss(model(x), y).backward()
    opt.step()
    opt.zero_grad()


RAISED = {
    'RuntimeError@torch/distributed/tensor/_dispatch.py:_try_replicate_spec_for_scalar_tensor',
    'RuntimeError@torch/optim/sgd.py:_multi_tensor_sgd',
}


def main(rank, world_size):
    for composition in (compose, compose_variant):
        train(rank, world_size, composition)


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
