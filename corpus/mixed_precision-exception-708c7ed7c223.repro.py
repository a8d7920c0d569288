#!/usr/bin/env python3
# shardfuzz printed reproducer: entry=b29b69107395f153 seconds=32.3
# Printed from the case by shardfuzz (python -m fuzz repro).
# Known torch bug: MixedPrecisionPolicy(reduce_dtype) with set_requires_gradient_sync(False): a
# unit that never ran forward has no '_unsharded_param' in the root's post-backward; upstream:
# https://github.com/pytorch/pytorch/issues/194058.
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


SKIPPED = []  # the modules left out of forward now


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
            y = y if child in SKIPPED else child(y)
        y = y if self.scale is None else y * self.scale
        return x + y if self.residual else y


SKIPS = {(0, 0): ['1'], (0, 1): ['1'], (1, 0): ['1']}  # (step, microbatch): the modules left out of forward then


def main(rank, world_size):
    torch.manual_seed(77)  # every rank builds the same weights
    model = Block([nn.GELU(), nn.LayerNorm(12, bias=False), nn.Dropout(0.5)], 12, scale=True, residual=True)
    mp = MixedPrecisionPolicy(param_dtype=torch.float16, reduce_dtype=torch.float32)
    fully_shard(model.get_submodule("1"), reshard_after_forward=False, mp_policy=mp)
    checkpoint(model.get_submodule("0"))
    checkpoint(model.get_submodule("1"))
    checkpoint(model.get_submodule("2"))
    mp = MixedPrecisionPolicy(param_dtype=torch.float16, reduce_dtype=torch.float32, output_dtype=torch.float32)
    fully_shard(model, reshard_after_forward=False, mp_policy=mp)
    params = list(model.parameters())
    params = [{"params": params[0::2]}, {"params": params[1::2], "lr": 0.1 / 2}]
    opt = torch.optim.AdamW(params, lr=0.1, eps=0.0001)
    gen = torch.Generator().manual_seed(77)
    torch.manual_seed(609764 + rank)  # dropout: the same masks on both runs of a rank
    for step in range(2):
        for micro in range(2):
            x, y = (torch.randn(world_size * 2, 12, generator=gen)[rank * 2 :][:2] for _ in range(2))
            SKIPPED[:] = [model.get_submodule(p) for p in SKIPS.get((step, micro), [])]
            model.set_requires_gradient_sync(micro == 1)
            F.mse_loss(model(x).to(y.dtype), y).backward()
        opt.step()
        opt.zero_grad()


RAISED = {'AttributeError@torch/distributed/fsdp/_fully_shard/_fsdp_param.py:to_accumulated_grad_if_needed'}


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
