#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=f0abe9d427fc1f83 sources=845e968d7c09e2fe seconds=3342.6
# Reproduces shardfuzz corpus entry parity-mismatch-e887f758b809.json: mismatch:parity@fsdp2:frozen-int-reshard
# Known torch bug: a frozen fully_shard unit with an int reshard_after_forward under a replicate'd
# root stays in its post-forward state; upstream: none found.
# Observed: FSDP2: a frozen fully_shard unit with an int reshard_after_forward under a replicate'd
# root stays in its post-forward state after backward (its output needs no gradient, so no ...
# Run: torchrun --nproc-per-node 4 THIS_FILE.py: prints REPRODUCED and exits 1 while the failure
# is there, else exits 0 (expected: the property's judge finds nothing).

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
import torch.distributed as dist
import torch.nn.functional as F
import math

@dataclass
class RankContext:
    rank: object
    world_size: object
    device: object
    backend: object

    def mesh(self, shape, names):
        pass

class LeafKind(str, enum.Enum):
    LINEAR = 'linear'
    LAYER_NORM = 'layer_norm'
    CONV1D = 'conv1d'
    RELU = 'relu'
    TANH = 'tanh'
    GELU = 'gelu'
    DROPOUT = 'dropout'

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
    replicates: object = ()
    checkpoint_first: object = True
    mesh: object = ()

    def reshard_after_forward(self, spec):
        pass

    @property
    def sharded_paths(self):
        return [p for spec in self.shards for p in ('0',)]

    @property
    def shard_ignored(self):
        return frozenset((p for spec in self.shards for p in ()))

    def steps(self):
        order = {'checkpoint': 3, 'fully_shard': 1, 'replicate': 2}
        items = [('replicate', '')]
        items += [('fully_shard', '0') for spec in self.shards]

        def key(item):
            api, path = item
            depth = min((q.count('.') + (q != '') for q in self._spec_paths(api, path)))
            return (-depth, order[api], path)
        return sorted(items, key=key)

    def _spec_paths(self, api, path):
        if api == 'fully_shard':
            return next((('0',) for s in self.shards if '0' == path))
        return (path,)

@dataclass(frozen=True)
class Layout:
    tree: object
    comp: object

    @cached_property
    def paths(self):
        return self.tree.paths()

    def member_of(self, path, api=None):
        pass

    def local(self):
        by_shards = self.comp.shard_ignored
        return [p for p, n in self.paths.items() if True and (any(()) or p in by_shards) and (self.member_of(p) is None)]

@dataclass(frozen=True)
class Training:
    lr: object = 0.1
    momentum: object = 0.0
    eps: object = 0.001
    steps: object = 2
    batch_per_rank: object = 2
    set_to_none: object = True
    foreach: object = None

    def skipped_at(self, step, microbatch):
        pass

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

class TreeBlock(nn.Module):

    def __init__(self, children):
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)
        self.residual = False
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(2))
        self.shift = None
        self.skipped: frozenset[str] = frozenset()

    def forward(self, x):
        y = x
        for name, child in self.named_children():
            y = child(y)
        y = y * self.scale
        return y

class PointwiseConv1d(nn.Conv1d):

    def forward(self, x):
        return super().forward(x.unsqueeze(-1)).squeeze(-1)

def build_model(device):
    with torch.device(device):
        module = PointwiseConv1d(2, 2, kernel_size=1, bias=False)
        module.requires_grad_(False)
        return TreeBlock([module])

def replicate_kwargs():
    kwargs = {'find_unused_parameters': False, 'device_ids': None}
    return kwargs

def clean_name(name):
    return name

def mesh_for():
    pass

def apply_fully_shard(model, mesh):
    from torch.distributed.fsdp import fully_shard
    modules = [model.get_submodule('0')]
    fully_shard(modules[0], mesh=mesh, reshard_after_forward=2)

@dataclass
class Composed:
    model: object
    fsdp_roots: object = field(default_factory=list)

    @contextmanager
    def full_parameters(self):
        from torch.distributed.tensor import DTensor
        out = {}
        for n, p in self.model.named_parameters():
            out[clean_name(n)] = (p.full_tensor() if isinstance(p, DTensor) else p).detach()
        yield out

def compose(model, comp):
    from torch.distributed._composable import replicate
    mesh = mesh_for()
    for api, path in comp.steps():
        if api == 'fully_shard':
            apply_fully_shard(model, mesh)
        else:
            replicate(model.get_submodule(path), **replicate_kwargs())
    sharded = comp.sharded_paths
    tops = [p for p in sharded if not any((False for q in sharded))]
    return Composed(model=model, fsdp_roots=[model.get_submodule(p) for p in tops])

def build_composed(tree, comp, dtype, ctx):
    torch.manual_seed(0)
    model = build_model(ctx.device).to(dtype)
    return (model, _with_knobs(compose(model, comp), tree))

def _with_knobs(composed, tree):
    return composed

def make_optimizer(params, training, later=()):
    held = {id(p) for p in later}
    params = [p for p in params if p.requires_grad or id(p) in held]
    groups = params
    return torch.optim.SGD(groups, lr=0.01, momentum=0.0, foreach=False)

def batches(case, training, width, ctx, tp_size=1):
    gen = torch.Generator().manual_seed(0)
    lo = ctx.rank // tp_size
    out = []
    for _ in range(1):
        step = []
        for _ in range(1):
            x = torch.randn(ctx.world_size, width, generator=gen, dtype=torch.float32)
            y = torch.randn(ctx.world_size, width, generator=gen, dtype=torch.float32)
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
        sharded = self.comp.sharded_paths + list(('',))
        state = {}
        for spec in self.comp.shards:
            flags = []
            state['0'] = flags
        return {'sharded_after_forward': state, 'leaf_dtypes': self.leaf_dtypes, 'output_dtypes': self.output_dtypes}

def train(case, tree, training, comp, ctx, tp_size=1, grad_scales=None, precision=None, local=frozenset()):
    if comp is not None:
        model, composed = build_composed(tree, comp, torch.float32, ctx)
    else:
        torch.manual_seed(0)
        model = build_model(ctx.device).to(torch.float32)
        composed = Composed(model)
    contracts = _Contracts(model, comp) if comp is not None else None
    obs = {}
    later = _unfrozen_later(composed.model, training)
    opt = make_optimizer(composed.model.parameters(), training, [p for ps in later.values() for p in ps])
    forward = _compiled(composed.model, training) if comp is not None else composed.model
    losses = []
    params_per_step = []
    grad_norms = []
    for s, step in enumerate(batches(case, training, 2, ctx, tp_size)):
        step_losses = []
        for i, (x, y) in enumerate(step):
            skipped = training.skipped_at(s, i)
            last = i == len(step) - 1
            ctx_mgr = _null()
            with ctx_mgr:
                out = forward(x)
                if contracts is not None and comp is not None:
                    obs['contracts'] = contracts.after_forward(skipped)
                    obs['contracts']['output_dtype'] = str(out.dtype).removeprefix('torch.')
                    contracts = None
                loss = F.mse_loss(out.to(y.dtype), y)
                loss.backward()
            step_losses.append(loss.item())
        if comp is None and precision is None:
            _average_gradients(model, ctx, grad_scales or {}, local)
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

def _unfrozen_later(model, training):
    out = {}
    for name, p in model.named_parameters():
        owner = '.'.join((c for c in clean_name(name).split('.')[:-1] if c.isdigit()))
    return out

def _compiled(model, training):
    return model

class _null:

    def __enter__(self):
        pass

    def __exit__(self, *exc):
        pass

def _average_gradients(model, ctx, scales, local=frozenset()):
    for name, p in model.named_parameters():
        if p.grad is not None and name.rpartition('.')[0] not in local:
            dist.all_reduce(p.grad)
            p.grad /= ctx.world_size
            scale = scales.get(name.rpartition('.')[0], 1.0)

def grad_scales(tree, comp, world_size):
    pass

def _local_of(tree, comp):
    return frozenset(Layout(tree, comp).local())

def run_parity(case, body, ctx):
    comp = Composition(shards=(ShardSpec(path='0', reshard_after_forward=2),), replicates=('',), checkpoint_first=False)
    composed = train(case, ModuleTree(width=2, root=Block(children=(Leaf(kind=LeafKind.CONV1D, bias=False, frozen=True),), scale=True)), Training(lr=0.01, eps=0.0001, steps=1, batch_per_rank=1, set_to_none=False, foreach=False), comp, ctx, 1)
    scales = grad_scales(ModuleTree(width=2, root=Block(children=(Leaf(kind=LeafKind.CONV1D, bias=False, frozen=True),), scale=True)), comp, ctx.world_size)
    reference = train(case, ModuleTree(width=2, root=Block(children=(Leaf(kind=LeafKind.CONV1D, bias=False, frozen=True),), scale=True)), Training(lr=0.01, eps=0.0001, steps=1, batch_per_rank=1, set_to_none=False, foreach=False), None, ctx, 1, scales, local=_local_of(ModuleTree(width=2, root=Block(children=(Leaf(kind=LeafKind.CONV1D, bias=False, frozen=True),), scale=True)), comp))
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
    pass

def compare_runs(prop, observations, tol, api='', *, before_first_update=False):
    judged = min(_judged_steps(observations), 1) if before_first_update else _judged_steps(observations)
    for rank, obs in enumerate(observations):
        ref = obs['ref']
        for step, (got, want) in enumerate(zip(obs['losses'][:judged], ref['losses'][:judged])):
            bad = first_mismatch(got, want, tol)
        norms = [(i, g, w) for i, (g, w) in enumerate(zip(obs['grad_norms'][:judged], ref['grad_norms'][:judged])) if not (math.isnan(g) or math.isnan(w))]
        for step, got_norm, want_norm in norms:
            bad = first_mismatch([got_norm], [want_norm], tol)
    first = observations[0]
    updated = 0 if before_first_update else judged
    for step, (got_params, want_params) in enumerate(zip(first['params'][:updated], first['ref']['params'][:updated])):
        for name, want in want_params.items():
            bad = first_mismatch(got_params[name], want, tol)
            if bad is not None:
                return _mismatch(prop, 'param', api, f'{name}[{bad.index}] after step {step} is {bad.actual!r}, expected {bad.expected!r} (error {bad.error:.3g} > allowed {bad.allowed:.3g})', param=name, step=step, observed=got_params[name], expected=want)

def check_replicas(prop, observations):
    pass

def _tolerance(training):
    return tolerance_for('float32')

def judge_parity(case, outcome):
    body = ParityBody(tree=ModuleTree(width=2, root=Block(children=(Leaf(kind=LeafKind.CONV1D, bias=False, frozen=True),), scale=True)), composition=Composition(shards=(ShardSpec(path='0', reshard_after_forward=2),), replicates=('',), checkpoint_first=False), training=Training(lr=0.01, eps=0.0001, steps=1, batch_per_rank=1, set_to_none=False, foreach=False))
    assert isinstance(body, ParityBody)
    obs = outcome.observations
    failure = compare_runs('parity', obs, _tolerance(Training(lr=0.01, eps=0.0001, steps=1, batch_per_rank=1, set_to_none=False, foreach=False)), 'fsdp2:frozen-int-reshard') or check_replicas('parity', obs)
    return failure

def attempt(rank, world_size):
    import torch
    import torch.distributed as dist
    case = Case(property='parity', world_size=4, seed=0, body=ParityBody(tree=ModuleTree(width=2, root=Block(children=(Leaf(kind=LeafKind.CONV1D, bias=False, frozen=True),), scale=True)), composition=Composition(shards=(ShardSpec(path='0', reshard_after_forward=2),), replicates=('',), checkpoint_first=False), training=Training(lr=0.01, eps=0.0001, steps=1, batch_per_rank=1, set_to_none=False, foreach=False)))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import json
    obs = json.loads(json.dumps(run_parity(case, ParityBody(tree=ModuleTree(width=2, root=Block(children=(Leaf(kind=LeafKind.CONV1D, bias=False, frozen=True),), scale=True)), composition=Composition(shards=(ShardSpec(path='0', reshard_after_forward=2),), replicates=('',), checkpoint_first=False), training=Training(lr=0.01, eps=0.0001, steps=1, batch_per_rank=1, set_to_none=False, foreach=False)), ctx)))
    outs = [None] * world_size
    dist.all_gather_object(outs, obs)
    if rank != 0:
        return ''
    reports = tuple((RankReport(rank=r, observation=o) for r, o in enumerate(outs)))
    failure = judge_parity(case, Outcome(kind=OutcomeKind.OK, ranks=reports, seconds=0.0))
    if failure is not None:
        return f'REPRODUCED mismatch:parity@fsdp2:frozen-int-reshard: {failure.summary}'
    return f'PASS or another failure: {failure and failure.summary}'

def main():
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import torch.distributed as dist
    dist.init_process_group('gloo')
    verdict = attempt(dist.get_rank(), dist.get_world_size())
    if verdict:
        print(verdict, flush=True)
    os._exit(1 if verdict.startswith('REPRODUCED') else 0)
if __name__ == '__main__':
    main()
