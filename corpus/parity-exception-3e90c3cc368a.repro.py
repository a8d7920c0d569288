#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=71d9601af2884473 sources=c819ef517160c7c9 seconds=568.8
# Reproduces shardfuzz corpus entry parity-exception-3e90c3cc368a.json: exception:parity:builtins.ValueError@torch/utils/checkpoint.py:_checkpoint_without_reentrant_generator
# Known torch bug: composable checkpoint(module, debug=True) raises ValueError 'debug=True is
# incompatible with non-default context_fn' on the first forward whatever the caller passes: it
# always hands torch.utils.checkpoint a context_fn of its own; upstream:
# https://github.com/pytorch/pytorch/issues/185285.
# Observed: composable checkpoint(debug=True) always raises ValueError 'debug=True is incompatible
# with non-default context_fn' (it passes torch.utils.checkpoint a context_fn of its own); met ...
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: while the failure is there a rank raises
# builtins.ValueError in torch/utils/checkpoint.py:_checkpoint_without_reentrant_generator, prints
# its traceback and REPRODUCED and exits 1; once it is gone rank 0 prints PASS and every rank
# exits 0 (expected: no rank raises); a rank exits 2 where the script cannot run (not under
# torchrun, another world size) or the case fails another way (it prints FAIL). torchrun's own
# status is 1 whenever a rank's is not 0.

from __future__ import annotations
import torch
from torch import nn

def attempt(rank, world_size):
    build_model_out = nn.Linear(4, 4)
    from torch.distributed._composable import checkpoint
    kwargs = {'debug': True}
    checkpoint(build_model_out, **kwargs)
    lo = rank * 2
    x_ = torch.randn(4, 4)
    y_ = torch.randn(4, 4)
    step_ = [(x_[lo:lo + 2], y_[lo:lo + 2])]
    i, (x, y) = next(enumerate(step_))
    out = build_model_out(x)

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
        if found in ['builtins.ValueError@torch/utils/checkpoint.py:_checkpoint_without_reentrant_generator']:
            print(f"REPRODUCED exception:parity:builtins.ValueError@torch/utils/checkpoint.py:_checkpoint_without_reentrant_generator: rank {rank} raised {found}", flush=True)
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
