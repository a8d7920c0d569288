#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=b29b69107395f153 sources=c63308a0cfa16dd8 seconds=30.1
# Known torch bug: MixedPrecisionPolicy(reduce_dtype) with set_requires_gradient_sync(False): a
# unit that never ran forward has no '_unsharded_param' in the root's post-backward; upstream:
# https://github.com/pytorch/pytorch/issues/194058.
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


def train(rank, world_size):
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
        opt.zero_grad(set_to_none=True)


# the entry's exception: its type @ the innermost frame of torch's own code
EXPECTED = {
    'builtins.AttributeError@torch/distributed/fsdp/_fully_shard/_fsdp_param.py:to_accumulated_grad_if_needed',
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
