#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=10600d5ba9b8994c sources=ce057bc0da65e4dc seconds=712.7
# Reproduces shardfuzz corpus entry metamorphic-exception-4ecb7d725bd4.json: exception:metamorphic:builtins.IndexError@torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:foreach_all_gather_copy_out
# Known torch bug: fully_shard with an int reshard_after_forward and Shard(1) placements:
# IndexError in foreach_all_gather_copy_out, or (a dim-1 size the post-forward mesh splits
# unevenly) as_strided out of bounds in to_sharded_post_forward; upstream: none found.
# Observed: rank 0 raised builtins.IndexError: list index out of range
# Run: torchrun --nproc-per-node 4 THIS_FILE.py: while the failure is there a rank raises
# builtins.IndexError in
# torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:foreach_all_gather_copy_out, prints its
# traceback and REPRODUCED and exits 1; once it is gone rank 0 prints PASS and every rank exits 0
# (expected: no rank raises); a rank exits 2 where the script cannot run (not under torchrun,
# another world size) or the case fails another way (it prints FAIL). torchrun's own status is 1
# whenever a rank's is not 0.

from __future__ import annotations
import torch
from torch import nn
import torch.nn.functional as F

class PointwiseConv1d(nn.Conv1d):

    def forward(self, x):
        return super().forward(x.unsqueeze(-1))

def _placement_fn():
    from torch.distributed.tensor import Shard

    def fn(param):
        return Shard(1)
    return fn

def attempt(rank, world_size):
    build_model_out = PointwiseConv1d(4, 4, kernel_size=1, bias=False)
    from torch.distributed.fsdp import fully_shard
    kwargs = {'reshard_after_forward': 2, 'shard_placement_fn': _placement_fn()}
    fully_shard(build_model_out, **kwargs)
    x_ = torch.randn(world_size, 4)
    y_ = torch.randn(world_size, 4)
    step_ = [(x_[rank:rank + 1], y_[rank:rank + 1])]
    i, (x, y) = next(enumerate(step_))
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
    if os.environ.get("WORLD_SIZE") != "4":
        print("run it with: torchrun --nproc-per-node 4 " + sys.argv[0], file=sys.stderr)
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
        if found in ['builtins.IndexError@torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:foreach_all_gather_copy_out', 'builtins.RuntimeError@torch/distributed/fsdp/_fully_shard/_fsdp_param.py:to_sharded_post_forward']:
            print(f"REPRODUCED exception:metamorphic:builtins.IndexError@torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:foreach_all_gather_copy_out: rank {rank} raised {found}", flush=True)
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
