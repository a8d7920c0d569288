#!/usr/bin/env python3
# shardfuzz printed reproducer: entry=351288c19e27a6b4 seconds=4.2
# Printed from the case by shardfuzz (python -m fuzz repro).
# Known torch bug: grouped fully_shard([a, b]) with an output_dtype, one member recomputed by
# activation checkpointing: the group stays incomplete in backward, and a fully_shard unit
# recomputed inside another checkpoint region claims the forward root and force-completes that
# group, casting its own output to the group's output_dtype (CheckpointError: recomputed values
# have different metadata than during the forward pass; where nothing saved changes dtype, wrong
# gradients); also where the whole group is recomputed and the unit sits in its later module;
# upstream: none found.
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
from torch.distributed.fsdp import MixedPrecisionPolicy
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


def main(rank, world_size):
    torch.manual_seed(26409996)  # every rank builds the same weights
    model = Block([
        Block([
            Block([
                nn.Dropout(0.5),
                nn.Linear(8, 8).requires_grad_(False),
                nn.LayerNorm(8).requires_grad_(False),
            ], 8, scale=True, residual=True),
            nn.ReLU(),
            Conv(8, 8, 1, bias=False),
        ], 8, residual=True),
        Conv(8, 8, 1, bias=False),
        nn.Linear(8, 8, bias=False),
    ], 8, residual=True)
    mp = MixedPrecisionPolicy()
    fully_shard(model.get_submodule("0.0.1"), mp_policy=mp)
    mp = MixedPrecisionPolicy(param_dtype=torch.float32, output_dtype=torch.float16)
    fully_shard(model.get_submodule("0.0"), mp_policy=mp)
    checkpoint(model.get_submodule("0.0"))
    mp = MixedPrecisionPolicy(param_dtype=torch.float16, output_dtype=torch.float16)
    fully_shard([model.get_submodule("2"), model.get_submodule("0")], mp_policy=mp)
    checkpoint(model.get_submodule("2"))
    mp = MixedPrecisionPolicy(param_dtype=torch.float16)
    fully_shard(model, reshard_after_forward=True, mp_policy=mp)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, foreach=False)
    gen = torch.Generator().manual_seed(26409996)
    torch.manual_seed(209140758325 + rank)  # dropout: the same masks on both runs of a rank
    x, y = (torch.randn(world_size, 8, generator=gen)[0 :][:1] for _ in range(2))
    F.mse_loss(model(x).to(y.dtype), y).backward()
    opt.step()
    opt.zero_grad()


RAISED = {'CheckpointError@torch/utils/checkpoint.py:check_recomputed_tensors_match'}


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
