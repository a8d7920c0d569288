#!/usr/bin/env python3
# shardfuzz printed reproducer: entry=0a7b137419c2a1a3 seconds=21.8
# Printed from the case by shardfuzz (python -m fuzz repro).
# Known torch bug: a fully_shard unit of frozen parameters that runs twice in one forward inside a
# checkpointed region stays unsharded after backward although reshard_after_backward is True;
# unfrozen later (through the sharded parameter), its registered unsharded parameters keep
# requires_grad=False in the next forward and the recomputation raises CheckpointError 'Recomputed
# values ... different metadata'; so does, without unfreezing, a second forward before one
# backward (the region recomputed twice in it); upstream: none found.
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


class Block(nn.Module):
    def __init__(self, children, width, scale=False, repeat=False):
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(width)) if scale else None
        self.repeat = repeat  # its children run twice over

    def forward(self, x):
        y = x
        for _ in range(2 if self.repeat else 1):
            for child in self.children():
                y = child(y)
        y = y if self.scale is None else y * self.scale
        return y


class Attention(nn.Module):
    """Self-attention (q, k, v, o projections, 1 head) over a (batch, width) activation, as a
    length-1 sequence."""

    def __init__(self, width, bias=True):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(width, width, bias=bias) for _ in range(4))

    def forward(self, x):
        h = x.unsqueeze(1)
        b, s, w = h.shape
        q, k, v = (t(h).reshape(b, s, 1, w).transpose(1, 2) for t in (self.q, self.k, self.v))
        out = F.scaled_dot_product_attention(q, k, v)
        return self.o(out.transpose(1, 2).reshape(b, s, w)).squeeze(1)


def main(rank, world_size):
    torch.manual_seed(0)  # every rank builds the same weights
    model = Block([
        Block([nn.ReLU(), Block([Attention(1, bias=False).requires_grad_(False)], 1, scale=True)], 1, scale=True),
        nn.ReLU(),
        nn.ReLU(),
    ], 1, repeat=True)
    fully_shard(model.get_submodule("0.1.0"), reshard_after_forward=False)
    fully_shard(model.get_submodule("0.1"), reshard_after_forward=False)
    fully_shard(model.get_submodule("0"), reshard_after_forward=False)
    checkpoint(model.get_submodule("0"))
    checkpoint(model.get_submodule("2"))
    fully_shard(model, reshard_after_forward=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(0)
    later = {"0.1.0": list(model.get_submodule("0.1.0").parameters())}  # frozen now, unfrozen later
    for step in range(3):
        if step == 1:
            for p in later["0.1.0"]:
                p.requires_grad_(True)
        x, y = (torch.randn(world_size, 1, generator=gen)[rank :][:1] for _ in range(2))
        F.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=False)


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
