#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=b29b69107395f153 sources=c819ef517160c7c9 seconds=704.9
# Reproduces shardfuzz corpus entry mixed_precision-exception-708c7ed7c223.json: exception:mixed_precision:builtins.AttributeError@torch/distributed/fsdp/_fully_shard/_fsdp_param.py:to_accumulated_grad_if_needed
# Known torch bug: MixedPrecisionPolicy(reduce_dtype) with set_requires_gradient_sync(False): a
# unit that never ran forward has no '_unsharded_param' in the root's post-backward; upstream:
# https://github.com/pytorch/pytorch/issues/194058.
# Observed: rank 0 raised builtins.AttributeError: 'FSDPParam' object has no attribute
# '_unsharded_param'
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: while the failure is there a rank raises
# builtins.AttributeError in
# torch/distributed/fsdp/_fully_shard/_fsdp_param.py:to_accumulated_grad_if_needed, prints its
# traceback and REPRODUCED and exits 1; once it is gone rank 0 prints PASS and every rank exits 0
# (expected: no rank raises); a rank exits 2 where the script cannot run (not under torchrun,
# another world size) or the case fails another way (it prints FAIL). torchrun's own status is 1
# whenever a rank's is not 0.

from __future__ import annotations
import torch
from torch import nn
import torch.nn.functional as F

class TreeBlock(nn.Module):

    def __init__(self, children):
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(12))

    def forward(self, x):
        y = x
        y = y * self.scale
        return x + y

def attempt(rank, world_size):
    build_model_out = TreeBlock([nn.LayerNorm(12), nn.LayerNorm(12)])
    from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
    mp_policy_out = MixedPrecisionPolicy(reduce_dtype=torch.float32)
    modules = [build_model_out.get_submodule('1')]
    fully_shard(modules[0], mp_policy=mp_policy_out)
    modules = [build_model_out]
    fully_shard(modules[0])
    lo = rank * 2
    x_ = torch.randn(4, 12)
    y_ = torch.randn(4, 12)
    step_ = [(x_[lo:lo + 2], y_[lo:lo + 2])]
    i, (x, y) = next(iter(enumerate(step_)))
    build_model_out.set_requires_gradient_sync(False)
    out = build_model_out(x)
    loss = F.mse_loss(out, y)
    loss.backward()

def torch_frame(path: str, function: str) -> str | None:
    at = path.rfind('/torch/')
    inner = path[at + 1:]
    if at < 0 or '/fuzz/' in path or '-packages/' in inner or (function in ('<listcomp>', '<dictcomp>', '<setcomp>')):
        return None
    return f'{inner}:{function}'


if __name__ == "__main__":
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import sys
    import time
    if os.environ.get("WORLD_SIZE") != "2":
        print("run it with: torchrun --nproc-per-node 2 " + sys.argv[0], file=sys.stderr)
        sys.exit(2)
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    import re
    import traceback
    try:
        attempt(rank, world_size)
    except BaseException as e:  # torch's CheckpointException is a BaseException
        text = traceback.format_exc()
        sys.stderr.write("".join(f"[rank{rank}]: {line}\n" for line in text.splitlines()))
        frames = [f for f in (torch_frame(p, f) for p, f in re.findall(r'File "([^"]+)", line \d+,? in (\S+)', text)) if f]
        found = f"{type(e).__module__}.{type(e).__qualname__}@{(frames or ['torch/?:?'])[-1]}"
        if found in ['builtins.AttributeError@torch/distributed/fsdp/_fully_shard/_fsdp_param.py:to_accumulated_grad_if_needed']:
            print(f"REPRODUCED exception:mixed_precision:builtins.AttributeError@torch/distributed/fsdp/_fully_shard/_fsdp_param.py:to_accumulated_grad_if_needed: rank {rank} raised {found}", flush=True)
            os._exit(1)
        print(f"FAIL (not the entry's failure): rank {rank} raised {found}", flush=True)
        os._exit(2)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
    store.add("repro-passed", 1)
    until = time.monotonic() + 60
    while store.add("repro-passed", 0) < world_size:
        if time.monotonic() > until:
            print(f"FAIL (not the entry's failure): rank {rank} finished, another rank did not", flush=True)
            os._exit(2)
        time.sleep(0.05)
    if rank == 0:
        print('PASS: no rank raised', flush=True)
    os._exit(0)  # a rank must not wait for the others at exit
