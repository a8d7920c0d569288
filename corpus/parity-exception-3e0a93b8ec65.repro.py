#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=1c96dbc1c2137b8d sources=c819ef517160c7c9 seconds=298.8
# Reproduces shardfuzz corpus entry parity-exception-3e0a93b8ec65.json: exception:parity:builtins.RuntimeError@torch/utils/checkpoint.py:__torch_dispatch__
# Known torch bug: selective activation checkpointing
# (context_fn=create_selective_checkpoint_contexts) over a region holding a fully_shard unit whose
# state differs between forward and recomputation (kept unsharded by
# set_reshard_after_backward(False), prefetched, frozen): the replay counts FSDP2's
# record_function markers and raises 'profiler._record_function_enter_new.default invocation index
# N encountered during backward but not found in storage'; upstream:
# https://github.com/pytorch/pytorch/issues/196862.
# Observed: selective activation checkpointing over a region holding a fully_shard unit kept
# unsharded between microbatches (set_reshard_after_backward(False)): the replay counts ...
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: while the failure is there a rank raises
# builtins.RuntimeError in torch/utils/checkpoint.py:__torch_dispatch__, prints its traceback and
# REPRODUCED and exits 1; once it is gone rank 0 prints PASS and every rank exits 0 (expected: no
# rank raises); a rank exits 2 where the script cannot run (not under torchrun, another world
# size) or the case fails another way (it prints FAIL). torchrun's own status is 1 whenever a
# rank's is not 0.

from __future__ import annotations
import torch
from torch import nn
import functools
import torch.nn.functional as F

class KnobState:

    def __init__(self, roots):
        self.roots = roots

def _save_matmuls_policy(ctx, op, *args, **kwargs):
    pass

def attempt(rank, world_size):
    build_model_out = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    from torch.distributed._composable import checkpoint
    from torch.utils.checkpoint import create_selective_checkpoint_contexts
    kwargs = {'context_fn': functools.partial(create_selective_checkpoint_contexts, _save_matmuls_policy)}
    from torch.distributed.fsdp import fully_shard
    modules = [build_model_out.get_submodule('0')]
    fully_shard(modules[0])
    checkpoint(build_model_out, **kwargs)
    modules = [build_model_out]
    fully_shard(modules[0])
    compose_out_fsdp_roots = [build_model_out]
    compose_out_knobs = KnobState(compose_out_fsdp_roots)
    lo = rank * 2
    step_ = []
    for _ in range(2):
        x_ = torch.randn(4, 4)
        y_ = torch.randn(4, 4)
        step_.append((x_[lo:lo + 2], y_[lo:lo + 2]))
    for i, (x, y) in enumerate(step_):
        last = i == len(step_) - 1
        root = next(iter(compose_out_knobs.roots))
        root.set_reshard_after_backward(last)
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
        if found in ['builtins.RuntimeError@torch/utils/checkpoint.py:__torch_dispatch__']:
            print(f"REPRODUCED exception:parity:builtins.RuntimeError@torch/utils/checkpoint.py:__torch_dispatch__: rank {rank} raised {found}", flush=True)
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
