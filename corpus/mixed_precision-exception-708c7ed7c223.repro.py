#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=b29b69107395f153 sources=c819ef517160c7c9 seconds=656.4
# Reproduces shardfuzz corpus entry mixed_precision-exception-708c7ed7c223.json: exception:mixed_precision:builtins.AttributeError@torch/distributed/fsdp/_fully_shard/_fsdp_param.py:to_accumulated_grad_if_needed
# Known torch bug: MixedPrecisionPolicy(reduce_dtype) with set_requires_gradient_sync(False): a
# unit that never ran forward has no '_unsharded_param' in the root's post-backward; upstream:
# https://github.com/pytorch/pytorch/issues/194058.
# Observed: rank 0 raised builtins.AttributeError: 'FSDPParam' object has no attribute
# '_unsharded_param'
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: prints REPRODUCED and exits 1 while the
# failure is there, else exits 0 (expected: no rank raises).

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
    import re
    import traceback
    try:
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
    except BaseException as e:
        frames = re.findall('File "([^"]+)", line \\d+, in (\\S+)', traceback.format_exc())
        path, fn = ([(p, f) for p, f in frames if '/torch/' in p and (not f.endswith('comp>'))] or [('?', '?')])[-1]
        found = f"{type(e).__module__}.{type(e).__qualname__}@torch/{path.rpartition('/torch/')[2]}:{fn}"
        if found in ['builtins.AttributeError@torch/distributed/fsdp/_fully_shard/_fsdp_param.py:to_accumulated_grad_if_needed']:
            return f'REPRODUCED exception:mixed_precision:builtins.AttributeError@torch/distributed/fsdp/_fully_shard/_fsdp_param.py:to_accumulated_grad_if_needed: rank {rank} raised {found}: {e}'
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
