#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=c2c685119f970f8e sources=7d6f5cb23a31c8e4 seconds=233.0
"""Reproduces shardfuzz corpus entry dcp-exception-4d02691a497a.json: exception:dcp:builtins.IndexError@torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:foreach_all_gather_copy_out

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
    shard_dim: object = 0

    @property
    def paths(self):
        return (self.path, *())

@dataclass()
class Composition:
    shards: object = ()

    def steps(self):
        items = [() for p in ()] + [() for p in ()]
        items += [('fully_shard', spec.path) for spec in self.shards]

        def key(item):
            pass
        return sorted(items, key=key)

@dataclass()
class Training:
    steps: object = 2
    dtype: object = Dtype.FLOAT32

class Body:
    pass

@dataclass()
class Case:
    property: object
    world_size: object
    seed: object
    body: object

class DcpItem(str, enum.Enum):
    MODEL = 'model'

@dataclass()
class DcpBody(Body):
    tree: object
    source: object
    target: object
    entries: object
    training: object = field()
    steps_after: object = 1

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

@dataclass
class Composed:
    model: object

def batches(case, training, width, ctx, tp_size=1):
    gen = torch.Generator().manual_seed(0)
    lo = ctx.rank // tp_size * 1
    out = []
    step = []
    _ = next(iter(range(1)))
    x = torch.randn(ctx.world_size * 1, width)
    y = torch.randn(ctx.world_size * 1, width)
    step.append((x[lo:lo + 1].to(ctx.device), y[lo:lo + 1].to(ctx.device)))
    out.append(step)
    return out

@dataclass
class Side:
    composed: object
    comp: object
    training: object

    @property
    def model(self):
        return self.composed.model

def attempt(rank, world_size):
    case = Case(property='dcp', world_size=4, seed=0, body=DcpBody(tree=ModuleTree(width=4, root=Block(children=(Leaf(kind=LeafKind.LINEAR), Leaf(kind=LeafKind.LINEAR)))), source=Composition(shards=(ShardSpec(path='1', reshard_after_forward=2, shard_dim=1), ShardSpec(path=''))), target=Composition(shards=(ShardSpec(path='1', reshard_after_forward=2, shard_dim=1), ShardSpec(path=''))), entries=(DcpItem.MODEL,), training=Training(steps=1), steps_after=0))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import re
    import traceback
    try:
        body = DcpBody(tree=ModuleTree(width=4, root=Block(children=(Leaf(kind=LeafKind.LINEAR), Leaf(kind=LeafKind.LINEAR)))), source=Composition(shards=(ShardSpec(path='1', reshard_after_forward=2),)), target=Composition(), entries=(), training=Training())
        t = body.training
        data = [step[0] for step in batches(case, replace(t), 4, ctx)]
        tree = body.tree
        comp = body.source
        build_model_out = build_node(tree.root, 4)
        model = build_model_out.to(TORCH_DTYPES[t.dtype])
        mesh = ctx.mesh((ctx.world_size,), ())
        specs = {s.path: s for s in comp.shards}
        api, path_ = next(iter(comp.steps()))
        spec = specs[path_]
        from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
        kwargs = {'reshard_after_forward': spec.reshard_after_forward}
        shard_size = mesh.size(mesh.ndim - 1)
        kwargs['shard_placement_fn'] = _placement_fn(1, shard_size)
        modules = [model.get_submodule(p_) for p_ in spec.paths]
        fully_shard(modules if () else modules[0], **kwargs)
        composed = Composed(model=model)
        src = Side(composed=composed, comp=comp, training=t)
        params = list(src.model.parameters())
        params_ = params
        params_ = [p__ for p__ in params_ if p__.requires_grad or id(p__) in held]
        data_ = data[:1]
        x, y = next(iter(data_))
        loss = F.mse_loss(src.model(x).to(y.dtype), y)
        loss.backward()
    except BaseException as e:
        frames = re.findall('File "([^"]+)", line \\d+, in (\\S+)', traceback.format_exc())
        path, fn = [(p, f) for p, f in frames if '/torch/' in p and (not f.endswith('comp>'))][-1]
        found = f'{type(e).__module__}.{type(e).__qualname__}@torch/{path.rpartition("/torch/")[2]}:{fn}'
        if found in ['builtins.IndexError@torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:foreach_all_gather_copy_out']:
            return f'REPRODUCED exception:dcp:builtins.IndexError@torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:foreach_all_gather_copy_out: rank {rank} raised {found}: {e}'
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
