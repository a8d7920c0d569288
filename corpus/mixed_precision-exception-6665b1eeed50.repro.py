#!/usr/bin/env python3
# shardfuzz printed reproducer: entry=49e98a7a0cd611b2 seconds=28.7
# Printed from the case by shardfuzz (python -m fuzz repro).
# Known torch bug: MixedPrecisionPolicy: a unit all frozen at lazy init gets no orig/reduce dtype;
# unfrozen later, its low-precision gradient is never cast back; upstream:
# https://github.com/pytorch/pytorch/issues/186998.
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
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.distributed.fsdp import fully_shard


class Conv(nn.Conv1d):
    """A one-tap Conv1d over a (batch, width) activation, as a length-1 sequence."""

    def forward(self, x):
        return super().forward(x.unsqueeze(-1)).squeeze(-1)


def main(rank, world_size):
    torch.manual_seed(0)  # every rank builds the same weights
    model = nn.Sequential(Conv(1, 1, 1, bias=False), Conv(1, 1, 1, bias=False).requires_grad_(False))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, cast_forward_inputs=False)
    fully_shard(model.get_submodule("0"), reshard_after_forward=False, mp_policy=mp)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
    fully_shard(model, reshard_after_forward=False, mp_policy=mp)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(0)
    later = {"1": list(model.get_submodule("1").parameters())}  # frozen now, unfrozen later
    for step in range(2):
        if step == 1:
            for p in later["1"]:
                p.requires_grad_(True)
        x, y = (torch.randn(world_size, 1, generator=gen)[rank :][:1] for _ in range(2))
        F.mse_loss(model(x).to(y.dtype), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=False)


RAISED = {'RuntimeError@torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:foreach_reduce'}


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
