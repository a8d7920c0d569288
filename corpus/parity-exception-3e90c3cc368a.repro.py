#!/usr/bin/env python3
# shardfuzz printed reproducer: entry=71d9601af2884473 seconds=15.6
# Printed from the case by shardfuzz (python -m fuzz repro).
# Known torch bug: composable checkpoint(module, debug=True) raises ValueError 'debug=True is
# incompatible with non-default context_fn' on the first forward whatever the caller passes: it
# always hands torch.utils.checkpoint a context_fn of its own; upstream:
# https://github.com/pytorch/pytorch/issues/185285.
# Runs the case's training.
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
from torch.distributed._composable import checkpoint
from torch.distributed.fsdp import fully_shard


def main(rank, world_size):
    torch.manual_seed(0)  # every rank builds the same weights
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    checkpoint(model.get_submodule("0"), debug=True)
    fully_shard(model, reshard_after_forward=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(0)
    for _ in range(2):
        for _ in range(2):
            x, y = (torch.randn(world_size * 2, 4, generator=gen)[rank * 2 :][:2] for _ in range(2))
            F.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()


RAISED = {'ValueError@torch/utils/checkpoint.py:_checkpoint_without_reentrant_generator'}


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
