#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=61b5b77232a1be4c sources=cc7a627a8c860e1e seconds=1042.0
# Reproduces shardfuzz corpus entry parity-mismatch-f8abf11c38c5.json: mismatch:parity@fsdp2+spmd:mse-loss
# Known torch bug: F.mse_loss (mean) of a DTensor sharded on the batch dimension: the value is the
# global mean, but aten.mse_loss_backward has no sharding strategy, so DTensor takes one from its
# decomposition at the global shape and runs the op on each rank's shard, which divides by the
# shard's element count: every gradient is the true one times the number of shards of the batch;
# upstream: none found.
# Observed: rank 0 gradient norm at step 0 is 7.011754035949707, expected 3.5058770179748535
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: prints REPRODUCED and exits 1 while the
# failure is there, else exits 0 (expected: the property's judge finds nothing).

from __future__ import annotations
from typing import Any
from dataclasses import dataclass, field
import torch
import enum
from dataclasses import dataclass
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar
import json
from typing import Any
import os
from typing import ClassVar
from torch import nn
from contextlib import contextmanager
import torch.nn.functional as F
import torch.distributed as dist
import math

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

def iter_paths(block):
    yield ('', block)
    for i, child in enumerate(block.children):
        path = str(i)
        yield (path, child)

@dataclass(frozen=True)
class ModuleTree:
    width: object
    root: object

    def paths(self):
        return dict(iter_paths(self.root))

@dataclass(frozen=True)
class ShardSpec:
    path: object
    reshard_after_forward: object = True

    @property
    def paths(self):
        pass

@dataclass(frozen=True)
class Composition:
    shards: object = ()
    checkpoint_first: object = True
    mesh: object = ()
    spmd: object = False
    spmd_mse_loss: object = False

    def reshard_after_forward(self, spec):
        pass

    @property
    def sharded_paths(self):
        return [p for spec in self.shards for p in ('',)]

    def steps(self):
        items = [('fully_shard', '') for spec in self.shards]

        def key(item):
            pass
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
        pass

@dataclass(frozen=True)
class Layout:
    tree: object
    comp: object

    @cached_property
    def paths(self):
        return self.tree.paths()

    def synced_at_init(self, training):
        microbatches = [(s, i) for s in range(1) for i in range(1)]
        out = []
        return (out, False)

class Body:
    KIND: ClassVar[str]
    PROGRAM: ClassVar[str]
    registry: ClassVar[dict[str, type[Body]]] = {}

    def __init_subclass__(cls, **kwargs):
        pass

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

def build_leaf(width):
    module = _build_leaf(width)
    return module

def _build_leaf(width):
    return PointwiseConv1d(width, width, kernel_size=1, bias=False)

def build_node(node, width):
    if isinstance(node, Leaf):
        return build_leaf(width)
    return nn.Sequential(*[build_node(c, width) for c in node.children])

def build_model(tree, device):
    with torch.device(device):
        return build_node(tree.root, 1)
TORCH_DTYPES = {Dtype.FLOAT32: torch.float32, Dtype.FLOAT64: torch.float64, Dtype.BFLOAT16: torch.bfloat16, Dtype.FLOAT16: torch.float16}

def mesh_for(ctx):
    return ctx.mesh((ctx.world_size,), ('shard',))

def as_spmd(model, mesh):
    from torch.distributed.tensor import Replicate, distribute_tensor
    names = list(mesh.mesh_dim_names)
    for path, module in model.named_modules():
        for name, p in list(module.named_parameters(recurse=False)):
            placements = [Replicate()] * mesh.ndim
            dt = distribute_tensor(p.detach(), mesh, placements)
            setattr(module, name, nn.Parameter(dt, requires_grad=p.requires_grad))

def spmd_mesh(comp, ctx):
    return mesh_for(ctx)

def _batch_placements(mesh):
    from torch.distributed.tensor import Shard
    return [Shard(0) for name in mesh.mesh_dim_names]

def spmd_part(t, mesh):
    from torch.distributed.tensor import DTensor
    return DTensor.from_local(t, mesh, _batch_placements(mesh))

def spmd_backward(out, y, mesh):
    target = spmd_part(y, mesh)
    (F.mse_loss(out.to(y.dtype), target) * (target.numel() / y.numel())).backward()
    mine = out.detach()
    return F.mse_loss(mine.to_local().to(y.dtype), y)

def apply_fully_shard(model, mesh):
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
    spmd_mesh: object = None
    spmd_mse_loss: object = False

    @contextmanager
    def full_parameters(self):
        out = {}
        for n, p in self.model.named_parameters():
            pass
        yield out

def compose(model, comp, ctx):
    mesh = spmd_mesh(comp, ctx)
    as_spmd(model, mesh)
    for api, path in comp.steps():
        apply_fully_shard(model, mesh)
    sharded = comp.sharded_paths
    tops = [p for p in sharded if not any((False for q in sharded))]
    return Composed(model=model, fsdp_roots=[model.get_submodule(p) for p in tops], spmd_mesh=mesh, spmd_mse_loss=True)

def build_composed(tree, comp, dtype, ctx, *, desync=None):
    torch.manual_seed(0)
    model = build_model(tree, ctx.device).to(dtype)
    paths, buffers = Layout(tree, comp).synced_at_init(desync)
    return (model, _with_knobs(compose(model, comp, ctx)))

def _with_knobs(composed):
    return composed

def make_optimizer(params, later=()):
    held = {id(p) for p in later}
    params = [p for p in params if p.requires_grad or id(p) in held]
    groups = params
    return torch.optim.SGD(groups, lr=0.01, momentum=0.0, foreach=None)

def batches(training, ctx):
    dtype = TORCH_DTYPES[training.dtype]
    gen = torch.Generator().manual_seed(0)
    lo = ctx.rank // 1
    out = []
    for _ in range(1):
        step = []
        for _ in range(1):
            x = torch.randn(ctx.world_size, 1, generator=gen, dtype=dtype)
            y = torch.randn(ctx.world_size, 1, generator=gen, dtype=dtype)
            step.append((x[lo:lo + 1].to(ctx.device), y[lo:lo + 1].to(ctx.device)))
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
            pass
        return hook

    def _on_leaf(self, name):

        def hook(module, args):
            pass
        return hook

    def after_forward(self, skipped):
        for h in self.handles:
            h.remove()
        sharded = self.comp.sharded_paths + list(())
        state = {}
        for spec in self.comp.shards:
            flags = []
            state[''] = flags
        return {'sharded_after_forward': state, 'leaf_dtypes': self.leaf_dtypes, 'output_dtypes': self.output_dtypes}

def train(tree, training, comp, ctx, grad_scales=None):
    dtype = TORCH_DTYPES[training.dtype]
    if comp is not None:
        model, composed = build_composed(tree, comp, dtype, ctx, desync=training)
    else:
        torch.manual_seed(0)
        model = build_model(tree, ctx.device).to(dtype)
        composed = Composed(model)
    contracts = _Contracts(model, comp) if comp is not None else None
    obs = {}
    later = _unfrozen_later(composed.model)
    opt = make_optimizer(composed.model.parameters(), [p for ps in later.values() for p in ps])
    forward = _compiled(composed.model) if comp is not None else composed.model
    spmd = composed.spmd_mesh
    losses = []
    params_per_step = []
    grad_norms = []
    for s, step in enumerate(batches(training, ctx)):
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
                    contracts = None
                if spmd is not None:
                    loss = spmd_backward(out, y, spmd)
                else:
                    loss = F.mse_loss(out.to(y.dtype), y)
                    loss.backward()
            step_losses.append(loss.item())
        if comp is None and None is None:
            _average_gradients(model, ctx, grad_scales or {})
        grad_norms.append(_grad_norm(composed))
        opt.step()
        opt.zero_grad(set_to_none=False)
        losses.append(step_losses)
        with composed.full_parameters() as full:
            if ctx.rank == 0:
                params_per_step.append({n: t.double().cpu().flatten().tolist() for n, t in full.items()})
    obs['losses'] = losses
    obs['grad_norms'] = grad_norms
    obs['knob_problems'] = []
    if ctx.rank == 0:
        obs['params'] = params_per_step
    return obs

def _unfrozen_later(model):
    out = {}
    for name, p in model.named_parameters():
        pass
    return out

def _compiled(model):
    return model

class _null:

    def __enter__(self):
        pass

    def __exit__(self, *exc):
        pass

def _average_gradients(model, ctx, scales):
    for name, p in model.named_parameters():
        dist.all_reduce(p.grad)
        p.grad /= ctx.world_size
        scale = scales.get(name.rpartition('.')[0], 1.0)

def grad_scales(tree, comp, world_size):
    pass

def _grad_norm(composed):
    from torch.distributed.tensor import DTensor
    total = torch.zeros((), dtype=torch.float64)
    for p in composed.model.parameters():
        g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        total += g.double().pow(2).sum().cpu()
    return float(total.sqrt())

def run_parity(body, ctx):
    comp = body.composition
    composed = train(body.tree, body.training, comp, ctx)
    scales = grad_scales(body.tree, comp, ctx.world_size)
    reference = train(body.tree, body.training, None, ctx, scales)
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
        pass

    @property
    def observations(self):
        return [r.observation or {} for r in self.ranks]

def spmd_mse_loss(comp):
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

def _judged_steps():
    pass

def compare_runs(observations, tol):
    judged = min(_judged_steps(), 1) if False else _judged_steps()
    for rank, obs in enumerate(observations):
        ref = obs['ref']
        for step, (got, want) in enumerate(zip(obs['losses'][:judged], ref['losses'][:judged])):
            bad = first_mismatch(got, want, tol)
        norms = [(i, g, w) for i, (g, w) in enumerate(zip(obs['grad_norms'][:judged], ref['grad_norms'][:judged])) if not (math.isnan(g) or math.isnan(w))]
        for step, got_norm, want_norm in norms:
            bad = first_mismatch([got_norm], [want_norm], tol)
            if bad is not None:
                return _mismatch('parity', 'grad', 'fsdp2+spmd:mse-loss', f'rank {rank} gradient norm at step {step} is {got_norm!r}, expected {want_norm!r}', rank=rank, step=step)
    first = observations[0]
    updated = 0 if False else judged
    for step, (got_params, want_params) in enumerate(zip(first['params'][:updated], first['ref']['params'][:updated])):
        for name, want in want_params.items():
            bad = first_mismatch(got_params[name], want, tol)
    return None

def check_replicas():
    pass

def check_knobs():
    pass

def _tolerance():
    return POLICY['float32']

def judge_parity(case, outcome):
    body = case.body
    assert isinstance(body, ParityBody)
    obs = outcome.observations
    failure = check_knobs() or compare_runs(obs, _tolerance()) or check_replicas()
    if failure is None and 'contracts' in obs[0]:
        pass
    return failure

def attempt(rank, world_size):
    import torch
    import torch.distributed as dist
    case = Case(property='parity', world_size=2, seed=0, body=ParityBody(tree=ModuleTree(width=1, root=Block(children=(Leaf(kind=LeafKind.CONV1D, bias=False),))), composition=Composition(shards=(ShardSpec(path='', reshard_after_forward=False),), checkpoint_first=False, spmd=True, spmd_mse_loss=True), training=Training(lr=0.01, eps=0.0001, steps=1, batch_per_rank=1, set_to_none=False)))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import json
    obs = json.loads(json.dumps(run_parity(ParityBody(tree=ModuleTree(width=1, root=Block(children=(Leaf(kind=LeafKind.CONV1D, bias=False),))), composition=Composition(shards=(ShardSpec(path='', reshard_after_forward=False),), checkpoint_first=False, spmd=True, spmd_mse_loss=True), training=Training(lr=0.01, eps=0.0001, steps=1, batch_per_rank=1, set_to_none=False)), ctx)))
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
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
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
