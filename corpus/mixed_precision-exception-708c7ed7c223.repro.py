#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=b741b331ec67a531 sources=e14b2777dea90300 seconds=26.3
"""Reproduces shardfuzz corpus entry mixed_precision-exception-708c7ed7c223.json: exception:mixed_precision:builtins.AttributeError@torch/distributed/fsdp/_fully_shard/_fsdp_param.py:to_accumulated_grad_if_needed

Observed: FSDP2 with MixedPrecisionPolicy(reduce_dtype) and set_requires_gradient_sync(False): a
unit that never ran forward crashes the root's post-backward ('FSDPParam' object has no
attribute '_unsharded_param'); the no-reduce path lacks the hasattr guard of the reduce path.
Torch-only reproducer: docs/known_bugs.md. (rank 0 raised builtins.AttributeError: 'FSDPParam'
object has no attribute '_unsharded_param')
Known torch bug: MixedPrecisionPolicy(reduce_dtype) with set_requires_gradient_sync(False): a
unit that never ran forward has no '_unsharded_param' in the root's post-backward; upstream:
https://github.com/pytorch/pytorch/issues/194058.
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
from dataclasses import replace
import builtins
from typing import Any, ClassVar
from typing import Any
import os
from typing import ClassVar
from torch import nn
from contextlib import nullcontext
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

def contains(outer, path):
    return outer == path or outer == '' or path.startswith(outer + '.')

def is_ancestor(ancestor, path):
    return ancestor != path and contains(ancestor, path)

@dataclass(frozen=True)
class MixedPrecision:
    param_dtype: object = None
    reduce_dtype: object = None
    output_dtype: object = None
    cast_forward_inputs: object = True

@dataclass(frozen=True)
class ShardSpec:
    path: object
    reshard_after_forward: object = True
    mixed_precision: object = None

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
    checkpoints: object = ()
    checkpoint_first: object = True
    mesh: object = ()
    checkpoint_options: object = field(default_factory=CheckpointOptions)

    def reshard_after_forward(self, spec):
        pass

    @property
    def sharded_paths(self):
        return [p for spec in self.shards for p in spec.paths]

    def steps(self):
        order = {'checkpoint': 3, 'fully_shard': 1, 'replicate': 2}
        items = [('checkpoint', p) for p in ('1', '0', '2')] + [('replicate', p) for p in ()]
        items += [('fully_shard', spec.path) for spec in self.shards]

        def key(item):
            api, path = item
            depth = min((q.count('.') + (q != '') for q in self._spec_paths(api, path)))
            return (-depth, order[api], path)
        return sorted(items, key=key)

    def _spec_paths(self, api, path):
        if api == 'fully_shard':
            return next((s.paths for s in self.shards if s.path == path))
        return (path,)

class AccumSync(str, enum.Enum):
    ALWAYS = 'always'
    NO_GRAD_SYNC = 'no_grad_sync'
    NO_ALL_REDUCE = 'no_all_reduce'

class Optimizer(str, enum.Enum):
    SGD = 'sgd'
    ADAM = 'adam'
    ADAMW = 'adamw'

@dataclass(frozen=True)
class Skip:
    path: object
    step: object
    microbatch: object = 0

@dataclass(frozen=True)
class Training:
    optimizer: object = Optimizer.SGD
    lr: object = 0.1
    eps: object = 0.001
    steps: object = 2
    dtype: object = Dtype.FLOAT32
    grad_accum: object = 1
    accum_sync: object = AccumSync.ALWAYS
    param_groups: object = 1
    foreach: object = None
    skips: object = ()

    def __post_init__(self):
        for i, skip in enumerate(self.skips):
            pass

    def skipped_at(self, step, microbatch):
        return ['1' for s in self.skips if s.step == step and s.microbatch == microbatch]

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

def fsdp_sharded(p):
    from torch.distributed.tensor import DTensor
    return isinstance(p, DTensor) and 'shard' in (p.device_mesh.mesh_dim_names or ('shard',))

class TreeBlock(nn.Module):

    def __init__(self, children, residual, width, scale, buffer):
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)
        self.residual = residual
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(width))
        self.shift = None
        self.skipped: frozenset[str] = frozenset()

    def forward(self, x):
        y = x
        for name, child in self.named_children():
            if name in self.skipped:
                continue
            y = child(y)
        y = y * self.scale
        return x + y

def build_leaf(leaf, width):
    module = _build_leaf(leaf, width)
    return module

def _build_leaf(leaf, width):
    if leaf.kind is LeafKind.LAYER_NORM:
        return nn.LayerNorm(width, bias=False)
    if leaf.kind is LeafKind.DROPOUT:
        return nn.Dropout(0.5)
    return nn.GELU()

def build_node(node, width):
    if isinstance(node, Leaf):
        return build_leaf(node, width)
    return TreeBlock([build_node(c, width) for c in node.children], True, width, True, False)

def build_model(tree, device):
    with torch.device(device):
        return build_node(tree.root, 12)

def tree_blocks(model):
    return {'.'.join((c for c in name.split('.') if c.isdigit())): m for name, m in model.named_modules() if isinstance(m, TreeBlock)}

def set_skipped(blocks, paths):
    skipped = {p: set() for p in blocks}
    for path in paths:
        parent, _, name = path.rpartition('.')
        skipped[parent].add(name)
    for p, block in blocks.items():
        block.skipped = frozenset(skipped[p])

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

def mp_policy(mp):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    def dt(d):
        return None if d is None else TORCH_DTYPES[d]
    return MixedPrecisionPolicy(param_dtype=dt(mp.param_dtype), reduce_dtype=dt(mp.reduce_dtype), output_dtype=dt(mp.output_dtype), cast_forward_inputs=True)

def apply_fully_shard(model, spec, mesh):
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
    kwargs = {'mesh': mesh, 'reshard_after_forward': False}
    kwargs['mp_policy'] = mp_policy(spec.mixed_precision)
    modules = [model.get_submodule(p) for p in spec.paths]
    fully_shard(modules if () else modules[0], **kwargs)

@dataclass
class Composed:
    model: object
    fsdp_roots: object = field(default_factory=list)

    def no_sync(self):
        return nullcontext()

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
        if api == 'checkpoint':
            checkpoint(model.get_submodule(path), **ckpt_kwargs)
        else:
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
    groups = [{'params': params[0::2]}, {'params': params[1::2], 'lr': 0.1 / 2}]
    groups = [g for g in groups if g['params']]
    foreach = None
    return torch.optim.AdamW(groups, lr=0.1, eps=0.0001, foreach=foreach)

def batches(case, training, width, ctx, tp_size=1):
    dtype = TORCH_DTYPES[training.dtype]
    gen = torch.Generator().manual_seed(77)
    b = 2
    lo = ctx.rank // tp_size * b
    out = []
    for _ in range(2):
        step = []
        for _ in range(2):
            x = torch.randn(ctx.world_size * b, width, generator=gen, dtype=dtype)
            y = torch.randn(ctx.world_size * b, width, generator=gen, dtype=dtype)
            step.append((x[lo:lo + b].to(ctx.device), y[lo:lo + b].to(ctx.device)))
        out.append(step)
    return out

def _seed_for_run(case, ctx, tp_size=1):
    torch.manual_seed((77 * 7919 + ctx.rank // tp_size + 1) % 2 ** 63)

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
            if all((_under_any(path, skipped) for path in spec.paths)):
                state['1'] = flags
                continue
            for path in ('',):
                for sub, _ in iter_paths_of(self.model, path):
                    if sub != path and _under_other_unit(sub, path, sharded) or sub in ():
                        continue
                    mod = self.model.get_submodule(sub)
                    flags += [fsdp_sharded(p) for p in mod.parameters(recurse=False)]
            state[''] = flags
        return {'sharded_after_forward': state, 'leaf_dtypes': self.leaf_dtypes, 'output_dtypes': self.output_dtypes}

def iter_paths_of(model, path):
    root = model.get_submodule(path)
    return [(n or path, m) for n, m in root.named_modules()]

def _under_other_unit(sub, unit, sharded):
    return any((is_ancestor(unit, other) and contains(other, sub) for other in sharded))

def _under_any(path, skipped):
    return any((contains(s, path) for s in skipped))

def replicate_contract(model, comp, skipped=None):
    from torch.distributed._composable import replicate
    out = {}
    return out

def train(case, tree, training, comp, ctx, tp_size=1, grad_scales=None, precision=None, local=frozenset()):
    dtype = TORCH_DTYPES[training.dtype]
    model, composed = build_composed(tree, comp, dtype, ctx, seed=77)
    contracts = _Contracts(model, comp)
    obs = {}
    blocks = tree_blocks(composed.model)
    later = _unfrozen_later(composed.model, training)
    opt = make_optimizer(composed.model.parameters(), training, [p for ps in later.values() for p in ps])
    forward = _compiled(composed.model, training)
    _seed_for_run(case, ctx, tp_size)
    for s, step in enumerate(batches(case, training, 12, ctx, tp_size)):
        for i, (x, y) in enumerate(step):
            skipped = training.skipped_at(s, i)
            set_skipped(blocks, skipped)
            last = i == len(step) - 1
            sync = training.accum_sync
            composed.set_sync(requires_gradient_sync=sync is not AccumSync.NO_GRAD_SYNC, requires_all_reduce=sync is AccumSync.ALWAYS)
            ctx_mgr = composed.no_sync()
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

def run_parity(case, body, ctx):
    tp = 1
    comp = body.composition
    composed = train(case, body.tree, body.training, comp, ctx, tp)

def main():
    import os
    import torch
    import torch.distributed as dist
    case = Case(property='mixed_precision', world_size=2, seed=77, body=ParityBody(tree=ModuleTree(width=12, root=Block(children=(Leaf(kind=LeafKind.GELU), Leaf(kind=LeafKind.LAYER_NORM, bias=False), Leaf(kind=LeafKind.DROPOUT)), residual=True, scale=True)), composition=Composition(shards=(ShardSpec(path='1', reshard_after_forward=False, mixed_precision=MixedPrecision(param_dtype=Dtype.FLOAT16, reduce_dtype=Dtype.FLOAT32)), ShardSpec(path='', reshard_after_forward=False, mixed_precision=MixedPrecision(param_dtype=Dtype.FLOAT16, reduce_dtype=Dtype.FLOAT32, output_dtype=Dtype.FLOAT32))), checkpoints=('1', '0', '2'), checkpoint_first=False), training=Training(optimizer=Optimizer.ADAMW, eps=0.0001, grad_accum=2, accum_sync=AccumSync.NO_GRAD_SYNC, param_groups=2, skips=(Skip(path='1', step=0), Skip(path='1', step=0, microbatch=1), Skip(path='1', step=1)))))
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
        if found in ['builtins.AttributeError@torch/distributed/fsdp/_fully_shard/_fsdp_param.py:to_accumulated_grad_if_needed']:
            print(f'REPRODUCED exception:mixed_precision:builtins.AttributeError@torch/distributed/fsdp/_fully_shard/_fsdp_param.py:to_accumulated_grad_if_needed: rank {ctx.rank} raised {found}: {e}', flush=True)
            os._exit(1)
        print(f"FAIL (not the entry's failure): rank {ctx.rank} raised {found}: {e}", flush=True)
        os._exit(0)
    print('PASS: no rank raised')
if __name__ == '__main__':
    main()
