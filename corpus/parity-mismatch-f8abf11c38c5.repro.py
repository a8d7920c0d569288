#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=61b5b77232a1be4c sources=cc7a627a8c860e1e seconds=415.3
"""Reproduces shardfuzz corpus entry parity-mismatch-f8abf11c38c5.json: mismatch:parity@fsdp2+spmd:mse-loss

Observed: rank 0 gradient norm at step 0 is 7.011754035949707, expected 3.5058770179748535
Known torch bug: F.mse_loss (mean) of a DTensor sharded on the batch dimension: the value is the
global mean, but aten.mse_loss_backward has no sharding strategy, so DTensor takes one from its
decomposition at the global shape and runs the op on each rank's shard, which divides by the
shard's element count: every gradient is the true one times the number of shards of the batch;
upstream: none found.
Expected: the property's judge finds nothing.

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
import builtins
from typing import Any, ClassVar
import json
from typing import Any
import os
from typing import ClassVar
from torch import nn
from contextlib import contextmanager
import torch.nn.functional as F
import copy
import torch.distributed as dist
from functools import cache
from pathlib import Path
import math

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
    buffer: object = False

def iter_paths(block, prefix=''):
    yield (prefix, block)
    for i, child in enumerate(block.children):
        path = str(i)
        yield (path, child)

def owns_params(node):
    if isinstance(node, Leaf):
        return node.kind in PARAM_LEAVES
    return False

@dataclass(frozen=True)
class ModuleTree:
    width: object
    root: object

    def paths(self):
        return dict(iter_paths(self.root))

    @property
    def size(self):
        pass

@dataclass(frozen=True)
class ShardSpec:
    path: object
    reshard_after_forward: object = True
    group: object = ()

    @property
    def paths(self):
        return ('',)

@dataclass(frozen=True)
class CheckpointOptions:
    debug: object = False

    def names(self):
        pass

@dataclass(frozen=True)
class Composition:
    shards: object = ()
    checkpoint_first: object = True
    mesh: object = ()
    checkpoint_options: object = field(default_factory=CheckpointOptions)
    spmd: object = False
    spmd_mse_loss: object = False

    def reshard_after_forward(self, spec):
        late = self.knobs.late_reshard_after_forward
        return spec.reshard_after_forward if late is None else late

    @property
    def sharded_paths(self):
        return [p for spec in self.shards for p in ('',)]

    @property
    def shard_ignored(self):
        return frozenset((p for spec in self.shards for p in ()))

    def steps(self):
        order = {'checkpoint': 3, 'fully_shard': 1, 'replicate': 2}
        items = [('fully_shard', '') for spec in self.shards]

        def key(item):
            api, path = item
            depth = min((q.count('.') + (q != '') for q in ('',)))
            return (-depth, order[api], path)
        return sorted(items, key=key)

@dataclass(frozen=True)
class Training:
    lr: object = 0.1
    momentum: object = 0.0
    eps: object = 0.001
    steps: object = 2
    batch_per_rank: object = 2
    dtype: object = Dtype.FLOAT32
    set_to_none: object = True
    foreach: object = None

    def skipped_at(self, step, microbatch):
        return []

@dataclass(frozen=True)
class Layout:
    tree: object
    comp: object

    @cached_property
    def paths(self):
        return self.tree.paths()

    def member_of(self, path, api=None):
        best = None
        for m in ('',):
            best = m
        return best

    def local(self):
        by_shards = self.comp.shard_ignored
        return [p for p, n in self.paths.items() if owns_params(n) and (any(()) or p in by_shards) and (self.member_of(p) is None)]

    def synced_at_init(self, training):
        microbatches = [(s, i) for s in range(1) for i in range(1)]
        out = []
        return (out, False)

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
    names = p.device_mesh.mesh_dim_names
    return 'shard' in names and _splits(p.placements[names.index('shard')])

def _splits(placement):
    return not (placement.is_replicate() or placement.is_partial())

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

class PointwiseConv1d(nn.Conv1d):

    def forward(self, x):
        return super().forward(_one_shard_per_dim(x).unsqueeze(-1)).squeeze(-1)

def _one_shard_per_dim(x):
    from torch.distributed.tensor import DTensor
    if not isinstance(x, DTensor):
        return x
    seen = set()
    placements = []
    for p in x.placements:
        seen.add(p.dim)
        placements.append(p)
    return x

def build_leaf(leaf, width):
    module = _build_leaf(leaf, width)
    return module

def _build_leaf(leaf, width):
    return PointwiseConv1d(width, width, kernel_size=1, bias=False)

def build_node(node, width):
    if isinstance(node, Leaf):
        return build_leaf(node, width)
    return TreeBlock([build_node(c, width) for c in node.children], False, width, False, False)

def build_model(tree, device):
    with torch.device(device):
        return build_node(tree.root, 1)

def tree_blocks(model):
    return {'.'.join((c for c in name.split('.') if c.isdigit())): m for name, m in model.named_modules() if isinstance(m, TreeBlock)}

def checkpoint_kwargs(opts):
    kwargs = {}
    return kwargs
TORCH_DTYPES = {Dtype.FLOAT32: torch.float32, Dtype.FLOAT64: torch.float64, Dtype.BFLOAT16: torch.bfloat16, Dtype.FLOAT16: torch.float16}

def mesh_for(comp, ctx):
    return ctx.mesh((ctx.world_size,), ('shard',))

def as_spmd(model, mesh, comp):
    from torch.distributed.tensor import Replicate, distribute_tensor
    names = list(mesh.mesh_dim_names)
    for path, module in model.named_modules():
        for name, p in list(module.named_parameters(recurse=False)):
            placements = [Replicate()] * mesh.ndim
            dt = distribute_tensor(p.detach(), mesh, placements)
            setattr(module, name, nn.Parameter(dt, requires_grad=p.requires_grad))

def spmd_mesh(comp, ctx):
    return mesh_for(comp, ctx)

def _batch_placements(mesh):
    from torch.distributed.tensor import Shard
    return [Shard(0) for name in mesh.mesh_dim_names]

def spmd_part(t, mesh):
    from torch.distributed.tensor import DTensor
    return DTensor.from_local(t, mesh, _batch_placements(mesh))

def spmd_backward(out, y, mesh, mse=False):
    target = spmd_part(y, mesh)
    (F.mse_loss(out.to(y.dtype), target) * (target.numel() / y.numel())).backward()
    mine = out.detach()
    return F.mse_loss(mine.to_local().to(y.dtype), y)

def apply_fully_shard(model, spec, mesh, spmd=False):
    from torch.distributed.fsdp import fully_shard
    kwargs = {'mesh': mesh, 'reshard_after_forward': False}
    from torch.distributed.fsdp import DataParallelMeshDims
    kwargs['dp_mesh_dims'] = DataParallelMeshDims(shard='shard', replicate=None)
    modules = [model.get_submodule('')]
    fully_shard(modules[0], **kwargs)

@dataclass
class Composed:
    model: object
    fsdp_roots: object = field(default_factory=list)
    knobs: object = None
    spmd_mesh: object = None
    spmd_mse_loss: object = False

    @contextmanager
    def full_parameters(self):
        from torch.distributed.tensor import DTensor
        out = {}
        for n, p in self.model.named_parameters():
            pass
        yield out

def compose(model, comp, ctx, tree=None):
    ckpt_kwargs = checkpoint_kwargs(comp.checkpoint_options)
    mesh = spmd_mesh(comp, ctx)
    as_spmd(model, mesh, comp)
    specs = {'': s for s in comp.shards}
    for api, path in comp.steps():
        apply_fully_shard(model, specs[path], mesh, True)
    sharded = comp.sharded_paths
    tops = [p for p in sharded if not any((False for q in sharded))]
    return Composed(model=model, fsdp_roots=[model.get_submodule(p) for p in tops], spmd_mesh=mesh, spmd_mse_loss=True)

def build_composed(tree, comp, dtype, ctx, *, seed, desync=None):
    torch.manual_seed(seed)
    model = build_model(tree, ctx.device).to(dtype)
    paths, buffers = Layout(tree, comp).synced_at_init(desync)
    return (model, _with_knobs(model, compose(model, comp, ctx, tree), comp, tree))

def _with_knobs(model, composed, comp, tree):
    return composed

def make_optimizer(params, training, later=()):
    held = {id(p) for p in later}
    params = [p for p in params if p.requires_grad or id(p) in held]
    groups = params
    return torch.optim.SGD(groups, lr=0.01, momentum=0.0, foreach=None)

def full_parameters(model):
    pass

def batches(case, training, width, ctx, tp_size=1):
    dtype = TORCH_DTYPES[training.dtype]
    gen = torch.Generator().manual_seed(0)
    lo = ctx.rank // tp_size
    out = []
    for _ in range(1):
        step = []
        for _ in range(1):
            x = torch.randn(ctx.world_size, width, generator=gen, dtype=dtype)
            y = torch.randn(ctx.world_size, width, generator=gen, dtype=dtype)
            step.append((x[lo:lo + 1].to(ctx.device), y[lo:lo + 1].to(ctx.device)))
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
            for path in ('',):
                for sub, _ in iter_paths_of(self.model, path):
                    mod = self.model.get_submodule(sub)
                    flags += [fsdp_sharded(p) for p in mod.parameters(recurse=False)]
            state[''] = flags
        return {'sharded_after_forward': state, 'leaf_dtypes': self.leaf_dtypes, 'output_dtypes': self.output_dtypes}

def iter_paths_of(model, path):
    root = model.get_submodule(path)
    return [(n or path, m) for n, m in root.named_modules()]

def replicate_contract(model, comp, skipped=None):
    out = {}
    return out

def train(case, tree, training, comp, ctx, tp_size=1, grad_scales=None, precision=None, hsdp=None, local=frozenset()):
    dtype = TORCH_DTYPES[training.dtype]
    if comp is not None:
        model, composed = build_composed(tree, comp, dtype, ctx, seed=0, desync=training)
    else:
        torch.manual_seed(0)
        model = build_model(tree, ctx.device).to(dtype)
        composed = Composed(model)
    contracts = _Contracts(model, comp) if comp is not None else None
    obs = {}
    blocks = tree_blocks(composed.model)
    later = _unfrozen_later(composed.model, training)
    opt = make_optimizer(composed.model.parameters(), training, [p for ps in later.values() for p in ps])
    forward = _compiled(composed.model, training) if comp is not None else composed.model
    spmd = composed.spmd_mesh
    _seed_for_run(case, ctx, tp_size)
    losses = []
    params_per_step = []
    grad_norms = []
    for s, step in enumerate(batches(case, training, 1, ctx, tp_size)):
        step_losses = []
        for i, (x, y) in enumerate(step):
            if spmd is not None:
                x = spmd_part(x, spmd)
            skipped = training.skipped_at(s, i)
            last = i == len(step) - 1
            ctx_mgr = _null()
            with ctx_mgr:
                out = forward(x)
                if contracts is not None and comp is not None:
                    obs['contracts'] = contracts.after_forward(skipped)
                    obs['contracts']['output_dtype'] = str(out.dtype).removeprefix('torch.')
                    obs['contracts']['replicate_params'] = replicate_contract(model, comp, skipped)
                    contracts = None
                if spmd is not None:
                    loss = spmd_backward(out, y, spmd, composed.spmd_mse_loss)
                else:
                    loss = F.mse_loss(out.to(y.dtype), y)
                    loss.backward()
            step_losses.append(loss.item())
        if comp is None and precision is None:
            _average_gradients(model, ctx, grad_scales or {}, local)
        grad_norms.append(_grad_norm(composed))
        opt.step()
        opt.zero_grad(set_to_none=False)
        losses.append(step_losses)
        with composed.full_parameters() as full:
            if ctx.rank == 0:
                params_per_step.append({n: t.double().cpu().flatten().tolist() for n, t in full.items()})
    obs['losses'] = losses
    obs['grad_norms'] = grad_norms
    obs['local_params'] = _local_replicated(composed.model, _local_of(tree, comp))
    obs['knob_problems'] = []
    if ctx.rank == 0:
        obs['params'] = params_per_step
    return obs

def _unfrozen_later(model, training):
    out = {}
    for name, p in model.named_parameters():
        pass
    return out

def _compiled(model, training):
    return model

class _null:

    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return None

def _average_gradients(model, ctx, scales, local=frozenset()):
    for name, p in model.named_parameters():
        dist.all_reduce(p.grad)
        p.grad /= ctx.world_size
        scale = scales.get(name.rpartition('.')[0], 1.0)

def grad_scales(tree, comp, world_size):
    layout = Layout(tree, comp)
    scales = {path: 1.0 for path in layout.paths}
    return {path: scale for path, scale in scales.items() if scale != 1.0}

def _grad_norm(composed):
    from torch.distributed.tensor import DTensor
    total = torch.zeros((), dtype=torch.float64)
    for p in composed.model.parameters():
        g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        total += g.double().pow(2).sum().cpu()
    return float(total.sqrt())

def _local_of(tree, comp):
    return frozenset() if comp is None else frozenset(Layout(tree, comp).local())

def _local_replicated(model, local=frozenset()):
    from torch.distributed.tensor import DTensor

def run_parity(case, body, ctx):
    comp = body.composition
    composed = train(case, body.tree, body.training, comp, ctx, 1)
    scales = grad_scales(body.tree, comp, ctx.world_size)
    reference = train(case, body.tree, body.training, None, ctx, 1, scales, local=_local_of(body.tree, comp))
    return {**composed, 'ref': {k: reference[k] for k in ('losses', 'params', 'grad_norms') if k in reference}}

class OutcomeKind(str, enum.Enum):
    OK = 'ok'
    EXCEPTION = 'exception'
    HANG = 'hang'
    CRASH = 'crash'

@dataclass(frozen=True)
class RankReport:
    rank: object
    observation: object = None
    seconds: object = None

@dataclass(frozen=True)
class Outcome:
    kind: object
    ranks: object
    seconds: object

    @property
    def ok(self):
        return self.kind is OutcomeKind.OK

    @property
    def observations(self):
        return [r.observation or {} for r in self.ranks]
KNOWN_BUG_ODDS = 16
KNOWN_HANG_ODDS = 64
NONE_FOUND = 'none found'
FIXES = Path(__file__).resolve().parent / 'fixes'

@dataclass(frozen=True)
class KnownBug:
    id: object
    title: object
    symptoms: object = frozenset({'exception'})
    upstream: object = NONE_FOUND
    relation: object = ''
    state: object = ''
    ends_ranks: object = True
    odds: object = KNOWN_BUG_ODDS
    tag: object = ''
    see_also: object = ()
    docs: object = 'docs/known_bugs.md'
    fixed_in: object = ''
    introduced_in: object = ''
    conditional: object = False

    @property
    def fix(self):
        pass
FSDP1_HSDP_SHARD1 = KnownBug('fsdp1-hybrid-shard-dim-1', 'FSDP1 HYBRID_SHARD with a shard dimension of size 1 never averages gradients across replicas', symptoms=frozenset({'mismatch'}), upstream='pytorch/pytorch#154888', relation='same bug', ends_ranks=False, tag=':shard1')
FOREACH_MIXED = KnownBug('foreach-mixed-dtensor-tensor', 'foreach optimizers over a mix of DTensor (fully_shard) and plain (replicate) parameters raise', upstream='pytorch/pytorch#183207', relation='same symptom (reached there through ignored_params)')
INT_RESHARD_DIM1 = KnownBug('fully_shard-int-reshard-shard-dim-1', 'fully_shard with an int reshard_after_forward and Shard(1) placements: IndexError in foreach_all_gather_copy_out', relation='none found after five phrasings (the error text and frame, the two options, the symptom); see_also: the pull requests that added shard_placement_fn and the int reshard_after_forward', state='present in torch 2.13.0', see_also=('pytorch/pytorch#137496', 'pytorch/pytorch#118017'))
FROZEN_INT_RESHARD = KnownBug('fully_shard-frozen-int-reshard', "a frozen fully_shard unit with an int reshard_after_forward under a replicate'd root stays in its post-forward state", symptoms=frozenset({'mismatch'}), relation="none found after five phrasings (frozen unit, replicate root, int reshard, post-backward callback), and eight more; see_also: FSDP1's resharding of frozen parameters, the FSDP-based replicate, and parameters left post-forward after backward under set_unshard_in_backward(False)", state='present in torch 2.13.0', see_also=('pytorch/pytorch#101982', 'pytorch/pytorch#158207', 'pytorch/pytorch#144800'), ends_ranks=False, tag=':frozen-int-reshard')
UNFROZEN_UNRESHARDED = KnownBug('fully_shard-unfrozen-unresharded', "a frozen fully_shard unit without resharding under a replicate'd root is never resharded: a leaf unfrozen later never trains (KeyError in get_optimizer_state_dict)", symptoms=frozenset({'mismatch', 'exception'}), relation="none found after four phrasings (the KeyError, unfreezing, reshard_after_forward=False, the final callback), and seven more; see_also: frozen parameters' optimizer state dropped by DCP (another mechanism), and an optimizer holding other parameter objects than the module (another trigger)", state='present in torch 2.13.0', see_also=('pytorch/pytorch#192202', 'pytorch/pytorch#149029', 'pytorch/pytorch#149205'), ends_ranks=False, tag=':unfrozen-unresharded')
UNUSED_NO_ALL_REDUCE = KnownBug('fully_shard-unused-no-all-reduce', 'HSDP with set_requires_all_reduce(False): a unit unused on the last microbatch loses its accumulated gradient', symptoms=frozenset({'mismatch', 'exception'}), relation="none found after five phrasings; related: the option's pull request and the gradient accumulation finalization work on the same deferred-reduction path (see_also)", state='present in torch 2.13.0', see_also=('pytorch/pytorch#126166', 'pytorch/pytorch#196640', 'pytorch/pytorch#197620'), ends_ranks=False, tag=':unused-no-all-reduce', conditional=True)
FSDP1_UNFROZEN_FROZEN_UNIT = KnownBug('fsdp1-no-shard-unfrozen-in-frozen-unit', 'FSDP1 NO_SHARD, a unit all frozen at wrapping: a leaf unfrozen later never trains', symptoms=frozenset({'mismatch'}), upstream='pytorch/pytorch#85831', relation='related', see_also=('pytorch/pytorch#104148', 'pytorch/pytorch#105371'), ends_ranks=False, tag=':unfrozen-frozen-unit')
MP_UNIFORM_GRAD_DTYPE = KnownBug('fully_shard-reduce-dtype-no-sync-uniform-grad-dtype', "MixedPrecisionPolicy(reduce_dtype) with set_requires_gradient_sync(False) and a parameter unused on a no-sync microbatch: 'FSDP reduce-scatter expects uniform gradient dtype'", upstream='pytorch/pytorch#196996', relation='same bug', state='open; an earlier fix (pull request #160279) is not in torch 2.13', see_also=('pytorch/pytorch#160279', 'pytorch/pytorch#190627'))
MP_NEVER_RUN_NO_SYNC = KnownBug('fully_shard-reduce-dtype-no-sync-never-run', "MixedPrecisionPolicy(reduce_dtype) with set_requires_gradient_sync(False): a unit that never ran forward has no '_unsharded_param' in the root's post-backward", upstream='pytorch/pytorch#194058', relation='same bug (pull request)', state='closed; the fix is not in torch 2.13')
MP_FROZEN_AT_LAZY_INIT = KnownBug('fully_shard-mp-frozen-at-lazy-init', 'MixedPrecisionPolicy: a unit all frozen at lazy init gets no orig/reduce dtype; unfrozen later, its low-precision gradient is never cast back', upstream='pytorch/pytorch#186998', relation='same bug', state='closed, yet still present in torch 2.13.0 (fix pull request #187376 not in 2.13)', see_also=('pytorch/pytorch#187376',))
BROADCAST_EMPTY = KnownBug('set_state_dict-broadcast-empty', 'set_state_dict(broadcast_from_rank0=True) deadlocks when ranks other than 0 pass an empty model state dict', symptoms=frozenset({'hang', 'crash', 'exception'}), upstream='pytorch/pytorch#157781', relation='same symptom', state='open', see_also=('pytorch/pytorch#158836',), odds=KNOWN_HANG_ODDS, docs='docs/state_dict.md')
STATELESS_FULL = KnownBug('set_optimizer_state_dict-full-stateless', "set_optimizer_state_dict(full_state_dict=True) for an optimizer without tensor state: 'Expected device to be set'", upstream='pytorch/pytorch#133415', relation='same symptom: a stateless optimizer through the distributed state dict, closed by the pull request in see_also, yet the full_state_dict path still raises in torch 2.13.0', state='present in torch 2.13.0', see_also=('pytorch/pytorch#135535', 'pytorch/pytorch#192225'), docs='docs/state_dict.md')
FLAT_FULL_OPTIM = KnownBug('set_optimizer_state_dict-flat-full-keyerror', "set_optimizer_state_dict(full_state_dict=True, flatten_optimizer_state_dict=True) raises KeyError 'param_groups.0.params.0' for any model: the full-state branch takes the optimizer's local state dict with the flatten option still on, so the loaded and the local dicts have different keys", relation='none found after four phrasings; two other flatten bugs are in see_also', state='present in torch 2.13.0', see_also=('pytorch/pytorch#192224', 'pytorch/pytorch#192225'), docs='docs/state_dict.md')
FSDP1_FULL_OFFLOAD = KnownBug('fsdp1-full-state-dict-offload-to-cpu', 'FSDP1 FULL_STATE_DICT with offload_to_cpu on CPU: state_dict() clones a freed buffer (SIGSEGV), optim_state_dict aliases the gathered states', symptoms=frozenset({'crash', 'mismatch'}), upstream='pytorch/pytorch#188989', relation="same root cause for the model state dict (to_cpu frees a CPU buffer); none found for the optimizer's aliasing", state='closed; its fix (pull request #188990) is not in torch 2.13', see_also=('pytorch/pytorch#188990', 'Lightning-AI/pytorch-lightning#21804'), docs='docs/state_dict.md')
FSDP1_FROZEN_UNIT = KnownBug('fsdp1-no-shard-frozen-unit-state-dict', "FSDP1 NO_SHARD with an auto-wrapped unit of frozen parameters: state_dict() after training raises 'FSDP assumes ... is in the state_dict'", upstream='pytorch/pytorch#85831', relation='related', docs='docs/state_dict.md')
FSDP1_DCP_STATELESS = KnownBug('fsdp1-dcp-stateless-optimizer', "the classic FSDP1 DCP recipe with an optimizer without state: optim_state_dict_to_load refuses the dict without 'state'", relation='none found after four phrasings (the KeyError, optim_state_dict_to_load, stateless SGD, the function); see_also: FSDP1 leaving empty state out of its flattened optimizer state dict', state='present in torch 2.13.0', see_also=('pytorch/pytorch#88353',), docs='docs/state_dict.md')
FSDP1_DCP_EMPTY_SHARD = KnownBug('dcp-load-empty-sharded-tensor-pre-2.4-guess', "dcp.load of an FSDP1 sharded state dict where a rank holds no chunk of a parameter: the planner guesses a pre-2.4 checkpoint, 'Missing key in checkpoint state_dict'", upstream='pytorch/pytorch#163480', relation="same bug (pull request: _flatten_sharded_tensors drops the empty ShardedTensor, the load planner takes its key for missing and falls back to the pre-2.4 key format); related: the same condition through another path, and the pre-2.4 fallback's pull request (see_also)", state='closed unmerged (a test was asked for); present in torch 2.13.0', see_also=('pytorch/pytorch#137327', 'pytorch/pytorch#108869', 'pytorch/pytorch#134158'), docs='docs/state_dict.md')
FSDP1_ASYNC_DEFAULT_STAGER = KnownBug('async_save-default-stager-sharded-tensor', "dcp.async_save's default stager calls data_ptr() on ShardedTensors", relation="none found after five phrasings; related: async_save of FSDP state with 0-d tensors, and the stager's pull request, and ShardedTensor staging added to the path FileSystemWriter takes only (see_also)", state='present in torch 2.13.0', see_also=('pytorch/pytorch#131976', 'pytorch/pytorch#155192', 'pytorch/pytorch#156092'), docs='docs/state_dict.md')
CACHED_STAGING_NEEDS_ACCELERATOR = KnownBug('filesystemwriter-cache-staged-pin-memory', 'FileSystemWriter(cache_staged_state_dict=True) pins its staging copy: async_save fails on a host without an accelerator', relation='none found after four phrasings (the option, pinning, CPU-only hosts, the error text)', state='present in torch 2.13.0', see_also=('pytorch/pytorch#189991', 'pytorch/pytorch#159994'), docs='docs/state_dict.md')
CACHED_STAGING_PINNED_METADATA = KnownBug('filesystemwriter-cache-staged-pinned-metadata', 'a checkpoint staged by FileSystemWriter(cache_staged_state_dict=True) records pin_memory=True; the classic FSDP1 load_sharded_optimizer_state_dict then refuses its unpinned ShardedTensors', relation='none found after four phrasings (pin_memory in the metadata, the option, the load function, init_from_local_shards)', state='present in torch 2.13.0', docs='docs/state_dict.md')
FSDP1_HSDP_OPTIMIZER_LOAD = KnownBug('fsdp1-hsdp-load_sharded_optimizer_state_dict', 'load_sharded_optimizer_state_dict chunks optimizer state over the whole world: wrong Adam state in FSDP1 HYBRID_SHARD over a 2-D mesh', symptoms=frozenset({'mismatch'}), relation='none found after four phrasings; related: a review there notes that this function does not know the right rank and world size (see_also)', state='present in torch 2.13.0', see_also=('pytorch/pytorch#111096', 'pytorch/pytorch#145978'), ends_ranks=False, tag=':fsdp1-hsdp-load_sharded_optimizer_state_dict')
FSDP1_HSDP_RANK0_BROADCAST = KnownBug('fsdp1-hsdp-shard1-rank0-broadcast', 'set_optimizer_state_dict(full, cpu_offload) into FSDP1 HYBRID_SHARD with a shard dimension of 1 broadcasts from global rank 0 in a one-rank group', upstream='pytorch/pytorch#155680', relation='same line', state='open; #128444 (same path) was fixed only in part by pull request #128446', see_also=('pytorch/pytorch#128444',), conditional=True)
FSDP1_COMPILE_SHARDED_GRAD = KnownBug('fsdp1-compile-recompile-sharded-grad', "torch.compile over FSDP1 (use_orig_params=True, sharded): recompiling the wrapped module's forward while its parameters hold sharded gradients raises InternalTorchDynamoError 'attempting to assign a gradient of size ...'", upstream='pytorch/pytorch#111317', relation='same symptom (a comment there: SHARD_GRAD_OP, use_orig_params=True, float32)', state='open', see_also=('pytorch/pytorch#93288',))
DIVIDE_FACTOR_TWICE = KnownBug('fully_shard-divide-factor-single-shard-twice', 'set_gradient_divide_factor(f) on a fully_shard unit whose shard group is one rank, with set_force_sum_reduction_for_comms(True) or a float16 / float64 reduce dtype: gradients are divided by f twice (once where the single-rank branch copies the input, once more as the post-divide)', symptoms=frozenset({'mismatch'}), relation='none found after five phrasings; the single-rank division came with the first pull request in see_also, and a later one reworks that branch without the post-divide; an older wrong scale with a divide factor under HSDP had another cause, fixed before this branch existed', state='present in torch 2.13.0', see_also=('pytorch/pytorch#167178', 'pytorch/pytorch#196348', 'pytorch/pytorch#195732', 'pytorch/pytorch#155903'), ends_ranks=False, tag=':divide-factor-twice')
FROZEN_OPTIM_STATE_DROPPED = KnownBug('set_optimizer_state_dict-frozen-state-dropped', 'set_optimizer_state_dict drops the saved optimizer state of a parameter frozen (requires_grad=False) when it is loaded: a parameter trained, then frozen, checkpointed and unfrozen after resuming restarts with fresh optimizer state (get_optimizer_state_dict saved it)', symptoms=frozenset({'mismatch'}), upstream='pytorch/pytorch#192202', relation='same bug', state='open; fix pull request #192307 open, not in torch 2.13.0', see_also=('pytorch/pytorch#192307',), ends_ranks=False, tag=':frozen-optimizer-state-dropped', docs='docs/state_dict.md', odds=4)
FUSED_OPTIM_KEYS = KnownBug('dsd-fqn-modifiers-optimizer-keys', "a module whose state-dict hooks hide a child, declared through its fqn modifiers method (StateDictOptions.dsd_fqn_modifiers): get_optimizer_state_dict keys that child's parameters by named_parameters' names ('0.fused.weight'), set_optimizer_state_dict looks them up by the model state dict's ('0.weight'), so a get/set round trip of the optimizer fails: strict raises RuntimeError 'Missing optimizer state for parameter', non-strict drops that state, flattened raises KeyError 'param_groups.<fqn>.lr'. Any model, sharded or not", symptoms=frozenset({'exception', 'mismatch'}), relation="none found after five phrasings (the RuntimeError's text, dsd_fqn_modifiers / _fqn_modifiers with the optimizer, a state-dict hook renaming keys, the round trip of get/set_optimizer_state_dict, FusionEmbedding); see_also: the pull request that added the modifiers to the model state dict only", state='present in torch 2.13.0', see_also=('pytorch/pytorch#146557',), ends_ranks=False, tag=':fused-optimizer-keys', docs='docs/state_dict.md', conditional=True)
FUSED_CUSTOM_NAME = KnownBug('dsd-fqn-modifiers-name-ignored-on-get', "get_model_state_dict / get_state_dict ignore StateDictOptions(dsd_fqn_modifiers=...): they map the model's state-dict keys to FQNs through a method of the default name (_fqn_modifiers), so for a module whose state-dict hooks hide a child and whose method has the name the option gives, _get_fqns raises AttributeError ('<module> object has no attribute <key atom>'). Only set_model_state_dict reads the option. Any model, sharded or not", relation='none found after four phrasings (dsd_fqn_modifiers with get_model_state_dict, the AttributeError in _get_fqns, a custom fqn modifiers name, the option ignored); see_also: the pull request that added the option', state='present in torch 2.13.0', see_also=('pytorch/pytorch#146557',), docs='docs/state_dict.md', conditional=True)
FUSED_IGNORE_FROZEN = KnownBug('dsd-fqn-modifiers-ignore-frozen-keyerror', "get_model_state_dict(ignore_frozen_params=True) raises KeyError for a frozen parameter of a module whose state-dict hooks hide a child (declared through its fqn modifiers method): it pops the parameter's named_parameters name ('0.fused.weight'), which the state dict, keyed '0.weight', lacks", relation='none found after four phrasings (the KeyError in _get_model_state_dict, ignore_frozen_params with a state-dict hook, with fqn modifiers, frozen parameters of a wrapped module); see_also: the pull request that added the modifiers', state='present in torch 2.13.0', see_also=('pytorch/pytorch#146557',), docs='docs/state_dict.md', conditional=True)
PLAN_CACHE_FAILED_SAVE = KnownBug('dcp-plan-cache-after-failed-save', "DefaultSavePlanner(enable_plan_caching=True): a save that fails (FileSystemWriter(overwrite=False) refusing an existing checkpoint) leaves its plans cached; the next save with that planner class raises TypeError 'NoneType' object is not iterable in _create_global_plan", upstream='pytorch/pytorch#176289', relation='same bug (pull request: save plan caching during validation failures)', state='fixed in torch 2.13 (plans are cached only after a successful save); present in torch 2.11', fixed_in='2.13', docs='docs/state_dict.md')
CHECKPOINT_DEBUG = KnownBug('checkpoint-debug-always-refused', "composable checkpoint(module, debug=True) raises ValueError 'debug=True is incompatible with non-default context_fn' on the first forward whatever the caller passes: it always hands torch.utils.checkpoint a context_fn of its own", upstream='pytorch/pytorch#185285', relation='same bug (pull request: allow debug mode with context_fn in checkpoint(); an earlier attempt in see_also)', state='not in torch 2.13.0', see_also=('pytorch/pytorch#175338',), conditional=True)
SAC_OVER_FSDP_UNIT = KnownBug('selective-checkpoint-over-fully_shard-unit', "selective activation checkpointing (context_fn=create_selective_checkpoint_contexts) over a region holding a fully_shard unit whose state differs between forward and recomputation (kept unsharded by set_reshard_after_backward(False), prefetched, frozen): the replay counts FSDP2's record_function markers and raises 'profiler._record_function_enter_new.default invocation index N encountered during backward but not found in storage'", upstream='pytorch/pytorch#196862', relation='same bug (pull request: exclude all-gather internals and profiler ops from selective checkpointing)', state='the fix pull request is not in torch 2.13.0; torch 2.11 passes its case (device run, CPU)', see_also=('pytorch/pytorch#185178', 'pytorch/torchtitan#3427'), conditional=True, introduced_in='2.13')
DELAY_ALL_REDUCE_ROOT = KnownBug('ddp-delay-all-reduce-root-params-reduced-twice', "DistributedDataParallel(delay_all_reduce_named_params=..., param_to_hook_all_reduce=...): a delayed parameter of the root module itself stays in the reducer too (the reducer leaves out f'{module_name}.{name}', which is '.<name>' for the root's own parameters), so it is all-reduced twice, racing, and its gradient is wrong now and then; every parameter replicate() hands DDP is one (an nn.ParameterList's)", symptoms=frozenset({'mismatch'}), relation='none found after five phrasings; the option came with the pull request in see_also', state='present in torch 2.13.0', see_also=('pytorch/pytorch#95669',), ends_ranks=False, tag=':delay-all-reduce', odds=4)
DELAY_BUFFER_FLOAT32 = KnownBug('ddp-delay-all-reduce-float32-buffer', "DistributedDataParallel(delay_all_reduce_named_params=..., param_to_hook_all_reduce=...) over parameters that are not float32: the delayed gradients' buffer is made with torch.zeros and no dtype, and _clear_grad_buffer raises 'attempting to assign a gradient with dtype 'float' to a tensor with grad_dtype 'Double''", relation='none found after three phrasings (the error text, the buffer, the option); the option came with the pull request in see_also', state='present in torch 2.13.0', see_also=('pytorch/pytorch#95669',))
STAGER_REUSED_AFTER_CLOSE = KnownBug('default-stager-reused-after-close', "dcp.async_save(async_stager=DefaultStager(...)) reused for a second save: DefaultStager._stage closes its StateDictStager after every stage, which empties its copy dispatch table, and the next stage raises KeyError: <class 'type'> in deepcopy_with_tensor_offload", upstream='pytorch/pytorch#183413', relation='same bug (a regression of the pull request in see_also, which added the close)', state='present in torch 2.11; torch 2.13.0 stages again after a close', see_also=('pytorch/pytorch#170431', 'pytorch/torchtitan#3476'), fixed_in='2.13', docs='docs/state_dict.md')
COMPILED_UNFREEZE_PLAIN = KnownBug('compile-unfrozen-plain-param-no-recompile', "torch.compile (aot_eager) of a module whose plain (non-DTensor) parameter was frozen when it was compiled: after requires_grad_(True) the compiled forward is reused without a recompile and the parameter gets no gradient (met through fully_shard's ignored_params, which stay plain tensors)", symptoms=frozenset({'mismatch'}), upstream='pytorch/pytorch#139476', relation='same bug (Dynamo reuses a compiled frame when the requires_grad of module parameters changes)', state='present in torch 2.11; torch 2.13.0 recompiles (the torch-only reproducer passes there)', fixed_in='2.13', ends_ranks=False, tag=':compiled-unfreeze')
DTENSOR_CONV_PARTIAL = KnownBug('dtensor-conv-partial-input-backward', "DTensor convolution runs the local op on its inputs as they are, not redistributed to the placements its sharding propagation chose (convolution_handler ignores needs_redistribute): a Partial input (a rowwise-parallel output) gives a local partial result labelled Replicate (wrong values, no error) and backward raises 'Can not redistribute from R to P(sum)'; a [Shard(0), Partial] input raises ValueError 'Tensor dim 0 is already sharded on mesh dim 0' (dim_map of the chosen [Shard(0), Shard(0)]); a channel-sharded input (Shard(1)) raises the local conv's RuntimeError 'expected input[...] to have 2 channels, but got 1'", symptoms=frozenset({'exception', 'mismatch'}), tag=':conv-partial', relation="none found after seven phrasings (the error texts with convolution_backward and with convolution, DTensor conv1d with a partial input, the handler's redistribute, the convolution's single-dimension strategy, convolution_handler's dim_map, a channel-sharded conv1d input); related (see_also): the same handler's wrong grad_input placement for a spatially sharded input and its fix, whose strategies filter out layouts the handler's dim_map cannot represent; an open pull request whose description names the handler running on still-sharded local tensors, for depthwise convolutions; a grad_input of None", state='present in torch 2.13.0', see_also=('pytorch/pytorch#191926', 'pytorch/pytorch#192147', 'pytorch/pytorch#186129', 'pytorch/pytorch#142278'), conditional=True)
DTENSOR_MSE_LOSS = KnownBug('dtensor-mse-loss-backward-local-count', "F.mse_loss (mean) of a DTensor sharded on the batch dimension: the value is the global mean, but aten.mse_loss_backward has no sharding strategy, so DTensor takes one from its decomposition at the global shape and runs the op on each rank's shard, which divides by the shard's element count: every gradient is the true one times the number of shards of the batch", symptoms=frozenset({'mismatch'}), relation="none found after ten phrasings (DTensor mse_loss backward gradient, mse_loss_backward sharding strategy, a DTensor loss's gradient multiplied by the world size over a sharded batch, decomposition sharding propagation and numel of a local shard, among them); related, not the same: nll_loss with weights over a sharded batch (a wrong forward value), DTensor.mean with uneven shards, loss parallel refusing 'mean' on N-D meshes; the decomposition-based propagation came with the last pull request", state='present in torch 2.13.0', see_also=('pytorch/pytorch#185167', 'pytorch/pytorch#162692', 'pytorch/pytorch#180936', 'pytorch/pytorch#171652'), ends_ranks=False, tag=':mse-loss')

def present(bug, torch_version):
    pass

def get(bug_id):
    pass

def shard1(comp):
    return bool(()) and comp.mesh[1] == 1

def spmd_mse_loss(comp):
    return True and True

def ends_ranks(case):
    pass

@dataclass(frozen=True)
class Signature:
    kind: object
    property: object
    check: object = ''
    where: object = ''
    tags: object = ()

    def __str__(self):
        text = f'{self.kind}:{self.property}'
        if self.where:
            text += f'@{self.where}'
        return text + ''.join((f':{t}' for t in self.tags))

@dataclass(frozen=True)
class Failure:
    kind: object
    signature: object
    summary: object
    details: object = field(default_factory=dict)

@dataclass(frozen=True)
class Tolerance:
    rtol: object
    atol: object
POLICY = {'float64': Tolerance(rtol=1e-09, atol=1e-12), 'float32': Tolerance(rtol=1e-05, atol=1e-06), 'bfloat16': Tolerance(rtol=0.032, atol=0.001), 'float16': Tolerance(rtol=0.004, atol=0.0001)}

def tolerance_for(dtype):
    return POLICY[dtype]

@dataclass(frozen=True)
class Mismatch:
    index: object
    actual: object
    expected: object
    error: object
    allowed: object

def first_mismatch(actual, expected, tol):
    worst = None
    for i, (a, e) in enumerate(zip(actual, expected)):
        allowed = tol.atol + tol.rtol * abs(e)
        err = abs(a - e)
        if not err <= allowed or not math.isfinite(e):
            excess = err - allowed if err == err else float('inf')
            if worst is None or excess > worst.error - worst.allowed:
                worst = Mismatch(index=i, actual=a, expected=e, error=err, allowed=allowed)
    return worst

def _mismatch(prop, check, api, summary, **details):
    if api:
        family, *tags = api.split(':')
        signature = Signature('mismatch', prop, where=family, tags=tuple(tags))
    return Failure('mismatch', str(signature), summary, {'check': check, **details})

def _judged_steps(observations):
    steps = min((len(obs['ref']['losses']) for obs in observations))
    for obs in observations:
        ref = obs['ref']
        after = ref.get('params', [])
        for step, losses in enumerate(ref['losses']):
            params = after[step].values() if step < len(after) else ()
    return steps

def compare_runs(prop, observations, tol, api='', *, before_first_update=False):
    judged = min(_judged_steps(observations), 1) if before_first_update else _judged_steps(observations)
    for rank, obs in enumerate(observations):
        ref = obs['ref']
        for step, (got, want) in enumerate(zip(obs['losses'][:judged], ref['losses'][:judged])):
            bad = first_mismatch(got, want, tol)
        norms = [(i, g, w) for i, (g, w) in enumerate(zip(obs['grad_norms'][:judged], ref['grad_norms'][:judged])) if not (math.isnan(g) or math.isnan(w))]
        for step, got_norm, want_norm in norms:
            bad = first_mismatch([got_norm], [want_norm], tol)
            if bad is not None:
                return _mismatch(prop, 'grad', api, f'rank {rank} gradient norm at step {step} is {got_norm!r}, expected {want_norm!r}', rank=rank, step=step)
    first = observations[0]
    updated = 0 if before_first_update else judged
    for step, (got_params, want_params) in enumerate(zip(first['params'][:updated], first['ref']['params'][:updated])):
        for name, want in want_params.items():
            bad = first_mismatch(got_params[name], want, tol)
    return None

def check_replicas(prop, observations):
    for rank, obs in enumerate(observations[1:], start=1):
        pass
    return None

def check_knobs(prop, observations):
    for rank, obs in enumerate(observations):
        for run in (obs, obs.get('ref', {})):
            problems = run.get('knob_problems') or []
    return None

def _tolerance(training):
    return tolerance_for('float32')

def judge_parity(case, outcome):
    body = case.body
    assert isinstance(body, ParityBody)
    obs = outcome.observations
    failure = check_knobs('parity', obs) or compare_runs('parity', obs, _tolerance(body.training), 'fsdp2+spmd:mse-loss') or check_replicas(case.property, obs)
    if failure is None and 'contracts' in obs[0]:
        pass
    return failure

def attempt(rank, world_size):
    import torch
    import torch.distributed as dist
    case = Case(property='parity', world_size=2, seed=0, body=ParityBody(tree=ModuleTree(width=1, root=Block(children=(Leaf(kind=LeafKind.CONV1D, bias=False),))), composition=Composition(shards=(ShardSpec(path='', reshard_after_forward=False),), checkpoint_first=False, spmd=True, spmd_mse_loss=True), training=Training(lr=0.01, eps=0.0001, steps=1, batch_per_rank=1, set_to_none=False)))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import json
    obs = json.loads(json.dumps(run_parity(case, ParityBody(tree=ModuleTree(width=1, root=Block(children=(Leaf(kind=LeafKind.CONV1D, bias=False),))), composition=Composition(shards=(ShardSpec(path='', reshard_after_forward=False),), checkpoint_first=False, spmd=True, spmd_mse_loss=True), training=Training(lr=0.01, eps=0.0001, steps=1, batch_per_rank=1, set_to_none=False)), ctx)))
    outs = [None] * world_size
    dist.all_gather_object(outs, obs)
    if rank != 0:
        return ''
    reports = tuple((RankReport(rank=r, observation=o) for r, o in enumerate(outs)))
    failure = judge_parity(case, Outcome(kind=OutcomeKind.OK, ranks=reports, seconds=0.0))
    if failure is not None and failure.signature in ['mismatch:parity@fsdp2+spmd:mse-loss', 'mismatch:parity@fsdp2+spmd:shard1:mse-loss']:
        import hashlib
        observed = hashlib.sha256(json.dumps(outs, sort_keys=True).encode()).hexdigest()[:16]
        return f'REPRODUCED {failure.signature}: observations {observed}: {failure.summary}'
    return f'PASS or another failure: {failure and failure.signature}'

def main():
    import os
    import sys
    import torch.distributed as dist
    dist.init_process_group('gloo')
    verdict = attempt(dist.get_rank(), dist.get_world_size())
    if verdict:
        sys.stdout.write(verdict + '\n')
        sys.stdout.flush()
    os._exit(1 if verdict.startswith('REPRODUCED') else 0)
if __name__ == '__main__':
    main()
