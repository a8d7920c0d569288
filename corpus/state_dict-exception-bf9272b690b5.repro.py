#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=e5539532b13e61d5 sources=c2f9d3144d82dce8 seconds=219.3
"""Reproduces shardfuzz corpus entry state_dict-exception-bf9272b690b5.json: exception:state_dict:builtins.IndexError@torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:foreach_all_gather_copy_out

Observed: Not a state-dict bug: FSDP2's backward all-gather raises IndexError in
foreach_all_gather_copy_out for a module with an int reshard_after_forward whose parameters are
placed Shard(1); met while training the source model. The training properties' entry
corpus/parity-exception-c9b6f29fb81d.json is the same bug. (rank 0 raised builtins.IndexError:
list index out of range)
Known torch bug: fully_shard with an int reshard_after_forward and Shard(1) placements:
IndexError in foreach_all_gather_copy_out; upstream: none found.
Expected: no rank raises.

    torchrun --nproc-per-node 4 THIS_FILE.py

prints REPRODUCED and exits 1 while the failure is there, else exits 0.
"""

from __future__ import annotations
import torch
import enum
from torch import nn
import torch.nn.functional as F
from dataclasses import dataclass, field, replace

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

class Dtype(str, enum.Enum):
    FLOAT32 = 'float32'

@dataclass()
class Leaf:
    kind: object

@dataclass()
class Block:
    children: object

@dataclass()
class ModuleTree:
    width: object
    root: object

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

@dataclass()
class Training:
    dtype: object = Dtype.FLOAT32

class Body:
    pass

@dataclass()
class Case:
    property: object
    world_size: object
    seed: object
    body: object

@dataclass()
class StateDictBody(Body):
    tree: object
    source: object
    target: object
    training: object = field()

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
TORCH_DTYPES = {Dtype.FLOAT32: torch.float32}

def _placement_fn(shard_dim, shard_size):
    from torch.distributed.tensor import Shard

    def fn(param):
        if param.ndim > shard_dim and param.shape[shard_dim] % shard_size == 0:
            return Shard(shard_dim)
    return fn

def batches(case, training, width, ctx, tp_size=1):
    lo = ctx.rank // tp_size * 1
    out = []
    step = []
    x = torch.randn(ctx.world_size * 1, width)
    y = torch.randn(ctx.world_size * 1, width)
    step.append((x[lo:lo + 1].to(ctx.device), y[lo:lo + 1].to(ctx.device)))
    out.append(step)
    return out

def attempt(rank, world_size):
    case = Case(property='state_dict', world_size=4, seed=0, body=StateDictBody(tree=ModuleTree(width=4, root=Block(children=())), source=Composition(), target=Composition(), training=Training()))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import re
    import traceback
    try:
        t = Training()
        data = [step[0] for step in batches(case, replace(t), 4, ctx)]
        comp = Composition(shards=(ShardSpec(path='1'),))
        build_model_out = build_node(Block(children=(Leaf(kind=LeafKind.LINEAR), Leaf(kind=LeafKind.LINEAR))), 4)
        model = build_model_out.to(TORCH_DTYPES[t.dtype])
        mesh = ctx.mesh((world_size,), ())
        specs = {s.path: s for s in (ShardSpec(path='1', reshard_after_forward=2),)}
        api, path_ = next(iter(comp.steps()))
        spec = specs[path_]
        from torch.distributed.fsdp import fully_shard
        kwargs = {'reshard_after_forward': spec.reshard_after_forward}
        shard_size = mesh.size(mesh.ndim - 1)
        kwargs['shard_placement_fn'] = _placement_fn(1, shard_size)
        modules = [model.get_submodule(p_) for p_ in spec.paths]
        fully_shard(modules if () else modules[0], **kwargs)
        data_ = data[:1]
        x, y = next(iter(data_))
        loss = F.mse_loss(model(x).to(y.dtype), y)
        loss.backward()
    except BaseException as e:
        frames = re.findall('File "([^"]+)", line \\d+, in (\\S+)', traceback.format_exc())
        path, fn = [(p, f) for p, f in frames if '/torch/' in p and (not f.endswith('comp>'))][-1]
        found = f'{type(e).__module__}.{type(e).__qualname__}@torch/{path.rpartition("/torch/")[2]}:{fn}'
        if found in ['builtins.IndexError@torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:foreach_all_gather_copy_out']:
            return f'REPRODUCED exception:state_dict:builtins.IndexError@torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:foreach_all_gather_copy_out: rank {rank} raised {found}: {e}'
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
