#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=6d0f1782b1a74e14 sources=c819ef517160c7c9 seconds=677.1
# Reproduces shardfuzz corpus entry parity-exception-86a14603f6de.json: exception:parity:builtins.RuntimeError@torch/nn/parallel/distributed.py:_clear_grad_buffer
# Known torch bug: DistributedDataParallel(delay_all_reduce_named_params=...,
# param_to_hook_all_reduce=...) over parameters that are not float32: the delayed gradients'
# buffer is made with torch.zeros and no dtype, and _clear_grad_buffer raises 'attempting to
# assign a gradient with dtype 'float' to a tensor with grad_dtype 'Double''; upstream: none
# found.
# Observed: replicate with delay_all_reduce_named_params over float64 parameters: DDP's delayed-
# gradient buffer is float32 (torch.zeros without a dtype) and _clear_grad_buffer raises on ...
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: while the failure is there a rank raises
# builtins.RuntimeError in torch/nn/parallel/distributed.py:_clear_grad_buffer, prints its
# traceback and REPRODUCED and exits 1; once it is gone rank 0 prints PASS and every rank exits 0
# (expected: no rank raises); a rank exits 2 where the script cannot run (not under torchrun,
# another world size) or the case fails another way (it prints FAIL). torchrun's own status is 1
# whenever a rank's is not 0.

from __future__ import annotations
import torch
from torch import nn

def attempt(rank, world_size):
    build_model_out = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    model_ = build_model_out.to(torch.float64)
    from torch.distributed._composable import replicate
    plan = ('0', ())
    hook, delayed = plan
    kwargs = {'param_to_hook_all_reduce': model_.get_submodule(hook).get_parameter('bias'), 'delay_all_reduce_named_params': [(i_, model_.get_submodule(p__).get_parameter(name)) for i_, (p__, name) in enumerate([('1', 'bias')])]}
    replicate(model_, **kwargs)
    lo = rank * 2
    x_ = torch.randn(4, 4, dtype=torch.float64)
    y_ = torch.randn(4, 4)
    step_ = [(x_[lo:lo + 2], y_[lo:lo + 2])]
    i, (x, y) = next(enumerate(step_))
    out = model_(x)

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
        if found in ['builtins.RuntimeError@torch/nn/parallel/distributed.py:_clear_grad_buffer']:
            print(f"REPRODUCED exception:parity:builtins.RuntimeError@torch/nn/parallel/distributed.py:_clear_grad_buffer: rank {rank} raised {found}", flush=True)
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
