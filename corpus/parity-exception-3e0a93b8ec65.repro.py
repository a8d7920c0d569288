#!/usr/bin/env python3
# shardfuzz printed reproducer: entry=1c96dbc1c2137b8d seconds=12.0
# Printed from the case by shardfuzz (python -m fuzz repro).
# Known torch bug: selective activation checkpointing
# (context_fn=create_selective_checkpoint_contexts) over a region holding a fully_shard unit whose
# state differs between forward and recomputation (kept unsharded by
# set_reshard_after_backward(False), prefetched, frozen): the replay counts FSDP2's
# record_function markers and raises 'profiler._record_function_enter_new.default invocation index
# N encountered during backward but not found in storage'; upstream:
# https://github.com/pytorch/pytorch/issues/196862.
# Runs the case's training.
# Run: torchrun --nproc-per-node 2 THIS_FILE.py. Exit 1 (REPRODUCED): a rank raised the exception
# in RAISED (its type, in that function of torch); 0 (PASS): every rank ran through; 2: it failed
# another way.
import functools
import os
import re
import torch
import torch.distributed as dist
import torch.nn.functional as F
import traceback
from torch import nn
from torch.distributed._composable import checkpoint
from torch.distributed.fsdp import fully_shard
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts


def save_matmuls(ctx, op, *args, **kwargs):  # saves the matmuls, recomputes the rest
    matmuls = [torch.ops.aten.mm.default, torch.ops.aten.addmm.default]
    return CheckpointPolicy.MUST_SAVE if op in matmuls else CheckpointPolicy.PREFER_RECOMPUTE


def main(rank, world_size):
    torch.manual_seed(0)  # every rank builds the same weights
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    fully_shard(model.get_submodule("0"))
    checkpoint(model, context_fn=functools.partial(create_selective_checkpoint_contexts, save_matmuls))
    fully_shard(model, reshard_after_forward=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(0)
    for _ in range(2):
        for micro in range(2):
            x, y = (torch.randn(world_size * 2, 4, generator=gen)[rank * 2 :][:2] for _ in range(2))
            model.set_reshard_after_backward(micro == 1)
            model.set_is_last_backward(micro == 1)
            F.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()


RAISED = {'RuntimeError@torch/utils/checkpoint.py:__torch_dispatch__'}


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
