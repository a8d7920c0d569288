#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=9ff801546b7cc4d4 sources=417b1273247da170 seconds=1044.1
# Reproduces shardfuzz corpus entry parity-exception-49c62d6cb7ad.json: exception:parity:builtins.RuntimeError@torch/distributed/tensor/_api.py:redistribute
# Known torch bug: DTensor convolution runs the local op on its inputs as they are, not
# redistributed to the placements its sharding propagation chose (convolution_handler ignores
# needs_redistribute): a Partial input (a rowwise-parallel output) gives a local partial result
# labelled Replicate (wrong values, no error) and backward raises 'Can not redistribute from R to
# P(sum)'; a [Shard(0), Partial] input raises ValueError 'Tensor dim 0 is already sharded on mesh
# dim 0' (dim_map of the chosen [Shard(0), Shard(0)]); a channel-sharded input (Shard(1)) raises
# the local conv's RuntimeError 'expected input[...] to have 2 channels, but got 1'; upstream:
# none found.
# Observed: DTensor convolution of a Partial input (an SPMD program with tensor parallelism: a
# conv1d leaf after a rowwise pair): forward runs, backward raises 'Can not redistribute from ...
# Run: torchrun --nproc-per-node 4 THIS_FILE.py: while the failure is there a rank raises
# builtins.RuntimeError in torch/distributed/tensor/_api.py:redistribute and torchrun exits 1;
# else every rank prints PASS and it exits 0.

from __future__ import annotations
from typing import Any
from dataclasses import dataclass, field
import torch
import enum
from dataclasses import dataclass
from dataclasses import dataclass, field
from functools import cached_property
import builtins
from typing import Any, ClassVar
from typing import Any
import os
from typing import ClassVar
from torch import nn
from contextlib import contextmanager
import torch.nn.functional as F
import torch.distributed as dist

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
        if key not in self._meshes:
            self._meshes[key] = init_device_mesh(self.device.type, shape, mesh_dim_names=names)
        return self._meshes[key]

    def group(self, name):
        pass

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
    buffer: object = False

def iter_paths(block, prefix=''):
    yield (prefix, block)
    for i, child in enumerate(block.children):
        path = f'{prefix}.{i}' if prefix else str(i)
        if isinstance(child, Block):
            yield from iter_paths(child, path)
        else:
            yield (path, child)

def owns_params(node):
    pass

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
class ShardSpec:
    path: object
    reshard_after_forward: object = True
    group: object = ()
    ignored: object = ()

    @property
    def paths(self):
        return (self.path, *self.group)

@dataclass(frozen=True)
class TpPair:
    colwise: object
    rowwise: object

@dataclass(frozen=True)
class Knobs:

    def names(self):
        pass

@dataclass(frozen=True)
class ReplicateOptions:
    dim: object = 0
    ignored_modules: object = ()

    def names(self):
        pass

@dataclass(frozen=True)
class Composition:
    shards: object = ()
    replicates: object = ()
    checkpoints: object = ()
    checkpoint_first: object = True
    mesh: object = ()
    meta_init: object = False
    tp: object = ()
    tp_size: object = 1
    knobs: object = field(default_factory=Knobs)
    replicate_options: object = field(default_factory=ReplicateOptions)
    spmd: object = False

    def reshard_after_forward(self, spec):
        pass

    @property
    def sharded_paths(self):
        return [p for spec in self.shards for p in spec.paths]

    @property
    def shard_ignored(self):
        return frozenset((p for spec in self.shards for p in spec.ignored))

    def steps(self):
        order = {'checkpoint': 0 if self.checkpoint_first else 3, 'fully_shard': 1, 'replicate': 2}
        items = [('checkpoint', p) for p in self.checkpoints] + [('replicate', p) for p in self.replicates]
        items += [('fully_shard', spec.path) for spec in self.shards]

        def key(item):
            api, path = item
            depth = min((q.count('.') + (q != '') for q in self._spec_paths(api, path)))
            return (-depth, order[api], path)
        return sorted(items, key=key)

    def _spec_paths(self, api, path):
        if api == 'fully_shard':
            return next((s.paths for s in self.shards if s.path == path))

class AccumSync(str, enum.Enum):
    ALWAYS = 'always'
    NO_GRAD_SYNC = 'no_grad_sync'
    NO_ALL_REDUCE = 'no_all_reduce'

class Optimizer(str, enum.Enum):
    SGD = 'sgd'
    ADAM = 'adam'
    ADAMW = 'adamw'

class Compile(str, enum.Enum):
    NONE = 'none'
    EAGER = 'eager'
    AOT_EAGER = 'aot_eager'

@dataclass(frozen=True)
class Training:
    optimizer: object = Optimizer.SGD
    lr: object = 0.1
    eps: object = 0.001
    steps: object = 2
    batch_per_rank: object = 2
    dtype: object = Dtype.FLOAT32
    grad_accum: object = 1
    accum_sync: object = AccumSync.ALWAYS
    set_to_none: object = True
    same_input: object = False
    foreach: object = None
    skips: object = ()
    unfreeze: object = ()
    compile: object = Compile.NONE

    def skipped_at(self, step, microbatch):
        return [s.path for s in self.skips if s.step == step and s.microbatch == microbatch]

@dataclass(frozen=True)
class Layout:
    tree: object
    comp: object

    @cached_property
    def paths(self):
        return self.tree.paths()

    @cached_property
    def units(self):
        pass

    @cached_property
    def member_paths(self):
        return tuple((m for u in self.units for m in u.members))

    def member_of(self, path, api=None):
        best = None
        members = self.member_paths if api is None else [m for u in self.units if u.api == api for m in u.members]
        for m in members:
            if contains(m, path) and (best is None or is_ancestor(best, m)):
                best = m
        return best

    def local(self):
        ignored = self.comp.replicate_options.ignored_modules
        by_shards = self.comp.shard_ignored
        return [p for p, n in self.paths.items() if owns_params(n) and (any((contains(i, p) for i in ignored)) or p in by_shards) and (self.member_of(p) is None)]

    def synced_at_init(self, training):
        comp = self.comp
        if comp.tp or comp.meta_init:
            return ([], False)

class Body:
    KIND: ClassVar[str]
    PROGRAM: ClassVar[str]
    registry: ClassVar[dict[str, type[Body]]] = {}

    def __init_subclass__(cls, **kwargs):
        pass

    def validate_for(self, world_size):
        pass

@dataclass(frozen=True)
class ParityBody(Body):
    KIND: ClassVar[str] = 'parity'
    PROGRAM: ClassVar[str] = 'fuzz._rank.parity:run_parity'
    tree: object
    composition: object
    training: object = field(default_factory=Training)

    def validate_for(self, world_size):
        pass

@dataclass(frozen=True)
class Case:
    property: object
    world_size: object
    seed: object
    body: object

    def __post_init__(self):
        self.body.validate_for(self.world_size)

class TreeBlock(nn.Module):

    def __init__(self, children, residual, width, scale, buffer):
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)
        self.residual = residual
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(width)) if scale else None
        self.shift = None
        self.skipped: frozenset[str] = frozenset()

    def forward(self, x):
        y = x
        for name, child in self.named_children():
            y = child(y)
        if self.scale is not None:
            y = y * self.scale
        return x + y if self.residual else y

class PointwiseConv1d(nn.Conv1d):

    def forward(self, x):
        return super().forward(_one_shard_per_dim(x).unsqueeze(-1)).squeeze(-1)

def _one_shard_per_dim(x):
    from torch.distributed.tensor import DTensor, Shard
    if not isinstance(x, DTensor):
        return x
    seen = set()
    placements = []
    for p in x.placements:
        if isinstance(p, Shard):
            seen.add(p.dim)
        placements.append(p)
    return x if tuple(placements) == tuple(x.placements) else x.redistribute(x.device_mesh, placements)

def build_leaf(leaf, width):
    module = _build_leaf(leaf, width)
    return module

def _build_leaf(leaf, width):
    if leaf.kind is LeafKind.LINEAR:
        return nn.Linear(width, width, bias=leaf.bias)
    if leaf.kind is LeafKind.CONV1D:
        return PointwiseConv1d(width, width, kernel_size=1, bias=leaf.bias)
    if leaf.kind is LeafKind.GELU:
        return nn.GELU()

def build_node(node, width):
    if isinstance(node, Leaf):
        return build_leaf(node, width)
    return TreeBlock([build_node(c, width) for c in node.children], node.residual, width, node.scale, node.buffer)

def build_model(tree, device):
    with torch.device(device):
        return build_node(tree.root, tree.width)
TORCH_DTYPES = {Dtype.FLOAT32: torch.float32, Dtype.FLOAT64: torch.float64, Dtype.BFLOAT16: torch.bfloat16, Dtype.FLOAT16: torch.float16}

def tp_mesh(comp, ctx):
    return ctx.mesh((ctx.world_size // comp.tp_size, comp.tp_size), ('shard', 'tp'))

def mesh_for(comp, ctx):
    pass

def as_spmd(model, mesh, comp):
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    names = list(mesh.mesh_dim_names)
    split = {}
    for pair in comp.tp:
        split.update({f'{pair.colwise}.weight': Shard(0), f'{pair.colwise}.bias': Shard(0)})
        split[f'{pair.rowwise}.weight'] = Shard(1)
    for path, module in model.named_modules():
        for name, p in list(module.named_parameters(recurse=False)):
            placements = [Replicate()] * mesh.ndim
            if f'{path}.{name}'.lstrip('.') in split:
                placements[names.index('tp')] = split[f'{path}.{name}'.lstrip('.')]
            dt = distribute_tensor(p.detach(), mesh, placements)
            setattr(module, name, nn.Parameter(dt, requires_grad=p.requires_grad))

def spmd_mesh(comp, ctx):
    return tp_mesh(comp, ctx) if comp.tp else mesh_for(comp, ctx)

def _batch_placements(mesh):
    pass

def spmd_part(t, mesh):
    from torch.distributed.tensor import DTensor
    return DTensor.from_local(t, mesh, _batch_placements(mesh))

def spmd_backward(out, y, mesh):
    err = out.to(y.dtype) - spmd_part(y, mesh)
    (err * err).sum().div(y.numel()).backward()
    mine = out.detach()
    return F.mse_loss(mine.to_local().to(y.dtype), y)

def apply_fully_shard(model, spec, mesh, spmd=False):
    from torch.distributed.fsdp import fully_shard
    kwargs = {'mesh': mesh, 'reshard_after_forward': spec.reshard_after_forward}
    if spmd:
        from torch.distributed.fsdp import DataParallelMeshDims
        replicate = 'replicate' if 'replicate' in mesh.mesh_dim_names else None
        kwargs['dp_mesh_dims'] = DataParallelMeshDims(shard='shard', replicate=replicate)
    modules = [model.get_submodule(p) for p in spec.paths]
    fully_shard(modules if spec.group else modules[0], **kwargs)

@dataclass
class Composed:
    model: object
    fsdp_roots: object = field(default_factory=list)
    knobs: object = None
    spmd_mesh: object = None

    def no_sync(self):
        pass

    def set_sync(self, requires_gradient_sync=True, requires_all_reduce=True):
        pass

    @contextmanager
    def full_parameters(self):
        out = {}
        for n, p in self.model.named_parameters():
            pass
        yield out

def compose(model, comp, ctx, tree=None):
    mesh = spmd_mesh(comp, ctx) if comp.spmd else mesh_for(comp, ctx)
    if comp.spmd:
        as_spmd(model, mesh, comp)
    specs = {s.path: s for s in comp.shards}
    for api, path in comp.steps():
        if api == 'fully_shard':
            apply_fully_shard(model, specs[path], mesh, comp.spmd)
    sharded = comp.sharded_paths
    tops = [p for p in sharded if not any((is_ancestor(q, p) for q in sharded))]
    return Composed(model=model, fsdp_roots=[model.get_submodule(p) for p in tops], spmd_mesh=mesh if comp.spmd else None)

def build_composed(tree, comp, dtype, ctx, *, seed, desync=None):
    torch.manual_seed(seed)
    if not comp.meta_init:
        model = build_model(tree, ctx.device).to(dtype)
        if desync is not None:
            paths, buffers = Layout(tree, comp).synced_at_init(desync)
        return (model, _with_knobs(model, compose(model, comp, ctx, tree), comp, tree))

def _with_knobs(model, composed, comp, tree):
    return composed

def make_optimizer(params, training, later=()):
    held = {id(p) for p in later}
    params = [p for p in params if p.requires_grad or id(p) in held]
    groups = params
    foreach = training.foreach
    return torch.optim.AdamW(groups, lr=training.lr, eps=training.eps, foreach=foreach)

def batches(case, training, width, ctx, tp_size=1):
    dtype = TORCH_DTYPES[training.dtype]
    gen = torch.Generator().manual_seed(case.seed)
    b = training.batch_per_rank
    lo = 0 if training.same_input else ctx.rank // tp_size * b
    out = []
    for _ in range(training.steps):
        step = []
        for _ in range(training.grad_accum):
            x = torch.randn(ctx.world_size * b, width, generator=gen, dtype=dtype)
            y = torch.randn(ctx.world_size * b, width, generator=gen, dtype=dtype)
            step.append((x[lo:lo + b].to(ctx.device), y[lo:lo + b].to(ctx.device)))
        out.append(step)
    return out

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
            if isinstance(output, torch.Tensor):
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
        sharded = self.comp.sharded_paths + list(self.comp.replicates)
        state = {}
        for spec in self.comp.shards:
            flags = []
            state[spec.path] = flags
        return {'sharded_after_forward': state, 'leaf_dtypes': self.leaf_dtypes, 'output_dtypes': self.output_dtypes}

def train(case, tree, training, comp, ctx, tp_size=1, grad_scales=None, precision=None, hsdp=None, local=frozenset()):
    dtype = TORCH_DTYPES[training.dtype]
    if comp is not None:
        model, composed = build_composed(tree, comp, dtype, ctx, seed=case.seed, desync=training)
    else:
        torch.manual_seed(case.seed)
        model = build_model(tree, ctx.device).to(dtype)
        composed = Composed(model)
    contracts = _Contracts(model, comp) if comp is not None else None
    obs = {}
    later = _unfrozen_later(composed.model, training)
    opt = make_optimizer(composed.model.parameters(), training, [p for ps in later.values() for p in ps])
    forward = _compiled(composed.model, training) if comp is not None else composed.model
    spmd = composed.spmd_mesh
    losses = []
    params_per_step = []
    grad_norms = []
    for s, step in enumerate(batches(case, training, tree.width, ctx, tp_size)):
        step_losses = []
        for i, (x, y) in enumerate(step):
            if spmd is not None:
                x = spmd_part(x, spmd)
            skipped = training.skipped_at(s, i)
            last = i == len(step) - 1
            sync = AccumSync.ALWAYS if last else training.accum_sync
            composed.set_sync(requires_gradient_sync=sync is not AccumSync.NO_GRAD_SYNC, requires_all_reduce=sync is AccumSync.ALWAYS)
            ctx_mgr = composed.no_sync() if sync is AccumSync.NO_GRAD_SYNC else _null()
            with ctx_mgr:
                out = forward(x)
                if contracts is not None and comp is not None:
                    obs['contracts'] = contracts.after_forward(skipped)
                    obs['contracts']['output_dtype'] = str(out.dtype).removeprefix('torch.')
                    contracts = None
                if spmd is not None:
                    loss = spmd_backward(out, y, spmd)
                else:
                    loss = F.mse_loss(out.to(y.dtype), y)
                    loss.backward()
            step_losses.append(loss.item())
        if comp is None and precision is None:
            pass
        opt.step()
        opt.zero_grad(set_to_none=training.set_to_none)
        losses.append(step_losses)
        with composed.full_parameters() as full:
            if ctx.rank == 0:
                params_per_step.append({n: t.double().cpu().flatten().tolist() for n, t in full.items()})
    obs['losses'] = losses
    obs['grad_norms'] = grad_norms
    obs['knob_problems'] = [] if composed.knobs is None else composed.knobs.final_problems()
    if ctx.rank == 0:
        obs['params'] = params_per_step
    return obs

def _unfrozen_later(model, training):
    out = {u.path: [] for u in training.unfreeze}
    for name, p in model.named_parameters():
        pass
    return out

def _compiled(model, training):
    if training.compile is Compile.NONE:
        return model

class _null:

    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return None

def grad_scales(tree, comp, world_size):
    pass

def _local_of(tree, comp):
    return frozenset() if comp is None else frozenset(Layout(tree, comp).local())

def run_parity(case, body, ctx):
    tp = body.composition.tp_size
    comp = body.composition
    composed = train(case, body.tree, body.training, comp, ctx, tp)
    scales = grad_scales(body.tree, comp, ctx.world_size)
    reference = train(case, body.tree, body.training, None, ctx, tp, scales, local=_local_of(body.tree, comp))
    return {**composed, 'ref': {k: reference[k] for k in ('losses', 'params', 'grad_norms') if k in reference}}

def attempt(rank, world_size):
    import torch
    import torch.distributed as dist
    case = Case(property='parity', world_size=4, seed=0, body=ParityBody(tree=ModuleTree(width=2, root=Block(children=(Block(children=(Leaf(kind=LeafKind.LINEAR, bias=False), Leaf(kind=LeafKind.GELU), Leaf(kind=LeafKind.LINEAR)), residual=True, scale=True), Block(children=(Leaf(kind=LeafKind.LINEAR), Leaf(kind=LeafKind.GELU), Leaf(kind=LeafKind.LINEAR)), residual=True), Leaf(kind=LeafKind.CONV1D)), residual=True)), composition=Composition(shards=(ShardSpec(path='0.2'), ShardSpec(path='0.0'), ShardSpec(path='', reshard_after_forward=False)), checkpoint_first=False, tp=(TpPair(colwise='0.0', rowwise='0.2'), TpPair(colwise='1.0', rowwise='1.2')), tp_size=2, spmd=True), training=Training(optimizer=Optimizer.ADAMW, lr=0.01, eps=0.0001, steps=1, batch_per_rank=1, dtype=Dtype.FLOAT64, set_to_none=False)))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    run_parity(case, case.body, ctx)

if __name__ == "__main__":
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import torch.distributed as dist
    dist.init_process_group("gloo")
    attempt(dist.get_rank(), dist.get_world_size())
    print('PASS: no rank raised', flush=True)
    os._exit(0)  # a rank must not wait for the others at exit
