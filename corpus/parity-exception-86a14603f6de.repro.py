#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=746779464116bbb8 sources=e14b2777dea90300 seconds=24.0
"""Reproduces shardfuzz corpus entry parity-exception-86a14603f6de.json: exception:parity:builtins.RuntimeError@torch/nn/parallel/distributed.py:_clear_grad_buffer

Observed: replicate with delay_all_reduce_named_params over float64 parameters: DDP's delayed-
gradient buffer is float32 (torch.zeros without a dtype) and _clear_grad_buffer raises on
assigning it as the gradient; found by a parity campaign, this minimal case written from it
(torch 2.13 CPU). Reproducer: docs/known_bugs.md.
Known torch bug: DistributedDataParallel(delay_all_reduce_named_params=...,
param_to_hook_all_reduce=...) over parameters that are not float32: the delayed gradients'
buffer is made with torch.zeros and no dtype, and _clear_grad_buffer raises 'attempting to
assign a gradient with dtype 'float' to a tensor with grad_dtype 'Double''; upstream: none
found.
Expected: no rank raises.

    torchrun --nproc-per-node 2 THIS_FILE.py

prints REPRODUCED and exits 1 while the failure is there, else exits 0.
"""

from __future__ import annotations
from typing import Any
from dataclasses import dataclass, field
import torch
import enum
from dataclasses import dataclass
from dataclasses import dataclass, field
from functools import cached_property
from dataclasses import replace
import builtins
from typing import Any, ClassVar
from typing import Any
import os
from typing import ClassVar
from torch import nn
import torch.distributed as dist

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
PARAM_LEAVES = frozenset({LeafKind.LINEAR, LeafKind.LAYER_NORM, LeafKind.CONV1D})

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

def owns_params(node):
    if isinstance(node, Leaf):
        return node.kind in PARAM_LEAVES
    return False

def param_names(node):
    return ['weight', 'bias']

@dataclass(frozen=True)
class ModuleTree:
    width: object
    root: object

    def paths(self):
        return dict(iter_paths(self.root))

def is_ancestor(ancestor, path):
    pass

@dataclass(frozen=True)
class ReplicateOptions:
    delay_all_reduce: object = False

    def names(self):
        pass

@dataclass(frozen=True)
class CheckpointOptions:

    def names(self):
        pass

@dataclass(frozen=True)
class Composition:
    replicates: object = ()
    mesh: object = ()
    replicate_options: object = field(default_factory=ReplicateOptions)
    checkpoint_options: object = field(default_factory=CheckpointOptions)

    @property
    def sharded_paths(self):
        return [p for spec in () for p in spec.paths]

    def steps(self):
        order = {'checkpoint': 0, 'fully_shard': 1, 'replicate': 2}
        items = [('checkpoint', p) for p in ()] + [('replicate', p) for p in ('',)]
        items += [('fully_shard', spec.path) for spec in ()]

        def key(item):
            api, path = item
            depth = min((q.count('.') + (q != '') for q in ('',)))
            return (-depth, order[api], path)
        return sorted(items, key=key)

@dataclass(frozen=True)
class Unit:
    api: object
    index: object
    members: object

@dataclass(frozen=True)
class Layout:
    tree: object
    comp: object

    @cached_property
    def paths(self):
        return self.tree.paths()

    @cached_property
    def units(self):
        shards = tuple((Unit('fully_shard', i, spec.paths) for i, spec in enumerate(())))
        return shards + tuple((Unit('replicate', i, (p,)) for i, p in enumerate(('',))))

    def owned_by(self, unit, member=None):
        out = []
        for path, node in self.paths.items():
            if owns_params(node) and '' in ('',):
                out.append(path)
        return out

    def ignored_by(self, member):
        out = []
        return out

    def replicated_params(self, member):
        unit = next((u for u in self.units if 'replicate' == 'replicate' and ('',) == (member,)))
        return [(p, name) for p in self.owned_by(unit) for name in param_names(self.paths[p])]

class AccumSync(str, enum.Enum):
    ALWAYS = 'always'
    NO_GRAD_SYNC = 'no_grad_sync'
    NO_ALL_REDUCE = 'no_all_reduce'

@dataclass(frozen=True)
class Training:
    lr: object = 0.1
    momentum: object = 0.0
    steps: object = 2
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

@dataclass(frozen=True)
class ParityBody(Body):
    KIND: ClassVar[str] = 'parity'
    PROGRAM: ClassVar[str] = 'fuzz._rank.parity:run_parity'
    tree: object
    composition: object
    training: object = field(default_factory=Training)

@dataclass(frozen=True)
class Case:
    property: object
    world_size: object
    seed: object
    body: object

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

def replicate_kwargs(model, tree, comp, path, ctx):
    kwargs = {'find_unused_parameters': False}
    kwargs['device_ids'] = None
    layout = Layout(tree, comp)
    ignored = layout.ignored_by(path)
    plan = ('0', ('1',))
    hook, delayed = plan
    order = layout.replicated_params(path)
    kwargs['param_to_hook_all_reduce'] = model.get_submodule(hook).get_parameter(next((name for p, name in order if p == hook)))
    kwargs['delay_all_reduce_named_params'] = [(str(i), model.get_submodule(p).get_parameter(name)) for i, (p, name) in enumerate(order) if p in delayed]
    return kwargs

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

@dataclass
class Composed:
    model: object
    fsdp_roots: object = field(default_factory=list)

    def set_sync(self, requires_gradient_sync=True, requires_all_reduce=True):
        pass

def compose(model, comp, ctx, tree=None):
    from torch.distributed._composable import checkpoint, replicate
    ckpt_kwargs = checkpoint_kwargs(comp.checkpoint_options)
    mesh = mesh_for(comp, ctx)
    for api, path in comp.steps():
        replicate(model.get_submodule(path), **replicate_kwargs(model, tree, comp, path, ctx))
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
    return torch.optim.SGD(groups, lr=0.05, momentum=0.0, foreach=foreach)

def batches(case, training, width, ctx, tp_size=1):
    dtype = TORCH_DTYPES[training.dtype]
    gen = torch.Generator().manual_seed(0)
    b = 2
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
        for name, mod in model.named_modules():
            if any((True for _ in mod.parameters(recurse=False))):
                self.handles.append(mod.register_forward_pre_hook(self._on_leaf(name)))

    def _on_leaf(self, name):

        def hook(module, args):
            p = next(module.parameters(recurse=False))
            self.leaf_dtypes.setdefault(name, str(p.dtype).removeprefix('torch.'))
        return hook

def train(case, tree, training, comp, ctx, tp_size=1, grad_scales=None, precision=None, local=frozenset()):
    dtype = TORCH_DTYPES[training.dtype]
    model, composed = build_composed(tree, comp, dtype, ctx, seed=0)
    contracts = _Contracts(model, comp)
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
    case = Case(property='parity', world_size=2, seed=0, body=ParityBody(tree=ModuleTree(width=4, root=Block(children=(Leaf(kind=LeafKind.LINEAR), Leaf(kind=LeafKind.LINEAR)))), composition=Composition(replicates=('',), replicate_options=ReplicateOptions(delay_all_reduce=True)), training=Training(lr=0.05, steps=1, dtype=Dtype.FLOAT64)))
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
        if found in ['builtins.RuntimeError@torch/nn/parallel/distributed.py:_clear_grad_buffer']:
            print(f'REPRODUCED exception:parity:builtins.RuntimeError@torch/nn/parallel/distributed.py:_clear_grad_buffer: rank {ctx.rank} raised {found}: {e}', flush=True)
            os._exit(1)
        print(f"FAIL (not the entry's failure): rank {ctx.rank} raised {found}: {e}", flush=True)
        os._exit(0)
    print('PASS: no rank raised')
if __name__ == '__main__':
    main()
