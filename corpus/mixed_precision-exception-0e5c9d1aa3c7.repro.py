#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=fcf8cd4586083371 sources=c819ef517160c7c9 seconds=557.0
# Reproduces shardfuzz corpus entry mixed_precision-exception-0e5c9d1aa3c7.json: exception:mixed_precision:builtins.AssertionError@torch/distributed/fsdp/_fully_shard/_fsdp_common.py:_raise_assert_with_print
# Known torch bug: MixedPrecisionPolicy(reduce_dtype) with set_requires_gradient_sync(False) and a
# parameter unused on a no-sync microbatch: 'FSDP reduce-scatter expects uniform gradient dtype';
# upstream: https://github.com/pytorch/pytorch/issues/196996.
# Observed: rank 0 raised builtins.AssertionError: FSDP reduce-scatter expects uniform gradient
# dtype but got {torch.bfloat16, torch.float32}
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: while the failure is there a rank raises
# builtins.AssertionError in
# torch/distributed/fsdp/_fully_shard/_fsdp_common.py:_raise_assert_with_print, prints its
# traceback and REPRODUCED and exits 1; once it is gone rank 0 prints PASS and every rank exits 0
# (expected: no rank raises); a rank exits 2 where the script cannot run (not under torchrun,
# another world size) or the case fails another way (it prints FAIL). torchrun's own status is 1
# whenever a rank's is not 0.

from __future__ import annotations
import torch
import enum
from dataclasses import dataclass
from torch import nn
import torch.nn.functional as F

class AccumSync(str, enum.Enum):
    ALWAYS = 'always'
    NO_GRAD_SYNC = 'no_grad_sync'

@dataclass()
class Skip:
    path: object
    step: object

class TreeBlock(nn.Module):

    def __init__(self, children):
        super().__init__()
        i, child = next(iter(enumerate(children)))
        self.add_module(str(i), child)
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(1))

    def forward(self, x):
        y = x
        for name, child in self.named_children():
            if name in self.skipped:
                continue
            y = child(y)
        y = y * self.scale
        return y

class PointwiseConv1d(nn.Conv1d):
    pass

def attempt(rank, world_size):
    training_skips = (Skip(path='0', step=0),)
    build_model_out = TreeBlock([PointwiseConv1d(1, 1, kernel_size=1)])
    from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
    fully_shard(build_model_out, mp_policy=MixedPrecisionPolicy(reduce_dtype=torch.bfloat16))
    blocks = {'.'.join(()): m for name, m in build_model_out.named_modules() if isinstance(m, TreeBlock)}
    step_ = []
    for __ in range(2):
        x_ = torch.randn(world_size, 1)
        y_ = torch.randn(world_size, 1)
        step_.append((x_[rank:rank + 1], y_[rank:rank + 1]))
    for i, (x, y) in enumerate(step_):
        skipped = ['0' for s_ in training_skips if 0 == i]
        skipped_ = {p__: set() for p__ in blocks}
        for path__ in skipped:
            parent, _, name_ = path__.rpartition('.')
            skipped_[parent].add(name_)
        p__, block = next(iter(blocks.items()))
        block.skipped = frozenset(skipped_[p__])
        last = i == len(step_) - 1
        sync = AccumSync.ALWAYS if last else AccumSync.NO_GRAD_SYNC
        requires_gradient_sync = sync is not AccumSync.NO_GRAD_SYNC
        m_ = build_model_out
        m_.set_requires_gradient_sync(requires_gradient_sync)
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
        if found in ['builtins.AssertionError@torch/distributed/fsdp/_fully_shard/_fsdp_common.py:_raise_assert_with_print']:
            print(f"REPRODUCED exception:mixed_precision:builtins.AssertionError@torch/distributed/fsdp/_fully_shard/_fsdp_common.py:_raise_assert_with_print: rank {rank} raised {found}", flush=True)
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
