#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=3951471a63742290 sources=c819ef517160c7c9 seconds=358.4
# Reproduces shardfuzz corpus entry parity-exception-f2ce67efc316.json: exception:parity:builtins.RuntimeError@torch/optim/sgd.py:_multi_tensor_sgd
# Known torch bug: foreach optimizers over a mix of DTensor (fully_shard) and plain (replicate)
# parameters raise; upstream: https://github.com/pytorch/pytorch/issues/183207.
# Observed: rank 0 raised builtins.RuntimeError: aten._foreach_add_.List got mixed torch.Tensor
# and DTensor, need to convert all torch.Tensor to DTensor before calling distributed operators!
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: while the failure is there a rank raises
# builtins.RuntimeError in torch/optim/sgd.py:_multi_tensor_sgd, prints its traceback and
# REPRODUCED and exits 1; once it is gone rank 0 prints PASS and every rank exits 0 (expected: no
# rank raises); a rank exits 2 where the script cannot run (not under torchrun, another world
# size) or the case fails another way (it prints FAIL). torchrun's own status is 1 whenever a
# rank's is not 0.

from __future__ import annotations
import torch
from torch import nn
import torch.nn.functional as F

def attempt(rank, world_size):
    build_model_out = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    from torch.distributed.fsdp import fully_shard
    modules = [build_model_out.get_submodule('0')]
    fully_shard(modules[0])
    params = build_model_out.parameters()
    opt = torch.optim.SGD(params, foreach=True)
    x_ = torch.randn(world_size, 2)
    y_ = torch.randn(world_size, 2)
    step_ = [(x_[rank:rank + 1], y_[rank:rank + 1])]
    i, (x, y) = next(iter(enumerate(step_)))
    out = build_model_out(x)
    loss = F.mse_loss(out, y)
    loss.backward()
    opt.step()

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
        if found in ['builtins.RuntimeError@torch/distributed/tensor/_dispatch.py:_try_replicate_spec_for_scalar_tensor', 'builtins.RuntimeError@torch/optim/sgd.py:_multi_tensor_sgd']:
            print(f"REPRODUCED exception:parity:builtins.RuntimeError@torch/optim/sgd.py:_multi_tensor_sgd: rank {rank} raised {found}", flush=True)
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
