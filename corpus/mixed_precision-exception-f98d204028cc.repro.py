#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=0a37722fda277391 sources=1f6fea1f8a59e6b3 seconds=180.2
"""Reproduces shardfuzz corpus entry mixed_precision-exception-f98d204028cc.json: exception:mixed_precision:builtins.IndexError@torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:foreach_all_gather_copy_out

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
import enum
from dataclasses import dataclass, field
import builtins
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
    CONV1D = 'conv1d'

class Dtype(str, enum.Enum):
    FLOAT32 = 'float32'
    FLOAT64 = 'float64'
    BFLOAT16 = 'bfloat16'
    FLOAT16 = 'float16'

@dataclass()
class Leaf:
    kind: object
    bias: object = True

@dataclass()
class Block:
    children: object

@dataclass()
class ModuleTree:
    width: object
    root: object

@dataclass()
class MixedPrecision:
    pass

@dataclass()
class ShardSpec:
    path: object
    reshard_after_forward: object = True
    shard_dim: object = 0
    mixed_precision: object = None

@dataclass()
class Composition:
    shards: object = ()
    checkpoint_first: object = True

    @property
    def sharded_paths(self):
        return [p for spec in self.shards for p in ()]

    def steps(self):
        items = [() for p in ()] + [() for p in ()]
        items += [() for spec in self.shards]

        def key(item):
            pass
        return sorted(items)

@dataclass()
class Training:
    lr: object = 0.1
    eps: object = 0.001
    steps: object = 2
    batch_per_rank: object = 2
    dtype: object = Dtype.FLOAT32
    set_to_none: object = True

class Body:
    pass

@dataclass()
class ParityBody(Body):
    tree: object
    composition: object
    training: object = field()

@dataclass()
class Case:
    property: object
    world_size: object
    seed: object
    body: object

class PointwiseConv1d(nn.Conv1d):

    def forward(self, x):
        return super().forward(x.unsqueeze(-1)).squeeze(-1)

def build_node(node, width):
    module = PointwiseConv1d(width, width, kernel_size=1, bias=False)
    return module

def build_model(tree, device):
    return build_node(tree.root, 4)
TORCH_DTYPES = {Dtype.FLOAT32: torch.float32}

def _placement_fn(shard_dim, shard_size):
    from torch.distributed.tensor import Shard

    def fn(param):
        return Shard(shard_dim)
    return fn

@dataclass
class Composed:
    model: object

class _null:

    def __enter__(self):
        pass

def run_parity(case, body, ctx):
    comp = body.composition
    tree = body.tree
    training = body.training
    dtype = TORCH_DTYPES[training.dtype]
    model_ = build_model(tree, ctx.device).to(dtype)
    mesh = ctx.mesh((ctx.world_size,), ())
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
    kwargs = {'reshard_after_forward': 2}
    shard_size = mesh.size(mesh.ndim - 1)
    kwargs['shard_placement_fn'] = _placement_fn(1, shard_size)
    modules = [model_.get_submodule(p_) for p_ in ('',)]
    fully_shard(modules if () else modules[0], **kwargs)
    sharded = comp.sharded_paths
    tops = [p for p in sharded if not any((False for q in sharded))]
    compose_out = Composed(model=model_)
    model, composed_ = (model_, compose_out)
    model__ = composed_.model
    gen = torch.Generator().manual_seed(0)
    lo = ctx.rank // 1 * 1
    out_ = []
    _ = next(iter(range(1)))
    step_ = []
    for _ in range(1):
        x_ = torch.randn(ctx.world_size * 1, 4)
        y_ = torch.randn(ctx.world_size * 1, 4)
        step_.append((x_[lo:lo + 1].to(ctx.device), y_[lo:lo + 1].to(ctx.device)))
    out_.append(step_)
    s, step = next(iter(enumerate(out_)))
    i, (x, y) = next(iter(enumerate(step)))
    last = i == len(step) - 1
    ctx_mgr = _null()
    out = model__(x)
    loss = F.mse_loss(out.to(y.dtype), y)
    loss.backward()

def attempt(rank, world_size):
    case = Case(property='mixed_precision', world_size=4, seed=0, body=ParityBody(tree=ModuleTree(width=4, root=Block(children=(Leaf(kind=LeafKind.CONV1D, bias=False),))), composition=Composition(shards=(ShardSpec(path='', reshard_after_forward=2, shard_dim=1, mixed_precision=MixedPrecision()),), checkpoint_first=False), training=Training(lr=0.01, eps=0.0001, steps=1, batch_per_rank=1, set_to_none=False)))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import re
    import traceback
    try:
        run_parity(case, ParityBody(tree=ModuleTree(width=4, root=Block(children=(Leaf(kind=LeafKind.CONV1D, bias=False),))), composition=Composition(shards=(ShardSpec(path='', reshard_after_forward=2, shard_dim=1, mixed_precision=MixedPrecision()),), checkpoint_first=False), training=Training(lr=0.01, eps=0.0001, steps=1, batch_per_rank=1, set_to_none=False)), ctx)
    except BaseException as e:
        frames = re.findall('File "([^"]+)", line \\d+, in (\\S+)', traceback.format_exc())
        path, fn = [(p, f) for p, f in frames if '/torch/' in p and (not f.endswith('comp>'))][-1]
        found = f'{type(e).__module__}.{type(e).__qualname__}@torch/{path.rpartition("/torch/")[2]}:{fn}'
        if found in ['builtins.IndexError@torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:foreach_all_gather_copy_out']:
            return f'REPRODUCED exception:mixed_precision:builtins.IndexError@torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:foreach_all_gather_copy_out: rank {rank} raised {found}: {e}'
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
