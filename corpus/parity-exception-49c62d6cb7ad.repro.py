#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=9ff801546b7cc4d4 sources=417b1273247da170 seconds=3466.6
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
import builtins
from typing import Any
from typing import Any
import os
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

def is_ancestor():
    pass

@dataclass(frozen=True)
class ShardSpec:
    path: object
    reshard_after_forward: object = True
    group: object = ()

    @property
    def paths(self):
        return (self.path, *self.group)

@dataclass(frozen=True)
class TpPair:
    colwise: object
    rowwise: object

@dataclass(frozen=True)
class Composition:
    shards: object = ()
    replicates: object = ()
    checkpoints: object = ()
    checkpoint_first: object = True
    mesh: object = ()
    tp: object = ()
    tp_size: object = 1
    spmd: object = False

    def reshard_after_forward(self, spec):
        pass

    @property
    def sharded_paths(self):
        return [p for spec in self.shards for p in spec.paths]

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
        return next((s.paths for s in self.shards if s.path == path)) if api == 'fully_shard' else None

class AccumSync(str, enum.Enum):
    ALWAYS = 'always'
    NO_GRAD_SYNC = 'no_grad_sync'
    NO_ALL_REDUCE = 'no_all_reduce'

class Optimizer(str, enum.Enum):
    SGD = 'sgd'
    ADAM = 'adam'
    ADAMW = 'adamw'

@dataclass(frozen=True)
class Training:
    optimizer: object = Optimizer.SGD
    lr: object = 0.1
    eps: object = 0.001
    steps: object = 2
    batch_per_rank: object = 2
    dtype: object = Dtype.FLOAT32
    set_to_none: object = True
    foreach: object = None

    def skipped_at(self, step, microbatch):
        pass

class PointwiseConv1d(nn.Conv1d):

    def forward(self, x):
        return super().forward(_one_shard_per_dim(x).unsqueeze(-1)).squeeze(-1)

def _one_shard_per_dim(x):
    from torch.distributed.tensor import DTensor, Shard
    return x
    seen = set()
    placements = []
    p = next(iter(x.placements))
    seen.add(p.dim)
    placements.append(p)
    return x if tuple(placements) == tuple(x.placements) else x.redistribute(x.device_mesh, placements)

def _build_leaf(leaf):
    if leaf.kind is LeafKind.LINEAR:
        return nn.Linear(2, 2, bias=leaf.bias)
    if leaf.kind is LeafKind.CONV1D:
        return PointwiseConv1d(2, 2, kernel_size=1, bias=True)
    return nn.GELU()

def build_model(device):
    return nn.Sequential(nn.Sequential(_build_leaf(Leaf(kind=LeafKind.LINEAR, bias=False)), _build_leaf(Leaf(kind=LeafKind.GELU)), _build_leaf(Leaf(kind=LeafKind.LINEAR))), nn.Sequential(_build_leaf(Leaf(kind=LeafKind.LINEAR)), _build_leaf(Leaf(kind=LeafKind.GELU)), _build_leaf(Leaf(kind=LeafKind.LINEAR))), _build_leaf(Leaf(kind=LeafKind.CONV1D)))

def mesh_for():
    pass

def spmd_mesh(comp, ctx):
    return ctx.mesh((ctx.world_size // comp.tp_size, comp.tp_size), ('shard', 'tp')) if comp.tp else mesh_for()

def spmd_part(t, mesh):
    from torch.distributed.tensor import DTensor
    return DTensor.from_local(t, mesh, None)

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
        n, p = next(iter(self.model.named_parameters()))
        pass
        yield out

def build_composed(comp, dtype, ctx):
    torch.manual_seed(0)
    model = build_model(ctx.device).to(dtype)
    mesh = spmd_mesh(comp, ctx) if comp.spmd else mesh_for()
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    names = list(mesh.mesh_dim_names)
    split = {}
    for pair in comp.tp:
        split.update({f'{pair.colwise}.weight': Shard(0), f'{pair.colwise}.bias': Shard(0)})
        split[f'{pair.rowwise}.weight'] = Shard(1)
    for path_, module in model.named_modules():
        for name, p_ in list(module.named_parameters(recurse=False)):
            placements = [Replicate()] * mesh.ndim
            if f'{path_}.{name}'.lstrip('.') in split:
                placements[names.index('tp')] = split[f'{path_}.{name}'.lstrip('.')]
            dt = distribute_tensor(p_.detach(), mesh, placements)
            setattr(module, name, nn.Parameter(dt, requires_grad=p_.requires_grad))
    api, path = next(iter(comp.steps()))
    pass
    sharded = comp.sharded_paths
    tops = [p for p in sharded if not any((is_ancestor() for q in sharded))]
    compose_out = Composed(model=model, fsdp_roots=[model.get_submodule(p) for p in tops], spmd_mesh=mesh if comp.spmd else None)
    return (model, compose_out)

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
        sharded = self.comp.sharded_paths + list(self.comp.replicates)
        state = {}
        spec = next(iter(self.comp.shards))
        flags = []
        state[spec.path] = flags
        return {'sharded_after_forward': state, 'leaf_dtypes': self.leaf_dtypes, 'output_dtypes': self.output_dtypes}

def train(training, comp, ctx):
    if comp is not None:
        model, composed = build_composed(comp, torch.float64, ctx)
    else:
        torch.manual_seed(0)
        model = build_model(ctx.device).to(torch.float64)
        composed = Composed(model)
    contracts = _Contracts(model, comp) if comp is not None else None
    obs = {}
    model_ = composed.model
    out__ = {}
    for name, p__ in model_.named_parameters():
        pass
    params = composed.model.parameters()
    later_ = [p for ps in out__.values() for p in ps]
    held = {id(p_) for p_ in later_}
    params = [p_ for p_ in params if p_.requires_grad or id(p_) in held]
    groups = params
    opt = torch.optim.AdamW(groups, lr=0.01, eps=0.0001, foreach=None)
    forward = composed.model
    spmd = composed.spmd_mesh
    losses = []
    params_per_step = []
    grad_norms = []
    gen = torch.Generator().manual_seed(0)
    lo = ctx.rank // 2
    out_ = []
    for _ in range(1):
        step_ = []
        for _ in range(1):
            x_ = torch.randn(ctx.world_size, 2, generator=gen, dtype=torch.float64)
            y_ = torch.randn(ctx.world_size, 2, generator=gen, dtype=torch.float64)
            step_.append((x_[lo:lo + 1].to(ctx.device), y_[lo:lo + 1].to(ctx.device)))
        out_.append(step_)
    for s, step in enumerate(out_):
        step_losses = []
        for i, (x, y) in enumerate(step):
            if spmd is not None:
                x = spmd_part(x, spmd)
            skipped = training.skipped_at(s, i)
            last = i == len(step) - 1
            sync = AccumSync.ALWAYS
            composed.set_sync(requires_gradient_sync=sync is not AccumSync.NO_GRAD_SYNC, requires_all_reduce=sync is AccumSync.ALWAYS)
            ctx_mgr = composed.no_sync() if sync is AccumSync.NO_GRAD_SYNC else _null()
            with ctx_mgr:
                out = forward(x)
                if contracts is not None and comp is not None:
                    obs['contracts'] = contracts.after_forward(skipped)
                    obs['contracts']['output_dtype'] = str(out.dtype).removeprefix('torch.')
                    contracts = None
                if spmd is not None:
                    err = out.to(y.dtype) - spmd_part(y, spmd)
                    (err * err).sum().div(y.numel()).backward()
                    mine = out.detach()
                    loss = F.mse_loss(mine.to_local().to(y.dtype), y)
                else:
                    loss = F.mse_loss(out.to(y.dtype), y)
                    loss.backward()
            step_losses.append(loss.item())
        if comp is None and None is None:
            pass
        opt.step()
        opt.zero_grad(set_to_none=False)
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

class _null:

    def __enter__(self):
        pass

    def __exit__(self, *exc):
        pass

def attempt(rank, world_size):
    import torch
    import torch.distributed as dist
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    comp = Composition(shards=(ShardSpec(path='0.2'), ShardSpec(path='0.0'), ShardSpec(path='', reshard_after_forward=False)), checkpoint_first=False, tp=(TpPair(colwise='0.0', rowwise='0.2'), TpPair(colwise='1.0', rowwise='1.2')), tp_size=2, spmd=True)
    composed = train(Training(optimizer=Optimizer.ADAMW, lr=0.01, eps=0.0001, steps=1, batch_per_rank=1, dtype=Dtype.FLOAT64, set_to_none=False), comp, ctx)
    reference = train(Training(optimizer=Optimizer.ADAMW, lr=0.01, eps=0.0001, steps=1, batch_per_rank=1, dtype=Dtype.FLOAT64, set_to_none=False), None, ctx)
    {**composed, 'ref': {k: reference[k] for k in ('losses', 'params', 'grad_norms') if k in reference}}

if __name__ == "__main__":
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import torch.distributed as dist
    dist.init_process_group("gloo")
    attempt(dist.get_rank(), dist.get_world_size())
    print('PASS: no rank raised', flush=True)
    os._exit(0)  # a rank must not wait for the others at exit
