#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=e4228a5d4278b1d8 sources=c2f9d3144d82dce8 seconds=158.2
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
import builtins
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
        key = (shape, names)
        self._meshes[key] = init_device_mesh(self.device.type, shape, mesh_dim_names=names)
        return self._meshes[key]

class LeafKind(str, enum.Enum):
    LINEAR = 'linear'

class Dtype(str, enum.Enum):
    FLOAT32 = 'float32'
    FLOAT64 = 'float64'
    BFLOAT16 = 'bfloat16'
    FLOAT16 = 'float16'

@dataclass(frozen=True)
class Leaf:
    kind: object

@dataclass(frozen=True)
class Block:
    children: object

@dataclass(frozen=True)
class ModuleTree:
    width: object
    root: object

def is_ancestor(ancestor, path):
    pass

@dataclass(frozen=True)
class ShardSpec:
    path: object
    reshard_after_forward: object = True
    shard_dim: object = 0

    @property
    def paths(self):
        return (self.path, *())

@dataclass(frozen=True)
class Composition:
    shards: object = ()

    @property
    def sharded_paths(self):
        return [p for spec in self.shards for p in spec.paths]

    def steps(self):
        order = {'checkpoint': 0, 'fully_shard': 1, 'replicate': 2}
        items = [('checkpoint', p) for p in ()] + [('replicate', p) for p in ()]
        items += [('fully_shard', spec.path) for spec in self.shards]

        def key(item):
            api, path = item
            depth = min((q.count('.') + (q != '') for q in self._spec_paths(api, path)))
            return (-depth, order[api], path)
        return sorted(items, key=key)

    def _spec_paths(self, api, path):
        return next((s.paths for s in self.shards if s.path == path))

@dataclass(frozen=True)
class Training:
    momentum: object = 0.0
    steps: object = 2
    batch_per_rank: object = 2
    dtype: object = Dtype.FLOAT32

class Body:
    pass

@dataclass(frozen=True)
class Case:
    property: object
    world_size: object
    seed: object
    body: object

@dataclass(frozen=True)
class StateDictBody(Body):
    tree: object
    source: object
    target: object
    training: object = field(default_factory=Training)
    steps_after: object = 1

class TreeBlock(nn.Module):

    def __init__(self, children, residual, width, scale, buffer):
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)
        self.shift = None
        self.skipped: frozenset[str] = frozenset()

    def forward(self, x):
        y = x
        for name, child in self.named_children():
            y = child(y)
        return y

def build_node(node, width):
    if isinstance(node, Leaf):
        module = nn.Linear(width, width, bias=True)
        return module
    return TreeBlock([build_node(c, width) for c in node.children], False, width, False, False)

def build_model(tree, device):
    return build_node(tree.root, 4)
TORCH_DTYPES = {Dtype.FLOAT32: torch.float32, Dtype.FLOAT64: torch.float64, Dtype.BFLOAT16: torch.bfloat16, Dtype.FLOAT16: torch.float16}

def _placement_fn(shard_dim, shard_size):
    from torch.distributed.tensor import Shard

    def fn(param):
        if param.ndim > shard_dim and param.shape[shard_dim] % shard_size == 0:
            return Shard(shard_dim)
        return None
    return fn

@dataclass
class Composed:
    model: object
    fsdp_roots: object = field(default_factory=list)

def batches(case, training, width, ctx, tp_size=1):
    dtype = TORCH_DTYPES[training.dtype]
    gen = torch.Generator().manual_seed(0)
    lo = ctx.rank // tp_size * 1
    out = []
    _ = next(iter(range(1)))
    step = []
    for _ in range(1):
        x = torch.randn(ctx.world_size * 1, width, generator=gen, dtype=dtype)
        y = torch.randn(ctx.world_size * 1, width, generator=gen, dtype=dtype)
        step.append((x[lo:lo + 1].to(ctx.device), y[lo:lo + 1].to(ctx.device)))
    out.append(step)
    return out

@dataclass
class Side:
    composed: object
    comp: object
    training: object
    opt: object = None
    schedule: object = ()
    step: object = 0

    @property
    def model(self):
        return self.composed.model

    def names(self):
        pass

def run_state_dict(case, body, ctx):
    t = body.training
    steps = 1 + 0
    data = [step[0] for step in batches(case, replace(t, steps=steps), 4, ctx)]
    tree = body.tree
    comp = body.source
    schedule = ()
    torch.manual_seed(0)
    device = ctx.device
    model = build_model(tree, device).to(TORCH_DTYPES[t.dtype])
    from torch.distributed._composable import checkpoint, replicate
    mesh = ctx.mesh((ctx.world_size,), ('shard',))
    specs = {s.path: s for s in comp.shards}
    api, path = next(iter(comp.steps()))
    spec = specs[path]
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
    kwargs = {'mesh': mesh, 'reshard_after_forward': spec.reshard_after_forward}
    shard_size = mesh.size(mesh.ndim - 1)
    kwargs['shard_placement_fn'] = _placement_fn(1, shard_size)
    modules = [model.get_submodule(p_) for p_ in spec.paths]
    fully_shard(modules if () else modules[0], **kwargs)
    sharded = comp.sharded_paths
    tops = [p for p in sharded if not any((is_ancestor(q, p) for q in sharded))]
    composed = Composed(model=model, fsdp_roots=[model.get_submodule(p) for p in tops])
    src = Side(composed=composed, comp=comp, training=t, schedule=schedule)
    params = list(src.model.parameters())
    frozen = []
    params_ = params
    held = {id(p__) for p__ in frozen}
    params_ = [p__ for p__ in params_ if p__.requires_grad or id(p__) in held]
    groups = params_
    src.opt = torch.optim.SGD(groups, lr=0.1, momentum=0.9, foreach=None)
    src.opt
    data_ = data[:1]
    assert src.opt is not None
    x, y = next(iter(data_))
    src.step += 1
    loss = F.mse_loss(src.model(x).to(y.dtype), y)
    loss.backward()

def attempt(rank, world_size):
    import torch
    import torch.distributed as dist
    case = Case(property='state_dict', world_size=4, seed=0, body=StateDictBody(tree=ModuleTree(width=4, root=Block(children=(Leaf(kind=LeafKind.LINEAR), Leaf(kind=LeafKind.LINEAR)))), source=Composition(shards=(ShardSpec(path='1', reshard_after_forward=2, shard_dim=1), ShardSpec(path=''))), target=Composition(shards=(ShardSpec(path='1', reshard_after_forward=2, shard_dim=1), ShardSpec(path=''))), training=Training(momentum=0.9, steps=1, batch_per_rank=1), steps_after=0))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import re
    import traceback
    try:
        run_state_dict(case, StateDictBody(tree=ModuleTree(width=4, root=Block(children=(Leaf(kind=LeafKind.LINEAR), Leaf(kind=LeafKind.LINEAR)))), source=Composition(shards=(ShardSpec(path='1', reshard_after_forward=2, shard_dim=1), ShardSpec(path=''))), target=Composition(shards=(ShardSpec(path='1', reshard_after_forward=2, shard_dim=1), ShardSpec(path=''))), training=Training(momentum=0.9, steps=1, batch_per_rank=1), steps_after=0), ctx)
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
