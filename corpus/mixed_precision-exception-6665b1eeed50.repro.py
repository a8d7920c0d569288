#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=49e98a7a0cd611b2 sources=c63308a0cfa16dd8 seconds=40.9
# Known torch bug: MixedPrecisionPolicy: a unit all frozen at lazy init gets no orig/reduce dtype;
# unfrozen later, its low-precision gradient is never cast back; upstream:
# https://github.com/pytorch/pytorch/issues/186998.
# Runs the case's training. Run: torchrun --nproc-per-node 2 THIS_FILE.py: a rank that raises the
# entry's exception (EXPECTED: its type @ the innermost frame of torch's own code) prints
# REPRODUCED and exits 1; one that raises another exits 2 (FAIL); where none raises, rank 0 prints
# PASS and every rank exits 0.
# Outside torchrun --nproc-per-node 2 the script prints how to run it and exits 2.
# Printed from the case by shardfuzz (python -m fuzz repro).

import os
import sys
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


def train(rank, world_size):
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


# the entry's exception: its type @ the innermost frame of torch's own code
EXPECTED = {
    'builtins.RuntimeError@torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:foreach_reduce',
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
