#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=e0d493e9f9cd8cee sources=845e968d7c09e2fe seconds=155.0
"""Reproduces shardfuzz corpus entry parity-exception-c9b6f29fb81d.json: exception:parity:builtins.IndexError@torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:foreach_all_gather_copy_out

Observed: rank 0 raised builtins.IndexError: list index out of range
Known torch bug: fully_shard with an int reshard_after_forward and Shard(1) placements:
IndexError in foreach_all_gather_copy_out; upstream: none found.
Expected: no rank raises.

    torchrun --nproc-per-node 4 THIS_FILE.py

prints REPRODUCED and exits 1 while the failure is there, else exits 0.
"""

from __future__ import annotations
from typing import Any
from dataclasses import dataclass, field
import torch
import enum
from dataclasses import dataclass
from dataclasses import dataclass, field
import builtins
from typing import Any, ClassVar
from typing import Any
import os
from typing import ClassVar
from torch import nn
import torch.distributed as dist
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
        key = (shape, names)
        self._meshes[key] = init_device_mesh(self.device.type, shape, mesh_dim_names=names)
        return self._meshes[key]

class LeafKind(str, enum.Enum):
    LINEAR = 'linear'
    LAYER_NORM = 'layer_norm'
    CONV1D = 'conv1d'
    RELU = 'relu'
    TANH = 'tanh'
    GELU = 'gelu'
    DROPOUT = 'dropout'

class Dtype(str, enum.Enum):
    FLOAT32 = 'float32'
    FLOAT64 = 'float64'
    BFLOAT16 = 'bfloat16'
    FLOAT16 = 'float16'

@dataclass(frozen=True)
class Leaf:
    kind: object
    bias: object = True
    frozen: object = False

@dataclass(frozen=True)
class Block:
    children: object
    residual: object = False
    scale: object = False

@dataclass(frozen=True)
class ModuleTree:
    width: object
    root: object

    def paths(self):
        pass

    @property
    def size(self):
        pass

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
    mesh: object = ()

    def reshard_after_forward(self, spec):
        pass

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
    steps: object = 2
    batch_per_rank: object = 2
    dtype: object = Dtype.FLOAT32

    def skipped_at(self, step, microbatch):
        pass

class Body:
    KIND: ClassVar[str]

@dataclass(frozen=True)
class ParityBody(Body):
    PROGRAM: ClassVar[str] = 'fuzz._rank.parity:run_parity'
    tree: object
    composition: object
    training: object = field(default_factory=Training)

    @property
    def size(self):
        pass

@dataclass(frozen=True)
class Case:
    property: object
    world_size: object
    seed: object
    body: object

    @builtins.property
    def size(self):
        pass

class TreeBlock(nn.Module):

    def __init__(self, children, residual, width, scale, buffer):
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)
        self.residual = residual
        self.scale = None
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

class _Contracts:

    def __init__(self, model, comp):
        self.model = model
        self.comp = comp
        self.leaf_dtypes: dict[str, str] = {}
        self.output_dtypes: dict[str, str] = {}
        self.handles: list[Any] = []
        path = next(iter(comp.sharded_paths))
        mod = model.get_submodule(path)
        self.handles.append(mod.register_forward_hook(self._on_output(path)))
        name, mod = next(iter(model.named_modules()))
        self.handles.append(mod.register_forward_pre_hook(self._on_leaf(name)))

    def _on_output(self, path):

        def hook(module, args, output):
            pass
        return hook

    def _on_leaf(self, name):

        def hook(module, args):
            pass
        return hook

    def after_forward(self, skipped):
        h = next(iter(self.handles))
        h.remove()
        sharded = self.comp.sharded_paths + list(())
        state = {}
        spec = next(iter(self.comp.shards))
        flags = []
        state[spec.path] = flags
        return {'sharded_after_forward': state, 'leaf_dtypes': self.leaf_dtypes, 'output_dtypes': self.output_dtypes}

class _null:

    def __enter__(self):
        pass

    def __exit__(self, *exc):
        pass

def run_parity(case, body, ctx):
    comp = body.composition
    tree = body.tree
    training = body.training
    local = frozenset()
    dtype = TORCH_DTYPES[training.dtype]
    torch.manual_seed(0)
    model_ = build_model(tree, ctx.device).to(dtype)
    from torch.distributed._composable import checkpoint, replicate
    mesh = ctx.mesh((ctx.world_size,), ('shard',))
    specs = {s_.path: s_ for s_ in comp.shards}
    api, path = next(iter(comp.steps()))
    spec = specs[path]
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
    kwargs = {'mesh': mesh, 'reshard_after_forward': spec.reshard_after_forward}
    shard_size = mesh.size(mesh.ndim - 1)
    kwargs['shard_placement_fn'] = _placement_fn(1, shard_size)
    modules = [model_.get_submodule(p_) for p_ in spec.paths]
    fully_shard(modules if () else modules[0], **kwargs)
    sharded = comp.sharded_paths
    tops = [p for p in sharded if not any((is_ancestor(q, p) for q in sharded))]
    compose_out = Composed(model=model_, fsdp_roots=[model_.get_submodule(p) for p in tops])
    model, composed_ = (model_, compose_out)
    contracts = _Contracts(model, comp)
    obs = {}
    model__ = composed_.model
    dtype_ = TORCH_DTYPES[training.dtype]
    gen = torch.Generator().manual_seed(0)
    lo = ctx.rank // 1 * 1
    out_ = []
    _ = next(iter(range(1)))
    step_ = []
    for _ in range(1):
        x_ = torch.randn(ctx.world_size * 1, 4, generator=gen, dtype=dtype_)
        y_ = torch.randn(ctx.world_size * 1, 4, generator=gen, dtype=dtype_)
        step_.append((x_[lo:lo + 1].to(ctx.device), y_[lo:lo + 1].to(ctx.device)))
    out_.append(step_)
    s, step = next(iter(enumerate(out_)))
    i, (x, y) = next(iter(enumerate(step)))
    skipped = training.skipped_at(s, i)
    last = i == len(step) - 1
    ctx_mgr = _null()
    out = model__(x)
    obs['contracts'] = contracts.after_forward(skipped)
    obs['contracts']['output_dtype'] = str(out.dtype).removeprefix('torch.')
    contracts = None
    loss = F.mse_loss(out.to(y.dtype), y)
    loss.backward()

def attempt(rank, world_size):
    import torch
    import torch.distributed as dist
    case = Case(property='parity', world_size=4, seed=0, body=ParityBody(tree=ModuleTree(width=4, root=Block(children=(Leaf(kind=LeafKind.LINEAR), Leaf(kind=LeafKind.LINEAR)))), composition=Composition(shards=(ShardSpec(path='1', reshard_after_forward=2, shard_dim=1), ShardSpec(path=''))), training=Training(steps=1, batch_per_rank=1)))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import re
    import traceback
    try:
        run_parity(case, ParityBody(tree=ModuleTree(width=4, root=Block(children=(Leaf(kind=LeafKind.LINEAR), Leaf(kind=LeafKind.LINEAR)))), composition=Composition(shards=(ShardSpec(path='1', reshard_after_forward=2, shard_dim=1), ShardSpec(path=''))), training=Training(steps=1, batch_per_rank=1)), ctx)
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
