#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=fcf8cd4586083371 sources=c63308a0cfa16dd8 seconds=41.4
# Known torch bug: MixedPrecisionPolicy(reduce_dtype) with set_requires_gradient_sync(False) and a
# parameter unused on a no-sync microbatch: 'FSDP reduce-scatter expects uniform gradient dtype';
# upstream: https://github.com/pytorch/pytorch/issues/196996.
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


def train(rank, world_size):
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


# the entry's exception: its type @ the innermost frame of torch's own code
EXPECTED = {
    'builtins.AssertionError@torch/distributed/fsdp/_fully_shard/_fsdp_common.py:_raise_assert_with_print',
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
