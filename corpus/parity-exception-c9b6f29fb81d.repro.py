#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=e0d493e9f9cd8cee sources=e14b2777dea90300 seconds=38.6
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
from dataclasses import replace
import builtins
from typing import Any, ClassVar
from typing import Any
import os
from typing import ClassVar
from torch import nn
import torch.distributed as dist
import torch.nn.functional as F

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

class AccumSync(str, enum.Enum):
    ALWAYS = 'always'
    NO_GRAD_SYNC = 'no_grad_sync'
    NO_ALL_REDUCE = 'no_all_reduce'

@dataclass(frozen=True)
class Training:
    lr: object = 0.1
    momentum: object = 0.0
    steps: object = 2
    batch_per_rank: object = 2
    dtype: object = Dtype.FLOAT32
    foreach: object = None

    def skipped_at(self, step, microbatch):
        return [s.path for s in () if s.step == step and s.microbatch == microbatch]

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
class ParityBody(Body):
    KIND: ClassVar[str] = 'parity'
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

def fsdp_sharded(p):
    from torch.distributed.tensor import DTensor
    return isinstance(p, DTensor) and 'shard' in (p.device_mesh.mesh_dim_names or ('shard',))

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

def tree_blocks(model):
    return {'.'.join((c for c in name.split('.') if c.isdigit())): m for name, m in model.named_modules() if isinstance(m, TreeBlock)}

def set_skipped(blocks, paths):
    skipped = {p: set() for p in blocks}
    for p, block in blocks.items():
        pass

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

    def set_sync(self, requires_gradient_sync=True, requires_all_reduce=True):
        for m in self.fsdp_roots:
            m.set_requires_gradient_sync(requires_gradient_sync)
            m.set_requires_all_reduce(requires_all_reduce)

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

def build_composed(tree, comp, dtype, ctx, *, seed):
    torch.manual_seed(seed)
    model = build_model(tree, ctx.device).to(dtype)
    return (model, _with_knobs(model, compose(model, comp, ctx, tree), comp, tree))

def _with_knobs(model, composed, comp, tree):
    return composed

def make_optimizer(params, training, later=()):
    held = {id(p) for p in later}
    params = [p for p in params if p.requires_grad or id(p) in held]
    groups = params
    foreach = None
    return torch.optim.SGD(groups, lr=0.1, momentum=0.0, foreach=foreach)

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

def _seed_for_run(case, ctx, tp_size=1):
    torch.manual_seed((0 * 7919 + ctx.rank // tp_size + 1) % 2 ** 63)

class _Contracts:

    def __init__(self, model, comp):
        self.model = model
        self.comp = comp
        self.leaf_dtypes: dict[str, str] = {}
        self.output_dtypes: dict[str, str] = {}
        self.handles: list[Any] = []
        for path in comp.sharded_paths:
            mod = model.get_submodule(path)
            self.handles.append(mod.register_forward_hook(self._on_output(path)))
        for name, mod in model.named_modules():
            if any((True for _ in mod.parameters(recurse=False))):
                self.handles.append(mod.register_forward_pre_hook(self._on_leaf(name)))

    def _on_output(self, path):

        def hook(module, args, output):
            self.output_dtypes.setdefault(path, str(output.dtype).removeprefix('torch.'))
        return hook

    def _on_leaf(self, name):

        def hook(module, args):
            p = next(module.parameters(recurse=False))
            self.leaf_dtypes.setdefault(name, str(p.dtype).removeprefix('torch.'))
        return hook

    def after_forward(self, skipped):
        for h in self.handles:
            h.remove()
        sharded = self.comp.sharded_paths + list(())
        state = {}
        for spec in self.comp.shards:
            flags = []
            for path in spec.paths:
                for sub, _ in iter_paths_of(self.model, path):
                    if sub != path and _under_other_unit(sub, path, sharded) or sub in ():
                        continue
                    mod = self.model.get_submodule(sub)
                    flags += [fsdp_sharded(p) for p in mod.parameters(recurse=False)]
            state[spec.path] = flags
        return {'sharded_after_forward': state, 'leaf_dtypes': self.leaf_dtypes, 'output_dtypes': self.output_dtypes}

def iter_paths_of(model, path):
    root = model.get_submodule(path)
    return [(n or path, m) for n, m in root.named_modules()]

def _under_other_unit(sub, unit, sharded):
    return any((is_ancestor(unit, other) and contains(other, sub) for other in sharded))

def replicate_contract(model, comp, skipped=None):
    from torch.distributed._composable import replicate
    out = {}
    return out

def train(case, tree, training, comp, ctx, tp_size=1, grad_scales=None, precision=None, local=frozenset()):
    dtype = TORCH_DTYPES[training.dtype]
    model, composed = build_composed(tree, comp, dtype, ctx, seed=0)
    contracts = _Contracts(model, comp)
    obs = {}
    blocks = tree_blocks(composed.model)
    later = _unfrozen_later(composed.model, training)
    opt = make_optimizer(composed.model.parameters(), training, [p for ps in later.values() for p in ps])
    forward = _compiled(composed.model, training)
    _seed_for_run(case, ctx, tp_size)
    for s, step in enumerate(batches(case, training, 4, ctx, tp_size)):
        for i, (x, y) in enumerate(step):
            skipped = training.skipped_at(s, i)
            set_skipped(blocks, skipped)
            last = i == len(step) - 1
            sync = AccumSync.ALWAYS
            composed.set_sync(requires_gradient_sync=sync is not AccumSync.NO_GRAD_SYNC, requires_all_reduce=sync is AccumSync.ALWAYS)
            ctx_mgr = _null()
            with ctx_mgr:
                out = forward(x)
                obs['contracts'] = contracts.after_forward(skipped)
                obs['contracts']['output_dtype'] = str(out.dtype).removeprefix('torch.')
                obs['contracts']['replicate_params'] = replicate_contract(model, comp, skipped)
                contracts = None
                loss = F.mse_loss(out.to(y.dtype), y)
                loss.backward()

def _unfrozen_later(model, training):
    out = {u.path: [] for u in ()}
    for name, p in model.named_parameters():
        owner = '.'.join((c for c in clean_name(name).split('.')[:-1] if c.isdigit()))
    return out

def _compiled(model, training):
    return model

class _null:

    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return None

def run_parity(case, body, ctx):
    tp = 1
    comp = body.composition
    composed = train(case, body.tree, body.training, comp, ctx, tp)

def main():
    import os
    import torch
    import torch.distributed as dist
    case = Case(property='parity', world_size=4, seed=0, body=ParityBody(tree=ModuleTree(width=4, root=Block(children=(Leaf(kind=LeafKind.LINEAR), Leaf(kind=LeafKind.LINEAR)))), composition=Composition(shards=(ShardSpec(path='1', reshard_after_forward=2, shard_dim=1), ShardSpec(path=''))), training=Training(steps=1, batch_per_rank=1)))
    dist.init_process_group('gloo')
    rank, world_size = (dist.get_rank(), dist.get_world_size())
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import re
    import traceback
    try:
        run_parity(case, case.body, ctx)
    except BaseException as e:
        frames = re.findall('File "([^"]+)", line \\d+, in (\\S+)', traceback.format_exc())
        path, fn = [(p, f) for p, f in frames if '/torch/' in p and (not f.endswith('comp>'))][-1]
        found = f"{type(e).__module__}.{type(e).__qualname__}@torch/{path.rpartition('/torch/')[2]}:{fn}"
        if found in ['builtins.IndexError@torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:foreach_all_gather_copy_out']:
            print(f'REPRODUCED exception:parity:builtins.IndexError@torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:foreach_all_gather_copy_out: rank {ctx.rank} raised {found}: {e}', flush=True)
            os._exit(1)
        print(f"FAIL (not the entry's failure): rank {ctx.rank} raised {found}: {e}", flush=True)
        os._exit(0)
    print('PASS: no rank raised')
if __name__ == '__main__':
    main()
