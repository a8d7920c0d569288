#!/usr/bin/env python3
# shardfuzz printed reproducer: entry=6d0f1782b1a74e14 seconds=42.2
# Printed from the case by shardfuzz (python -m fuzz repro).
# Known torch bug: DistributedDataParallel(delay_all_reduce_named_params=...,
# param_to_hook_all_reduce=...) over parameters that are not float32: the delayed gradients'
# buffer is made with torch.zeros and no dtype, and _clear_grad_buffer raises 'attempting to
# assign a gradient with dtype 'float' to a tensor with grad_dtype 'Double''; upstream: none
# found.
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
from torch.distributed._composable import replicate


def main(rank, world_size):
    torch.manual_seed(0)  # every rank builds the same weights
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)).to(torch.float64)
    # when 0's gradient is ready (backward reaches it last), the parameters of the modules after
    # it are all-reduced (named by their index in the parameter list replicate hands DDP)
    replicate(model, param_to_hook_all_reduce=model.get_parameter("0.weight"),
              delay_all_reduce_named_params=[("2", model.get_parameter("1.weight")),
                                             ("3", model.get_parameter("1.bias"))])
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(0)
    x, y = (torch.randn(world_size * 2, 4, generator=gen, dtype=torch.float64)[rank * 2 :][:2] for _ in range(2))
    F.mse_loss(model(x), y).backward()
    opt.step()
    opt.zero_grad()


RAISED = {'RuntimeError@torch/nn/parallel/distributed.py:_clear_grad_buffer'}


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
