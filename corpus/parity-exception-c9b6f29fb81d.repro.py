#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=8b7ebc3b68aad9f0 sources=845e968d7c09e2fe seconds=221.9
"""Reproduces shardfuzz corpus entry parity-exception-c9b6f29fb81d.json: exception:parity:builtins.IndexError@torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:foreach_all_gather_copy_out

Observed: rank 0 raised builtins.IndexError: list index out of range
Known torch bug: fully_shard with an int reshard_after_forward and Shard(1) placements:
IndexError in foreach_all_gather_copy_out; upstream: none found.
Expected: no rank raises.

    torchrun --nproc-per-node 4 THIS_FILE.py

prints REPRODUCED and exits 1 while the failure is there, else exits 0.
"""

from __future__ import annotations
import torch
import enum
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

class LeafKind(str, enum.Enum):
    LINEAR = 'linear'

@dataclass()
class Leaf:
    kind: object

@dataclass()
class Block:
    children: object

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

    def steps(self):
        items = [] + []
        items += [('fully_shard', spec.path) for spec in self.shards]
        return sorted(items)

class TreeBlock(nn.Module):

    def __init__(self, children, residual, width, scale, buffer):
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)

    def forward(self, x):
        y = x
        for name, child in self.named_children():
            y = child(y)
        return y

def build_node(node, width):
    if isinstance(node, Leaf):
        module = nn.Linear(width, width)
        return module
    return TreeBlock([build_node(c, width) for c in node.children], False, width, False, False)

def _placement_fn(shard_dim, shard_size):
    from torch.distributed.tensor import Shard

    def fn(param):
        if param.ndim > shard_dim and param.shape[shard_dim] % shard_size == 0:
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
        comp = Composition(shards=(ShardSpec(path='1'),))
        dtype = torch.float32
        build_model_out = build_node(Block(children=(Leaf(kind=LeafKind.LINEAR), Leaf(kind=LeafKind.LINEAR))), 4)
        model_ = build_model_out.to(dtype)
        mesh = ctx.mesh((world_size,), ())
        specs = {s_.path: s_ for s_ in (ShardSpec(path='1', reshard_after_forward=2),)}
        api, path_ = next(iter(comp.steps()))
        spec = specs[path_]
        from torch.distributed.fsdp import fully_shard
        kwargs = {'reshard_after_forward': spec.reshard_after_forward}
        shard_size = mesh.size(mesh.ndim - 1)
        kwargs['shard_placement_fn'] = _placement_fn(1, shard_size)
        modules = [model_.get_submodule(p_) for p_ in spec.paths]
        fully_shard(modules if () else modules[0], **kwargs)
        sharded = [p for spec in (ShardSpec(path='1'),) for p in spec.paths]
        tops = [p__ for p__ in sharded if not any((is_ancestor(q, p__) for q in sharded))]
        compose_out = Composed(model=model_, fsdp_roots=[model_.get_submodule(p__) for p__ in tops])
        model, composed_ = (model_, compose_out)
        model__ = composed_.model
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
            return f'REPRODUCED exception:parity:builtins.IndexError@torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:foreach_all_gather_copy_out: rank {rank} raised {found}: {e}'
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
