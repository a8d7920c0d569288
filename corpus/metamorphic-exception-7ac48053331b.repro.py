#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=aa96ea87f1dc4963 sources=76efda80b8085560 seconds=15.5
# Known torch bug: foreach optimizers over a mix of DTensor (fully_shard) and plain (replicate)
# parameters raise; upstream: https://github.com/pytorch/pytorch/issues/183207.
# Runs the case's training under both compositions. Run: torchrun --nproc-per-node 2 THIS_FILE.py:
# a rank that raises the entry's exception (EXPECTED: its type @ the innermost frame of torch's
# own code) prints REPRODUCED and exits 1; one that raises another exits 2 (FAIL); where none
# raises, rank 0 prints PASS and every rank exits 0.
# Outside torchrun --nproc-per-node 2 the script prints how to run it and exits 2.
# Printed from the case by shardfuzz (python -m fuzz repro).

import os
import sys
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
    fully_shard(model.get_submodule("0"))
    replicate(model)
    return model


def compose_variant(model):
    checkpoint(model.get_submodule("1"))
    fully_shard(model.get_submodule("0"))
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
    opt.zero_grad(set_to_none=True)


# the entry's exception: its type @ the innermost frame of torch's own code
EXPECTED = {
    'builtins.RuntimeError@torch/distributed/tensor/_dispatch.py:_try_replicate_spec_for_scalar_tensor',
    'builtins.RuntimeError@torch/optim/sgd.py:_multi_tensor_sgd',
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
        for composition in (compose, compose_variant):
            train(rank, dist.get_world_size(), composition)
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
