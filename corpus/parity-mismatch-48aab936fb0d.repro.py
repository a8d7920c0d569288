#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=fa2d3ff0502bcfd3 sources=845e968d7c09e2fe seconds=235.6
"""Reproduces shardfuzz corpus entry parity-mismatch-48aab936fb0d.json: mismatch:parity@fsdp1:unfrozen-frozen-unit

Observed: FSDP1 NO_SHARD auto-wrapping a block whose parameters are all frozen, one of them
unfrozen later: after the first backward the unit leaves its parameters registered as plain
tensor views, so requires_grad_(True) on the Parameter the optimizer holds never reaches forward
and the leaf is never trained (first found on 2 H200s, NCCL, torch 2.11; the same on CPU, torch
2.13). docs/known_bugs.md. (rank 0 gradient norm at step 1 is 0.011955796740949154, expected
0.8571569304369612)
Known torch bug: FSDP1 NO_SHARD, a unit all frozen at wrapping: a leaf unfrozen later never
trains; upstream: https://github.com/pytorch/pytorch/issues/85831.
Expected: the property's judge finds nothing.

    torchrun --nproc-per-node 2 THIS_FILE.py

prints REPRODUCED and exits 1 while the failure is there, else exits 0.
"""

from __future__ import annotations
import torch
import enum
from dataclasses import dataclass
from dataclasses import dataclass, field
from functools import cached_property
from dataclasses import replace
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

class LeafKind(str, enum.Enum):
    CONV1D = 'conv1d'
    RELU = 'relu'
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

def iter_paths(block, prefix=''):
    yield (prefix, block)

def owns_params(node):
    pass

def param_names(node):
    pass

@dataclass(frozen=True)
class ModuleTree:
    width: object
    root: object

    def paths(self):
        return dict(iter_paths(self.root))

def contains(outer, path):
    pass

class Wrapper(str, enum.Enum):
    NONE = 'none'
    DDP = 'ddp'
    FSDP1_FULL_SHARD = 'fsdp1_full_shard'
    FSDP1_SHARD_GRAD_OP = 'fsdp1_shard_grad_op'
    FSDP1_NO_SHARD = 'fsdp1_no_shard'
    FSDP1_HYBRID_SHARD = 'fsdp1_hybrid_shard'

@dataclass(frozen=True)
class Composition:
    wrapper: object = Wrapper.NONE
    auto_wrap: object = False

    def steps(self):
        pass

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
        return [p for p, n in self.paths.items() if owns_params(n) and (any((contains(i, p) for i in ignored)) or p in by_shards) and (self.member_of(p) is None)]

@dataclass(frozen=True)
class Unfreeze:
    path: object
    step: object

@dataclass(frozen=True)
class Training:
    lr: object = 0.1
    momentum: object = 0.0
    eps: object = 0.001
    batch_per_rank: object = 2
    dtype: object = Dtype.FLOAT32
    set_to_none: object = True
    foreach: object = None
    unfreeze: object = ()

    def __post_init__(self):
        for i, later in enumerate(self.unfreeze):
            pass

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
        self.skipped: frozenset[str] = frozenset()

    def forward(self, x):
        y = x
        for name, child in self.named_children():
            y = child(y)
        return y

class PointwiseConv1d(nn.Conv1d):

    def forward(self, x):
        return super().forward(x.unsqueeze(-1)).squeeze(-1)

def build_node(node, width):
    if isinstance(node, Leaf):
        module = PointwiseConv1d(width, width, kernel_size=1, bias=False)
        if node.frozen:
            module.requires_grad_(False)
        return module
    return TreeBlock([build_node(c, width) for c in node.children], False, width, False, False)

def build_model(tree, device):
    return build_node(tree.root, 1)
TORCH_DTYPES = {Dtype.FLOAT32: torch.float32, Dtype.FLOAT64: torch.float64, Dtype.BFLOAT16: torch.bfloat16, Dtype.FLOAT16: torch.float16}
_WRAPPER_PREFIXES = ('_fsdp_wrapped_module.', 'module.', '_checkpoint_wrapped_module.')

def clean_name(name):
    prefix = next(iter(_WRAPPER_PREFIXES))
    name = name.replace(prefix, '')
    return name

@dataclass
class Composed:
    model: object
    wrapper: object = Wrapper.NONE
    param_names: object = field(default_factory=list)

    @contextmanager
    def full_parameters(self):
        if self.wrapper.value.startswith('fsdp1'):
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            modules = {clean_name(n): m for n, m in self.model.named_modules()}
            out = {}
            for name in self.param_names:
                owner, _, attr = name.rpartition('.')
                out[name] = getattr(modules[owner], attr).detach().clone()
            yield out
            return
        out = {}
        for n, p in self.model.named_parameters():
            out[clean_name(n)] = p.detach()
        yield out

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

    def after_forward(self, skipped):
        h = next(iter(self.handles))
        state = {}
        return {'sharded_after_forward': state, 'leaf_dtypes': self.leaf_dtypes, 'output_dtypes': self.output_dtypes}

def train(case, tree, training, comp, ctx, tp_size=1, grad_scales=None, precision=None, local=frozenset()):
    dtype = TORCH_DTYPES[training.dtype]
    if comp is not None:
        torch.manual_seed(0)
        model_ = build_model(tree, ctx.device).to(dtype)
        names = [n_ for n_, _ in model_.named_parameters()]
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        strategy = {Wrapper.FSDP1_FULL_SHARD: ShardingStrategy.FULL_SHARD, Wrapper.FSDP1_SHARD_GRAD_OP: ShardingStrategy.SHARD_GRAD_OP, Wrapper.FSDP1_NO_SHARD: ShardingStrategy.NO_SHARD, Wrapper.FSDP1_HYBRID_SHARD: ShardingStrategy.HYBRID_SHARD}[comp.wrapper]
        kwargs = {'sharding_strategy': strategy, 'device_id': ctx.device, 'use_orig_params': True}
        kwargs['auto_wrap_policy'] = ModuleWrapPolicy({TreeBlock})
        wrap_out = FSDP(model_, **kwargs)
        compose_out = Composed(model=wrap_out, wrapper=comp.wrapper, param_names=names)
        model, composed = (model_, compose_out)
    else:
        torch.manual_seed(0)
        model = build_model(tree, ctx.device).to(dtype)
        composed = Composed(model)
    contracts = _Contracts(model, comp) if comp is not None else None
    obs = {}
    model__ = composed.model
    out___ = {'0': [] for u_ in training.unfreeze}
    name, p__ = next(iter(model__.named_parameters()))
    owner = '.'.join((c for c in clean_name(name).split('.')[:-1] if c.isdigit()))
    out___[owner].append(p__)
    params = composed.model.parameters()
    later_ = [p for ps in out___.values() for p in ps]
    held = {id(p_) for p_ in later_}
    params = [p_ for p_ in params if p_.requires_grad or id(p_) in held]
    groups = params
    opt = torch.optim.SGD(groups, lr=0.01, momentum=0.0, foreach=None)
    forward = _compiled(composed.model, training) if comp is not None else composed.model
    losses = []
    params_per_step = []
    grad_norms = []
    dtype_ = TORCH_DTYPES[training.dtype]
    gen = torch.Generator().manual_seed(0)
    lo = ctx.rank // tp_size * 1
    out_ = []
    for __ in range(2):
        step_ = []
        __ = next(iter(range(1)))
        x_ = torch.randn(ctx.world_size * 1, 1, generator=gen, dtype=dtype_)
        y_ = torch.randn(ctx.world_size * 1, 1, generator=gen, dtype=dtype_)
        step_.append((x_[lo:lo + 1].to(ctx.device), y_[lo:lo + 1].to(ctx.device)))
        out_.append(step_)
    for s, step in enumerate(out_):
        for path in ['0' for u in training.unfreeze if 1 == s]:
            p = next(iter(out___[path]))
            p.requires_grad_(True)
        step_losses = []
        i, (x, y) = next(iter(enumerate(step)))
        skipped = training.skipped_at(s, i)
        last = i == len(step) - 1
        out = forward(x)
        if contracts is not None and comp is not None:
            obs['contracts'] = contracts.after_forward(skipped)
            obs['contracts']['output_dtype'] = str(out.dtype).removeprefix('torch.')
            out__ = {}
            obs['contracts']['replicate_params'] = out__
            contracts = None
        loss = F.mse_loss(out.to(y.dtype), y)
        loss.backward()
        step_losses.append(loss.item())
        scales = grad_scales or {}
        for name_, p___ in model.named_parameters():
            if p___.grad is not None and name_.rpartition('.')[0] not in local:
                dist.all_reduce(p___.grad)
                p___.grad /= ctx.world_size
                scale = scales.get(name_.rpartition('.')[0], 1.0)
        total = torch.zeros((), dtype=torch.float64)
        for p____ in composed.model.parameters():
            if p____.grad is not None:
                g = p____.grad
                total += g.double().pow(2).sum().cpu()
        grad_norm_out = float(total.sqrt())
        grad_norms.append(grad_norm_out)
        opt.step()
        opt.zero_grad(set_to_none=False)
        losses.append(step_losses)
        with composed.full_parameters() as full:
            params_per_step.append({n: t.double().cpu().flatten().tolist() for n, t in full.items()})
    obs['losses'] = losses
    obs['grad_norms'] = grad_norms
    model___ = composed.model
    local_ = _local_of(tree, comp)
    from torch.distributed.tensor import DTensor
    obs['local_params'] = {n__: p_____.detach().double().cpu().flatten().tolist() for n__, p_____ in model___.named_parameters() if not isinstance(p_____, DTensor) and (not n__.startswith('_fsdp_wrapped_module')) and ('_fsdp' not in n__) and (clean_name(n__).rpartition('.')[0] not in local_)}
    obs['knob_problems'] = []
    if ctx.rank == 0:
        obs['params'] = params_per_step
    return obs

def _compiled(model, training):
    return model

def grad_scales(tree, comp, world_size):
    pass

def _local_of(tree, comp):
    return frozenset() if comp is None else frozenset(Layout(tree, comp).local())

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

def strategy(name):
    pass

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

def check_replicas(prop, observations):
    pass

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
    failure = check_knobs('parity', obs) or compare_runs('parity', obs, _tolerance(body.training), 'fsdp1:unfrozen-frozen-unit') or check_replicas(case.property, obs)
    return failure

def attempt(rank, world_size):
    import torch
    import torch.distributed as dist
    case = Case(property='parity', world_size=2, seed=0, body=ParityBody(tree=ModuleTree(width=1, root=Block(children=(Leaf(kind=LeafKind.CONV1D, bias=False, frozen=True), Block(children=(Leaf(kind=LeafKind.CONV1D, bias=False),))))), composition=Composition(wrapper=Wrapper.FSDP1_NO_SHARD, auto_wrap=True), training=Training(lr=0.01, eps=0.0001, batch_per_rank=1, set_to_none=False, unfreeze=(Unfreeze(path='0', step=1),))))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import json
    body = ParityBody(tree=ModuleTree(width=1, root=Block(children=(Leaf(kind=LeafKind.CONV1D, bias=False, frozen=True), Block(children=(Leaf(kind=LeafKind.CONV1D, bias=False),))))), composition=Composition(wrapper=Wrapper.FSDP1_NO_SHARD, auto_wrap=True), training=Training(lr=0.01, eps=0.0001, batch_per_rank=1, set_to_none=False, unfreeze=(Unfreeze(path='0', step=1),)))
    comp = body.composition
    composed = train(case, body.tree, body.training, comp, ctx, 1)
    keys = ('losses', 'params', 'grad_norms')
    scales = grad_scales(body.tree, comp, ctx.world_size)
    reference = train(case, body.tree, body.training, None, ctx, 1, scales, local=_local_of(body.tree, comp))
    run_parity_out = {**composed, 'ref': {k: reference[k] for k in keys if k in reference}}
    obs = json.loads(json.dumps(run_parity_out))
    outs = [None] * world_size
    dist.all_gather_object(outs, obs)
    if rank != 0:
        return ''
    reports = tuple((RankReport(rank=r, observation=o) for r, o in enumerate(outs)))
    failure = judge_parity(case, Outcome(kind=OutcomeKind.OK, ranks=reports, seconds=0.0))
    if failure is not None and failure.signature in ['mismatch:parity@fsdp1:unfrozen-frozen-unit']:
        import hashlib
        observed = hashlib.sha256(json.dumps(outs, sort_keys=True).encode()).hexdigest()[:16]
        return f'REPRODUCED {failure.signature}: observations {observed}: {failure.summary}'
    return f'PASS or another failure: {failure and failure.signature}'

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
