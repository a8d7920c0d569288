#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=3951471a63742290 sources=c819ef517160c7c9 seconds=320.1
"""Reproduces shardfuzz corpus entry parity-exception-f2ce67efc316.json: exception:parity:builtins.RuntimeError@torch/optim/sgd.py:_multi_tensor_sgd
Known torch bug: foreach optimizers over a mix of DTensor (fully_shard) and plain (replicate)
parameters raise; upstream: https://github.com/pytorch/pytorch/issues/183207.
Observed: rank 0 raised builtins.RuntimeError: aten._foreach_add_.List got mixed torch.Tensor
and DTensor, need to convert all torch.Tensor to DTensor before calling distributed operators!
Run: torchrun --nproc-per-node 2 THIS_FILE.py: prints REPRODUCED and exits 1 while the
failure is there, else exits 0 (expected: no rank raises).
"""

from __future__ import annotations
import torch
from torch import nn
import torch.nn.functional as F

def attempt(rank, world_size):
    import re
    import traceback
    try:
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
    except BaseException as e:
        frames = re.findall('File "([^"]+)", line \\d+, in (\\S+)', traceback.format_exc())
        path, fn = ([(p, f) for p, f in frames if '/torch/' in p and (not f.endswith('comp>'))] or [('?', '?')])[-1]
        found = f'{type(e).__module__}.{type(e).__qualname__}@torch/{path.rpartition("/torch/")[2]}:{fn}'
        if found in ['builtins.RuntimeError@torch/distributed/tensor/_dispatch.py:_try_replicate_spec_for_scalar_tensor', 'builtins.RuntimeError@torch/optim/sgd.py:_multi_tensor_sgd']:
            return f'REPRODUCED exception:parity:builtins.RuntimeError@torch/optim/sgd.py:_multi_tensor_sgd: rank {rank} raised {found}: {e}'
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
