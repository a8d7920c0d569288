#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=e5539532b13e61d5 sources=2836a7ca10136e42 seconds=313.8
"""Reproduces shardfuzz corpus entry state_dict-exception-bf9272b690b5.json: exception:state_dict:builtins.IndexError@torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:foreach_all_gather_copy_out
Known torch bug: fully_shard with an int reshard_after_forward and Shard(1) placements:
IndexError in foreach_all_gather_copy_out; upstream: none found.
Observed: rank 0 raised builtins.IndexError: list index out of range
Run: torchrun --nproc-per-node 4 THIS_FILE.py: prints REPRODUCED and exits 1 while the
failure is there, else exits 0 (expected: no rank raises).
"""

from __future__ import annotations
import torch
from torch import nn
import torch.nn.functional as F

def _placement_fn(shard_size):
    from torch.distributed.tensor import Shard

    def fn(param):
        if param.ndim > 1 and param.shape[1] % shard_size == 0:
            return Shard(1)
    return fn

def attempt(rank, world_size):
    ctx__meshes = {}
    import re
    import traceback
    try:
        x = torch.randn(world_size, 4)
        y = torch.randn(world_size, 4)
        step_ = [(x[rank:rank + 1].to(torch.device('cpu')), y[rank:rank + 1].to(torch.device('cpu')))]
        build_model_out = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
        model = build_model_out.to(torch.float32)
        shape = (4,)
        from torch.distributed.device_mesh import init_device_mesh
        key = ()
        ctx__meshes[key] = init_device_mesh(torch.device('cpu').type, shape)
        mesh = ctx__meshes[key]
        from torch.distributed.fsdp import fully_shard
        kwargs = {'reshard_after_forward': 2}
        shard_size = mesh.size(mesh.ndim - 1)
        kwargs['shard_placement_fn'] = _placement_fn(shard_size)
        modules = [model.get_submodule('1')]
        fully_shard(modules[0], **kwargs)
        data_ = [step_[0]][:1]
        x_, y_ = next(iter(data_))
        loss = F.mse_loss(model(x_).to(y_.dtype), y_)
        loss.backward()
    except BaseException as e:
        frames = re.findall('File "([^"]+)", line \\d+, in (\\S+)', traceback.format_exc())
        path, fn = ([(p, f) for p, f in frames if '/torch/' in p and (not f.endswith('comp>'))] or [('?', '?')])[-1]
        found = f"{type(e).__module__}.{type(e).__qualname__}@torch/{path.rpartition('/torch/')[2]}:{fn}"
        if found in ['builtins.IndexError@torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:foreach_all_gather_copy_out']:
            return f'REPRODUCED exception:state_dict:builtins.IndexError@torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:foreach_all_gather_copy_out: rank {rank} raised {found}: {e}'
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
