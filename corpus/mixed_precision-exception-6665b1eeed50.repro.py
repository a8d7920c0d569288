#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=49e98a7a0cd611b2 sources=c819ef517160c7c9 seconds=687.7
# Reproduces shardfuzz corpus entry mixed_precision-exception-6665b1eeed50.json: exception:mixed_precision:builtins.RuntimeError@torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:foreach_reduce
# Known torch bug: MixedPrecisionPolicy: a unit all frozen at lazy init gets no orig/reduce dtype;
# unfrozen later, its low-precision gradient is never cast back; upstream:
# https://github.com/pytorch/pytorch/issues/186998.
# Observed: rank 0 raised builtins.RuntimeError: attempting to assign a gradient with dtype
# 'c10::BFloat16' to a tensor with grad_dtype 'Float'. The gradient must match the tensor's ...
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: while the failure is there a rank raises
# builtins.RuntimeError in
# torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:foreach_reduce, prints its traceback
# and REPRODUCED and exits 1; once it is gone rank 0 prints PASS and every rank exits 0 (expected:
# no rank raises); a rank exits 2 where the script cannot run (not under torchrun, another world
# size) or the case fails another way (it prints FAIL). torchrun's own status is 1 whenever a
# rank's is not 0.

from __future__ import annotations
import torch
from dataclasses import dataclass
from torch import nn
import torch.nn.functional as F

@dataclass()
class Unfreeze:
    path: object
    step: object

class PointwiseConv1d(nn.Conv1d):
    pass

def attempt(rank, world_size):
    module = PointwiseConv1d(1, 1, kernel_size=1)
    module.requires_grad_(False)
    build_model_out = nn.Sequential(PointwiseConv1d(1, 1, kernel_size=1), module)
    from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
    kwargs = {'mp_policy': MixedPrecisionPolicy(param_dtype=torch.bfloat16)}
    modules = [build_model_out.get_submodule('0')]
    fully_shard(modules[0], **kwargs)
    modules = [build_model_out]
    fully_shard(modules[0], **kwargs)
    out__ = {'1': []}
    for name, p____ in build_model_out.named_parameters():
        clean_name_out = name
        owner = '.'.join((c for c in clean_name_out.split('.')[:-1] if c))
        if owner in out__:
            out__[owner].append(p____)
    out_ = []
    for _ in range(2):
        x_ = torch.randn(world_size, 1)
        y_ = torch.randn(world_size, 1)
        step_ = [(x_[rank:rank + 1], y_[rank:rank + 1])]
        out_.append(step_)
    for s, step in enumerate(out_):
        for path__ in ['1' for u in (Unfreeze(path='1', step=1),) if 1 == s]:
            p___ = next(iter(out__[path__]))
            p___.requires_grad_(True)
        i, (x, y) = next(iter(enumerate(step)))
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
        if found in ['builtins.RuntimeError@torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:foreach_reduce']:
            print(f"REPRODUCED exception:mixed_precision:builtins.RuntimeError@torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:foreach_reduce: rank {rank} raised {found}", flush=True)
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
