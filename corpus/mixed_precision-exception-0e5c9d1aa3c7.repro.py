#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=fcf8cd4586083371 sources=c819ef517160c7c9 seconds=523.3
"""Reproduces shardfuzz corpus entry mixed_precision-exception-0e5c9d1aa3c7.json: exception:mixed_precision:builtins.AssertionError@torch/distributed/fsdp/_fully_shard/_fsdp_common.py:_raise_assert_with_print
Known torch bug: MixedPrecisionPolicy(reduce_dtype) with set_requires_gradient_sync(False) and a
parameter unused on a no-sync microbatch: 'FSDP reduce-scatter expects uniform gradient dtype';
upstream: https://github.com/pytorch/pytorch/issues/196996.
Observed: rank 0 raised builtins.AssertionError: FSDP reduce-scatter expects uniform gradient
dtype but got {torch.bfloat16, torch.float32}
Run: torchrun --nproc-per-node 2 THIS_FILE.py: prints REPRODUCED and exits 1 while the
failure is there, else exits 0 (expected: no rank raises).
"""

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
    import re
    import traceback
    try:
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
    except BaseException as e:
        frames = re.findall('File "([^"]+)", line \\d+, in (\\S+)', traceback.format_exc())
        path, fn = ([(p, f) for p, f in frames if '/torch/' in p and (not f.endswith('comp>'))] or [('?', '?')])[-1]
        found = f"{type(e).__module__}.{type(e).__qualname__}@torch/{path.rpartition('/torch/')[2]}:{fn}"
        if found in ['builtins.AssertionError@torch/distributed/fsdp/_fully_shard/_fsdp_common.py:_raise_assert_with_print']:
            return f'REPRODUCED exception:mixed_precision:builtins.AssertionError@torch/distributed/fsdp/_fully_shard/_fsdp_common.py:_raise_assert_with_print: rank {rank} raised {found}: {e}'
        return f"FAIL (not the entry's failure): rank {rank} raised {found}: {e}"
    return 'PASS: no rank raised'

def main():
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import torch.distributed as dist
    dist.init_process_group('gloo')
    verdict = attempt(dist.get_rank(), dist.get_world_size())
    if verdict:
        print(verdict, flush=True)
    os._exit(1 if verdict.startswith('REPRODUCED') else 0)
if __name__ == '__main__':
    main()
