#!/usr/bin/env python3
# shardfuzz printed reproducer: entry=fcf8cd4586083371 seconds=35.1
# Printed from the case by shardfuzz (python -m fuzz repro).
# Known torch bug: MixedPrecisionPolicy(reduce_dtype) with set_requires_gradient_sync(False) and a
# parameter unused on a no-sync microbatch: 'FSDP reduce-scatter expects uniform gradient dtype';
# upstream: https://github.com/pytorch/pytorch/issues/196996.
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


SKIPPED = []  # the modules left out of forward now


class Block(nn.Module):
    def __init__(self, children, width, scale=False):
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(width)) if scale else None

    def forward(self, x):
        y = x
        for child in self.children():
            y = y if child in SKIPPED else child(y)
        y = y if self.scale is None else y * self.scale
        return y


class Conv(nn.Conv1d):
    """A one-tap Conv1d over a (batch, width) activation, as a length-1 sequence."""

    def forward(self, x):
        return super().forward(x.unsqueeze(-1)).squeeze(-1)


SKIPS = {(0, 0): ['0']}  # (step, microbatch): the modules left out of forward then


def main(rank, world_size):
    torch.manual_seed(0)  # every rank builds the same weights
    model = Block([Conv(1, 1, 1, bias=False)], 1, scale=True)
    mp = MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)
    fully_shard(model, reshard_after_forward=False, mp_policy=mp)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(0)
    for step in range(1):
        for micro in range(2):
            x, y = (torch.randn(world_size, 1, generator=gen)[rank :][:1] for _ in range(2))
            SKIPPED[:] = [model.get_submodule(p) for p in SKIPS.get((step, micro), [])]
            model.set_requires_gradient_sync(micro == 1)
            F.mse_loss(model(x).to(y.dtype), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=False)


RAISED = {'AssertionError@torch/distributed/fsdp/_fully_shard/_fsdp_common.py:_raise_assert_with_print'}


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
