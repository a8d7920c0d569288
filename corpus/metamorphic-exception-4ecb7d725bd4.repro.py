#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=046d6314125fae89 sources=845e968d7c09e2fe seconds=319.5
"""Reproduces shardfuzz corpus entry metamorphic-exception-4ecb7d725bd4.json: exception:metamorphic:builtins.IndexError@torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:foreach_all_gather_copy_out

Observed: FSDP2's backward all-gather raises IndexError in foreach_all_gather_copy_out for a
module with an int reshard_after_forward whose parameters are placed Shard(1) (4 ranks); the
same bug as corpus/parity-exception-c9b6f29fb81d.json, met by this property. (rank 0 raised
builtins.IndexError: list index out of range)
Known torch bug: fully_shard with an int reshard_after_forward and Shard(1) placements:
IndexError in foreach_all_gather_copy_out; upstream: none found.
Expected: no rank raises.

    torchrun --nproc-per-node 4 THIS_FILE.py

prints REPRODUCED and exits 1 while the failure is there, else exits 0.
"""

from __future__ import annotations
import torch
from dataclasses import dataclass, field
from torch import nn
import torch.nn.functional as F

@dataclass
class RankContext:
    rank: object
    world_size: object
    device: object
    backend: object
    _meshes: object = field(default_factory=dict)

    def mesh(self, shape, names):
        from torch.distributed.device_mesh import init_device_mesh
        key = ()
        self._meshes[key] = init_device_mesh(self.device.type, shape)
        return self._meshes[key]

def is_ancestor(ancestor, path):
    pass

@dataclass()
class ShardSpec:
    path: object
    reshard_after_forward: object = True

    @property
    def paths(self):
        return (self.path, *())

@dataclass()
class Composition:
    shards: object = ()
    checkpoints: object = ()

    def steps(self):
        items = [() for p in self.checkpoints] + []
        items += [('fully_shard', spec.path) for spec in self.shards]
        return sorted(items)

class PointwiseConv1d(nn.Conv1d):

    def forward(self, x):
        return super().forward(x.unsqueeze(-1)).squeeze(-1)

def _placement_fn(shard_dim, shard_size):
    from torch.distributed.tensor import Shard

    def fn(param):
        return Shard(shard_dim)
    return fn

@dataclass
class Composed:
    model: object
    fsdp_roots: object = field()

def attempt(rank, world_size):
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import re
    import traceback
    try:
        comp = Composition(shards=(ShardSpec(path=''),))
        dtype = torch.float32
        module = PointwiseConv1d(4, 4, kernel_size=1, bias=False)
        model_ = module.to(dtype)
        mesh = ctx.mesh((world_size,), ())
        specs = {s_.path: s_ for s_ in (ShardSpec(path='', reshard_after_forward=2),)}
        api, path_ = next(iter(comp.steps()))
        spec = specs[path_]
        from torch.distributed.fsdp import fully_shard
        kwargs = {'reshard_after_forward': spec.reshard_after_forward}
        shard_size = mesh.size(mesh.ndim - 1)
        kwargs['shard_placement_fn'] = _placement_fn(1, shard_size)
        modules = [model_.get_submodule(p_) for p_ in spec.paths]
        fully_shard(modules if () else modules[0], **kwargs)
        sharded = [p for spec in (ShardSpec(path=''),) for p in spec.paths]
        tops = [p__ for p__ in sharded if not any((is_ancestor(q, p__) for q in sharded))]
        compose_out = Composed(model=model_, fsdp_roots=[model_.get_submodule(p__) for p__ in tops])
        model, composed = (model_, compose_out)
        model__ = composed.model
        lo = rank // 1 * 1
        out_ = []
        step_ = []
        x_ = torch.randn(world_size * 1, 4)
        y_ = torch.randn(world_size * 1, 4)
        step_.append((x_[lo:lo + 1].to(torch.device('cpu')), y_[lo:lo + 1].to(torch.device('cpu'))))
        out_.append(step_)
        s, step = next(iter(enumerate(out_)))
        i, (x, y) = next(iter(enumerate(step)))
        out = model__(x)
        loss = F.mse_loss(out.to(y.dtype), y)
        loss.backward()
    except BaseException as e:
        frames = re.findall('File "([^"]+)", line \\d+, in (\\S+)', traceback.format_exc())
        path, fn = [(p, f) for p, f in frames if '/torch/' in p and (not f.endswith('comp>'))][-1]
        found = f'{type(e).__module__}.{type(e).__qualname__}@torch/{path.rpartition("/torch/")[2]}:{fn}'
        if found in ['builtins.IndexError@torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:foreach_all_gather_copy_out']:
            return f'REPRODUCED exception:metamorphic:builtins.IndexError@torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:foreach_all_gather_copy_out: rank {rank} raised {found}: {e}'
        return f"FAIL (not the entry's failure): rank {rank} raised {found}: {e}"
    return 'PASS: no rank raised'

def main():
    import os
    import torch.distributed as dist
    dist.init_process_group('gloo')
    verdict = attempt(dist.get_rank(), dist.get_world_size())
    if verdict:
        print(verdict, flush=True)
    os._exit(1 if verdict.startswith('REPRODUCED') else 0)
if __name__ == '__main__':
    main()
