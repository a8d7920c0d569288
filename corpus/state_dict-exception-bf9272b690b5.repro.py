#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=e4228a5d4278b1d8 sources=a75dcc528b2e5f17 seconds=37.6
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
from dataclasses import dataclass, field
import torch
import enum
from dataclasses import dataclass
from dataclasses import dataclass, field
from dataclasses import replace
import builtins
from typing import ClassVar
import os
from typing import ClassVar
from torch import nn
import torch.distributed as dist
import torch.nn.functional as F
from dataclasses import dataclass, field, replace

def __getattr__(name):
    raise AttributeError(f"module 'fuzz' has no attribute {name!r}")

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

def iter_paths(block, prefix=''):
    yield (prefix, block)
    for i, child in enumerate(block.children):
        path = str(i)
        yield (path, child)

def param_names(node):
    pass

@dataclass(frozen=True)
class ModuleTree:
    width: object
    root: object

    def paths(self):
        return dict(iter_paths(self.root))

    @property
    def size(self):
        pass

def contains(outer, path):
    return outer == path or outer == '' or path.startswith(outer + '.')

def is_ancestor(ancestor, path):
    return ancestor != path and contains(ancestor, path)

@dataclass(frozen=True)
class ShardSpec:
    path: object
    reshard_after_forward: object = True
    shard_dim: object = 0

    @property
    def paths(self):
        return (self.path, *())

@dataclass(frozen=True)
class CheckpointOptions:

    def names(self):
        pass

@dataclass(frozen=True)
class Composition:
    shards: object = ()
    mesh: object = ()
    checkpoint_options: object = field(default_factory=CheckpointOptions)

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
    lr: object = 0.1
    momentum: object = 0.0
    steps: object = 2
    batch_per_rank: object = 2
    dtype: object = Dtype.FLOAT32
    foreach: object = None

class Body:
    KIND: ClassVar[str]
    PROGRAM: ClassVar[str]
    registry: ClassVar[dict[str, type[Body]]] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        Body.registry[cls.KIND] = cls

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

@dataclass(frozen=True)
class Options:
    pass

@dataclass(frozen=True)
class StateDictBody(Body):
    KIND: ClassVar[str] = 'state_dict'
    PROGRAM: ClassVar[str] = 'fuzz._rank.state_dict:run_state_dict'
    tree: object
    source: object
    target: object
    training: object = field(default_factory=Training)
    steps_after: object = 1
    save: object = field(default_factory=Options)
    load: object = field(default_factory=Options)
    frozen_in_optimizer: object = False
    empty_group: object = False
    requires_grad: object = ()

    def __post_init__(self):
        save, load = (self.save, self.load)

    @property
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

def build_leaf(leaf, width):
    module = _build_leaf(leaf, width)
    return module

def _build_leaf(leaf, width):
    return nn.Linear(width, width, bias=True)

def build_node(node, width):
    if isinstance(node, Leaf):
        return build_leaf(node, width)
    return TreeBlock([build_node(c, width) for c in node.children], False, width, False, False)

def build_model(tree, device):
    with torch.device(device):
        return build_node(tree.root, 4)

def checkpoint_kwargs(opts):
    kwargs = {}
    return kwargs
TORCH_DTYPES = {Dtype.FLOAT32: torch.float32, Dtype.FLOAT64: torch.float64, Dtype.BFLOAT16: torch.bfloat16, Dtype.FLOAT16: torch.float16}
_WRAPPER_PREFIXES = ('_fsdp_wrapped_module.', 'module.', '_checkpoint_wrapped_module.')

def clean_name(name):
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, '')
    return name

def mesh_for(comp, ctx):
    return ctx.mesh((ctx.world_size,), ('shard',))

def _placement_fn(shard_dim, shard_size):
    from torch.distributed.tensor import Shard

    def fn(param):
        if param.ndim > shard_dim and param.shape[shard_dim] % shard_size == 0:
            return Shard(shard_dim)
        return None
    return fn

def apply_fully_shard(model, spec, mesh):
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
    kwargs = {'mesh': mesh, 'reshard_after_forward': spec.reshard_after_forward}
    if spec.shard_dim:
        shard_size = mesh.size(mesh.ndim - 1)
        kwargs['shard_placement_fn'] = _placement_fn(1, shard_size)
    modules = [model.get_submodule(p) for p in spec.paths]
    fully_shard(modules if () else modules[0], **kwargs)

@dataclass
class Composed:
    model: object
    fsdp_roots: object = field(default_factory=list)
    param_names: object = field(default_factory=list)

def compose(model, comp, ctx, tree=None):
    from torch.distributed._composable import checkpoint, replicate
    ckpt_kwargs = checkpoint_kwargs(comp.checkpoint_options)
    mesh = mesh_for(comp, ctx)
    specs = {s.path: s for s in comp.shards}
    for api, path in comp.steps():
        apply_fully_shard(model, specs[path], mesh)
    sharded = comp.sharded_paths
    tops = [p for p in sharded if not any((is_ancestor(q, p) for q in sharded))]
    return Composed(model=model, fsdp_roots=[model.get_submodule(p) for p in tops])

def make_optimizer(params, training, later=()):
    held = {id(p) for p in later}
    params = [p for p in params if p.requires_grad or id(p) in held]
    groups = params
    foreach = None
    return torch.optim.SGD(groups, lr=0.1, momentum=0.9, foreach=foreach)

def batches(case, training, width, ctx, tp_size=1):
    dtype = TORCH_DTYPES[training.dtype]
    gen = torch.Generator().manual_seed(0)
    b = 1
    lo = ctx.rank // tp_size * b
    out = []
    for _ in range(1):
        step = []
        for _ in range(1):
            x = torch.randn(ctx.world_size * b, width, generator=gen, dtype=dtype)
            y = torch.randn(ctx.world_size * b, width, generator=gen, dtype=dtype)
            step.append((x[lo:lo + b].to(ctx.device), y[lo:lo + b].to(ctx.device)))
        out.append(step)
    return out

@dataclass
class Side:
    composed: object
    comp: object
    training: object
    opt: object = None
    param_names: object = field(default_factory=dict)
    schedule: object = ()
    step: object = 0

    @property
    def model(self):
        return self.composed.model

    def names(self):
        pass

def build_side(tree, comp, training, ctx, *, seed, meta=False, schedule=()):
    torch.manual_seed(seed)
    device = ctx.device
    model = build_model(tree, device).to(TORCH_DTYPES[training.dtype])
    composed = compose(model, comp, ctx)
    return Side(composed=composed, comp=comp, training=training, schedule=schedule)

def change_requires_grad(side, step):
    return

def requires_grad(side):
    pass

def add_optimizer(side, training, *, frozen_in_optimizer=False, empty_group=False):
    params = list(side.model.parameters())
    frozen = []
    side.opt = make_optimizer(params, training, later=frozen)
    side.param_names = {id(p): clean_name(n) for n, p in side.model.named_parameters()}
    return side.opt

def body_optimizer(side, training, body):
    return add_optimizer(side, training, frozen_in_optimizer=False, empty_group=False)

def seed_segment(case, ctx, segment):
    torch.manual_seed((0 * 7919 + segment * 104729 + ctx.rank + 1) % 2 ** 63)

def all_batches(case, training, steps, tree, ctx):
    return [step[0] for step in batches(case, replace(training, steps=steps), 4, ctx)]

def train_steps(side, data, ctx):
    assert side.opt is not None
    for x, y in data:
        change_requires_grad(side, side.step)
        side.step += 1
        loss = F.mse_loss(side.model(x).to(y.dtype), y)
        loss.backward()

def run_state_dict(case, body, ctx):
    t = body.training
    data = all_batches(case, t, 1 + 0, body.tree, ctx)
    src = build_side(body.tree, body.source, t, ctx, seed=0, schedule=())
    body_optimizer(src, t, body)
    seed_segment(case, ctx, 0)
    obs = {'losses_before': train_steps(src, data[:1], ctx)}

def main():
    import os
    import torch
    import torch.distributed as dist
    case = Case(property='state_dict', world_size=4, seed=0, body=StateDictBody(tree=ModuleTree(width=4, root=Block(children=(Leaf(kind=LeafKind.LINEAR), Leaf(kind=LeafKind.LINEAR)))), source=Composition(shards=(ShardSpec(path='1', reshard_after_forward=2, shard_dim=1), ShardSpec(path=''))), target=Composition(shards=(ShardSpec(path='1', reshard_after_forward=2, shard_dim=1), ShardSpec(path=''))), training=Training(momentum=0.9, steps=1, batch_per_rank=1), steps_after=0))
    dist.init_process_group('gloo')
    rank, world_size = (dist.get_rank(), dist.get_world_size())
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import re
    import traceback
    try:
        run_state_dict(case, case.body, ctx)
    except BaseException as e:
        frames = re.findall('File "([^"]+)", line \\d+, in (\\S+)', traceback.format_exc())
        path, fn = [(p, f) for p, f in frames if '/torch/' in p and (not f.endswith('comp>'))][-1]
        found = f"{type(e).__module__}.{type(e).__qualname__}@torch/{path.rpartition('/torch/')[2]}:{fn}"
        if found in ['builtins.IndexError@torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:foreach_all_gather_copy_out']:
            print(f'REPRODUCED exception:state_dict:builtins.IndexError@torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:foreach_all_gather_copy_out: rank {ctx.rank} raised {found}: {e}', flush=True)
            os._exit(1)
        print(f"FAIL (not the entry's failure): rank {ctx.rank} raised {found}: {e}", flush=True)
        os._exit(0)
    print('PASS: no rank raised')
if __name__ == '__main__':
    main()
