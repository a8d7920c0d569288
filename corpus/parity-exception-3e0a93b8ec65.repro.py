#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=1c96dbc1c2137b8d sources=76efda80b8085560 seconds=17.0
# Known torch bug: selective activation checkpointing
# (context_fn=create_selective_checkpoint_contexts) over a region holding a fully_shard unit whose
# state differs between forward and recomputation (kept unsharded by
# set_reshard_after_backward(False), prefetched, frozen): the replay counts FSDP2's
# record_function markers and raises 'profiler._record_function_enter_new.default invocation index
# N encountered during backward but not found in storage'; upstream:
# https://github.com/pytorch/pytorch/issues/196862.
# Runs the case's training. Run: torchrun --nproc-per-node 2 THIS_FILE.py: a rank that raises the
# entry's exception (EXPECTED: its type @ the innermost frame of torch's own code) prints
# REPRODUCED and exits 1; one that raises another exits 2 (FAIL); where none raises, rank 0 prints
# PASS and every rank exits 0.
# Outside torchrun --nproc-per-node 2 the script prints how to run it and exits 2.
# Printed from the case by shardfuzz (python -m fuzz repro).

import functools
import os
import sys
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


def train(rank, world_size):
    torch.manual_seed(0)  # every rank builds the same weights
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    fully_shard(model.get_submodule("0"))
    checkpoint(model, context_fn=functools.partial(create_selective_checkpoint_contexts, save_matmuls))
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(0)
    for _ in range(2):
        for micro in range(2):
            x, y = (torch.randn(world_size * 2, 4, generator=gen)[rank * 2 :][:2] for _ in range(2))
            model.set_reshard_after_backward(micro == 1)
            model.set_is_last_backward(micro == 1)
            F.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


# the entry's exception: its type @ the innermost frame of torch's own code
EXPECTED = {
    'builtins.RuntimeError@torch/utils/checkpoint.py:__torch_dispatch__',
}


def torch_frame(path, function):  # a frame of torch's own code (fuzz.signature.torch_frame)
    at = path.rfind('/torch/')
    inner = path[at + 1:]
    if at < 0 or '/fuzz/' in path or '-packages/' in inner or (function in ('<listcomp>', '<dictcomp>', '<setcomp>')):
        return None
    return f'{inner}:{function}'


if __name__ == "__main__":
    if os.environ.get("WORLD_SIZE") != "2":
        print("run it with: torchrun --nproc-per-node 2 " + sys.argv[0], file=sys.stderr)
        sys.exit(2)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    try:
        train(rank, dist.get_world_size())
        dist.barrier()
    except Exception as e:
        traceback.print_exc()
        frames = [torch_frame(f.filename, f.name) for f in traceback.extract_tb(e.__traceback__)]
        found = f"{type(e).__module__}.{type(e).__qualname__}@{([f for f in frames if f] or ['?'])[-1]}"
        said = "REPRODUCED" if found in EXPECTED else "FAIL (not the entry's exception)"
        print(f"{said}: rank {rank} raised {found}: {e}", flush=True)
        os._exit(1 if found in EXPECTED else 2)
    if rank == 0:
        print("PASS: no rank raised", flush=True)
