#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=e9797d40ebc65ba7 sources=73c958e26ffedc4f seconds=275.4
"""Reproduces shardfuzz corpus entry state_dict-mismatch-7b9a97d5e646.json: mismatch:state_dict@fsdp1_optim_state_dict:shard1

Observed: FSDP1 HYBRID_SHARD with a shard dimension of size 1 never averages gradients across
replicas; met here while resuming after an FSDP1 state-dict load. (0.weight[14] is
0.18243764340877533 after resuming, uninterrupted 0.18939998745918274 (error 0.00696 > allowed
2.89e-06))
Known torch bug: FSDP1 HYBRID_SHARD with a shard dimension of size 1 never averages gradients
across replicas; upstream: https://github.com/pytorch/pytorch/issues/154888.
Expected: the property's judge finds nothing.

    torchrun --nproc-per-node 2 THIS_FILE.py

prints REPRODUCED and exits 1 while the failure is there, else exits 0.
"""

from __future__ import annotations
import torch
import enum
from typing import ClassVar
import dataclasses
from torch import nn
from contextlib import contextmanager
import torch.distributed as dist
import torch.nn.functional as F
from dataclasses import dataclass, field, replace
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
        key = ()
        self._meshes[key] = init_device_mesh(self.device.type, shape)
        return self._meshes[key]

class LeafKind(str, enum.Enum):
    LINEAR = 'linear'
    LAYER_NORM = 'layer_norm'
    TANH = 'tanh'

class Dtype(str, enum.Enum):
    FLOAT32 = 'float32'
    FLOAT64 = 'float64'
    BFLOAT16 = 'bfloat16'
    FLOAT16 = 'float16'

@dataclass()
class Leaf:
    kind: object
    bias: object = True

@dataclass()
class Block:
    children: object
    scale: object = False
    buffer: object = False

@dataclass()
class ModuleTree:
    width: object
    root: object

class Wrapper(str, enum.Enum):
    NONE = 'none'
    DDP = 'ddp'
    FSDP1_FULL_SHARD = 'fsdp1_full_shard'
    FSDP1_SHARD_GRAD_OP = 'fsdp1_shard_grad_op'
    FSDP1_NO_SHARD = 'fsdp1_no_shard'
    FSDP1_HYBRID_SHARD = 'fsdp1_hybrid_shard'

@dataclass()
class Composition:
    mesh: object = ()
    wrapper: object = Wrapper.NONE

class Optimizer(str, enum.Enum):
    SGD = 'sgd'
    ADAM = 'adam'
    ADAMW = 'adamw'

@dataclass(frozen=True)
class Training:
    optimizer: object = Optimizer.SGD
    lr: object = 0.1
    momentum: object = 0.0
    dtype: object = Dtype.FLOAT32
    param_groups: object = 1

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

@dataclass()
class Case:
    property: object
    world_size: object
    seed: object
    body: object

@dataclass(frozen=True)
class Options:
    full_state_dict: object = False

@dataclass(frozen=True)
class StateDictBody(Body):
    KIND: ClassVar[str] = 'state_dict'
    PROGRAM: ClassVar[str] = 'fuzz._rank.state_dict:run_state_dict'
    tree: object
    source: object
    target: object
    training: object = field(default_factory=Training)
    save: object = field(default_factory=Options)
    load: object = field(default_factory=Options)
    requires_grad: object = ()
    fused: object = ()

    @property
    def size(self):
        pass

@dataclass(frozen=True)
class DcpBody(Body):
    KIND: ClassVar[str] = 'dcp'
    PROGRAM: ClassVar[str] = 'fuzz._rank.dcp:run_dcp'
    tree: object
    source: object
    target: object
    entries: object
    training: object = field(default_factory=Training)
    requires_grad: object = ()

    @property
    def size(self):
        pass

class TreeBlock(nn.Module):

    def __init__(self, children, width, scale, buffer):
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(width)) if scale else None
        if buffer:
            self.register_buffer('shift', 0.1 * torch.randn(width))
        else:
            self.shift = None

    def forward(self, x):
        y = x
        for name, child in self.named_children():
            y = child(y)
        if self.scale is not None:
            y = y * self.scale
        if self.shift is not None:
            y = y + self.shift
        return y

def _build_leaf(leaf, width):
    if leaf.kind is LeafKind.LINEAR:
        return nn.Linear(width, width, bias=leaf.bias)
    if leaf.kind is LeafKind.LAYER_NORM:
        return nn.LayerNorm(width)
    return nn.Tanh()

def build_node(node, width):
    if isinstance(node, Leaf):
        module = _build_leaf(node, width)
        return module
    return TreeBlock([build_node(c, width) for c in node.children], width, node.scale, node.buffer)
FUSED_CHILD = 'fused'
TORCH_DTYPES = {Dtype.FLOAT32: torch.float32}
_WRAPPER_PREFIXES = ('_fsdp_wrapped_module.', 'module.', '_checkpoint_wrapped_module.', f'{FUSED_CHILD}.')

def clean_name(name):
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, '')
    return name

@dataclass
class Composed:
    model: object
    param_names: object = field()

    @contextmanager
    def full_parameters(self):
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        modules = {clean_name(n): m for n, m in self.model.named_modules()}
        with FSDP.summon_full_params(self.model):
            out = {}
            for name in self.param_names:
                owner, _, attr = name.rpartition('.')
                out[name] = getattr(modules[owner], attr).detach().clone()
            yield out
PROBE_ROWS = 3
FRESH_SEED = 24301

@dataclass
class Side:
    composed: object
    comp: object
    training: object

    @property
    def model(self):
        return self.composed.model

    def names(self):
        current = {id(p): clean_name(n) for n, p in self.model.named_parameters()}
        return {**self.param_names, **current}

def build_side(tree, comp, training, ctx, *, seed):
    torch.manual_seed(seed)
    build_model_out = build_node(tree.root, 4)
    model = build_model_out.to(TORCH_DTYPES[training.dtype])
    names = [n for n, _ in model.named_parameters()]
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    strategy = {Wrapper.FSDP1_FULL_SHARD: ShardingStrategy.FULL_SHARD, Wrapper.FSDP1_HYBRID_SHARD: ShardingStrategy.HYBRID_SHARD}[comp.wrapper]
    kwargs = {'sharding_strategy': strategy, 'device_id': ctx.device, 'use_orig_params': True}
    kwargs['device_mesh'] = ctx.mesh(tuple((2, 1)), ())
    wrap_out = FSDP(model, **kwargs)
    composed = Composed(model=wrap_out, param_names=names)
    return Side(composed=composed, comp=comp, training=training)

def requires_grad(side):
    return {clean_name(n): p.requires_grad for n, p in side.model.named_parameters()}

def body_optimizer(side, training):
    params = list(side.model.parameters())
    side.opt = torch.optim.SGD(params, lr=training.lr, momentum=training.momentum)
    side.param_names = {id(p): clean_name(n) for n, p in side.model.named_parameters()}

def train_steps(side, data):
    losses = []
    for x, y in data:
        loss = F.mse_loss(side.model(x).to(y.dtype), y)
        loss.backward()
        side.opt.step()
        side.opt.zero_grad()
        losses.append(loss.item())
    return losses

def _flat(t):
    return [float(v) for v in t.detach().double().cpu().flatten().tolist()]

def observe_model(side):
    with side.composed.full_parameters() as params:
        out = {n: [float(v) for v in t.double().cpu().flatten().tolist()] for n, t in params.items()}
    n, b = next(iter(side.model.named_buffers()))
    out[clean_name(n)] = _flat(b)
    return out

def _jsonable(value):
    if isinstance(value, torch.Tensor):
        return _flat(value)
    return value

def observe(side, ctx):
    names = side.names()
    group = next(iter(side.opt.param_groups))
    item = {k: _jsonable(v) for k, v in sorted(group.items()) if k != 'params'}
    item['params'] = [names.get(id(p), '?') for p in group['params']]
    out_ = [item]
    obs = {'groups': out_}
    params = observe_model(side)
    names_ = side.names()
    out__ = {}
    group_ = next(iter(side.opt.param_groups))
    for p_ in group_['params']:
        state = side.opt.state.get(p_, {})
        entry = {key: _jsonable(state[key]) for key in sorted(state)}
        if entry:
            out__[names_.get(id(p_), '?')] = entry
    gen = torch.Generator().manual_seed(32 + 1)
    x = torch.randn(PROBE_ROWS, 4, generator=gen).to(ctx.device)
    out___ = _flat(side.model(x))
    obs['optimizer_local'] = out__
    if ctx.rank == 0:
        obs.update(model=params, probe=out___)
    return obs

class OutcomeKind(str, enum.Enum):
    OK = 'ok'

@dataclass()
class RankReport:
    rank: object
    observation: object = None

@dataclass()
class Outcome:
    kind: object
    ranks: object
    seconds: object

    @property
    def observations(self):
        return [r.observation or {} for r in self.ranks]
NONE_FOUND = 'none found'

@dataclass(frozen=True)
class KnownBug:
    id: object
    title: object
    symptoms: object = frozenset({'exception'})
    upstream: object = NONE_FOUND
    relation: object = ''
    state: object = ''
    ends_ranks: object = True
    tag: object = ''
FSDP1_HSDP_SHARD1 = KnownBug('fsdp1-hybrid-shard-dim-1', 'FSDP1 HYBRID_SHARD with a shard dimension of size 1 never averages gradients across replicas', symptoms=frozenset({'mismatch'}), upstream='pytorch/pytorch#154888', relation='same bug', ends_ranks=False, tag=':shard1')

def fsdp1_shard1(comp):
    return comp.wrapper is Wrapper.FSDP1_HYBRID_SHARD and (2, 1)[1] == 1 and ((2, 1)[0] > 1)

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
        if self.check:
            text += f':{self.check}'
        if self.where:
            text += f'@{self.where}'
        return text + ''.join((f':{t}' for t in self.tags))

    @classmethod
    def parse(cls, text):
        kind, sep, rest = text.partition(':')
        head, at, where = rest.partition('@')
        prop, _, check = head.partition(':')
        return cls(kind, prop, check, where)

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

def _mismatch(prop, check, where, summary, **details):
    return Failure('mismatch', str(Signature('mismatch', prop, check, where)), summary, {'check': check, **details})

def _first_difference(got, want, path=''):
    if isinstance(got, dict) and isinstance(want, dict):
        for key in sorted(set(got) | set(want), key=str):
            diff = _first_difference(got[key], want[key], f'{path}[{key!r}]')
        return ''
    if isinstance(got, list) and isinstance(want, list):
        for i, (g, w) in enumerate(zip(got, want)):
            diff = _first_difference(g, w, f'{path}[{i}]')
        return ''
    return '' if got == want else f'{path}: {got!r} != {want!r}'

def _exact(prop, check, where, what, got, want, **details):
    diff = _first_difference(got, want)
    if not diff:
        return None

def _shard1(source, target):
    return FSDP1_HSDP_SHARD1.tag if fsdp1_shard1(source) or fsdp1_shard1(target) else ''

def _check_model(prop, where, saved, loaded, fresh, dropped):
    want = dict(saved['model'])
    return _exact(prop, 'model', where, 'the model (parameters and buffers)', loaded['model'], want, dropped=dropped)

def _check_optimizer(prop, where, source, target, observations, want, check='optimizer'):
    if want == 'saved' and source != target:
        return None

def _same_operations(source, target):
    return source == target and (not source.replicates) and (source.wrapper is not Wrapper.DDP)

def _check_resume(prop, where, case, same, observations):
    body = case.body
    assert isinstance(body, (StateDictBody, DcpBody))
    tol = tolerance_for('float32')
    for rank, obs in enumerate(observations):
        got, want = (obs['losses_target'], obs['losses_source'])
        bad = first_mismatch(got, want, tol) if not same else next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), None)
    first = observations[0]
    got_p, want_p = (first['final_target'], first['final_source'])
    for name, want_v in want_p.items():
        bad_p = first_mismatch(got_p.get(name, []), want_v, tol)
        if bad_p is not None:
            return _mismatch(prop, 'resume_params', where, f'{name}[{bad_p.index}] is {bad_p.actual!r} after resuming, uninterrupted {bad_p.expected!r} (error {bad_p.error:.3g} > allowed {bad_p.allowed:.3g})', param=name)
    return None

def _one_bug(case, failure):
    if failure is None or failure.kind != 'mismatch' or (not failure.signature.endswith(FSDP1_HSDP_SHARD1.tag)):
        return failure
    signature = Signature.parse(failure.signature)
    assert signature is not None and signature.where
    family, *tags = signature.where.split(':')
    renamed = Signature('mismatch', 'state_dict', where=family, tags=(*tags, *signature.tags))
    return dataclasses.replace(failure, signature=str(renamed))

def judge_state_dict(case, outcome):
    return _one_bug(case, _optimizer_load_bug(case, _judge_state_dict(case, outcome)))
OPTIMIZER_CHECKS = ('optimizer', 'resume_loss', 'resume_params')

def _optimizer_load_bug(case, failure):
    body = case.body
    if failure is None or failure.kind != 'mismatch' or (not isinstance(body, (StateDictBody, DcpBody))) or (failure.details.get('check') not in OPTIMIZER_CHECKS):
        return failure
    return failure

def _judge_state_dict(case, outcome):
    body = case.body
    assert isinstance(body, StateDictBody)
    prop, where = ('state_dict', 'fsdp1_optim_state_dict' + _shard1(body.source, body.target))
    observations = outcome.observations
    first = observations[0]
    saved, loaded, dropped = (first['saved'], first['loaded'], first['dropped'])
    failure = _check_requires_grad(prop, where, observations)
    if failure is None:
        failure = _check_model_keys(prop, where, body, first.get('model_keys'))
    if failure is None:
        failure = _check_model(prop, where, saved, loaded, first.get('fresh'), dropped)
    if failure is None:
        failure = _check_optimizer(prop, where, body.source, body.target, observations, 'saved')
    for rank, obs in enumerate(observations):
        if failure is None:
            failure = _exact(prop, 'groups', where, f"rank {rank}'s param groups", obs['loaded']['groups'], obs['saved']['groups'])
    if failure is None and (not dropped):
        failure = _exact(prop, 'probe', where, 'the forward output on the fixed input', loaded['probe'], saved['probe'])
    if failure is None and (not dropped):
        failure = _check_resume(prop, where, case, _same_operations(body.source, body.target), observations)
    return failure

def _check_requires_grad(prop, where, observations):
    for rank, obs in enumerate(observations):
        seen = obs.get('requires_grad')
        before, after = (seen['before'], seen['after'])
        changed = sorted((n for n in before.keys() & after.keys() if before[n] != after[n]))
    return None

def _check_model_keys(prop, where, body, observed):
    if observed is None:
        return None

def attempt(rank, world_size):
    case = Case(property='state_dict', world_size=2, seed=32, body=StateDictBody(tree=ModuleTree(width=4, root=Block(children=())), source=Composition(), target=Composition(wrapper=Wrapper.FSDP1_HYBRID_SHARD)))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import json
    body = StateDictBody(tree=ModuleTree(width=4, root=Block(children=(Leaf(kind=LeafKind.LINEAR), Block(children=(Leaf(kind=LeafKind.LINEAR), Leaf(kind=LeafKind.TANH), Leaf(kind=LeafKind.LAYER_NORM)), scale=True), Leaf(kind=LeafKind.LINEAR, bias=False)), buffer=True)), source=Composition(wrapper=Wrapper.FSDP1_FULL_SHARD), target=Composition(wrapper=Wrapper.FSDP1_HYBRID_SHARD), training=Training(momentum=0.9))
    t = body.training
    gen = torch.Generator().manual_seed(32)
    lo = ctx.rank * 2
    out = []
    for _ in range(3):
        x = torch.randn(ctx.world_size * 2, 4, generator=gen)
        y = torch.randn(ctx.world_size * 2, 4, generator=gen)
        step_ = [(x[lo:lo + 2].to(ctx.device), y[lo:lo + 2].to(ctx.device))]
        out.append(step_)
    data = [step[0] for step in out]
    src = build_side(body.tree, body.source, t, ctx, seed=32)
    body_optimizer(src, t)
    obs__ = {'losses_before': train_steps(src, data[:2])}
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    osd_ = FSDP.optim_state_dict(src.model, src.opt)
    msd, osd = (src.model.state_dict(), osd_)
    ignored = []
    obs__['saved'] = observe(src, ctx)
    tgt = build_side(body.tree, body.target, t, ctx, seed=32 + FRESH_SEED)
    fresh_training_out = replace(t)
    body_optimizer(tgt, fresh_training_out)
    dropped_keys_out = []
    dropped = sorted(set(dropped_keys_out) | set(ignored))
    obs__['dropped'] = dropped
    before = requires_grad(tgt)
    result_ = tgt.model.load_state_dict(msd)
    flags = requires_grad(tgt)
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP_
    tgt.opt.load_state_dict(FSDP_.optim_state_dict_to_load(tgt.model, tgt.opt, osd))
    missing = getattr(result_, 'missing_keys', []) or []
    unexpected = getattr(result_, 'unexpected_keys', []) or []
    obs__['load_result'] = {'missing': sorted((clean_name(k) for k in missing)), 'unexpected': sorted((clean_name(k) for k in unexpected))}
    obs__['requires_grad'] = {'before': before, 'after': flags}
    obs__['loaded'] = observe(tgt, ctx)
    data_ = data[2:]
    obs_ = {}
    losses = train_steps(src, data_)
    losses_src, final_src = (losses, observe_model(src))
    obs_['losses_source'] = losses_src
    obs_['losses_target'] = train_steps(tgt, data_)
    final_tgt = observe_model(tgt)
    if ctx.rank == 0:
        obs_['final_source'], obs_['final_target'] = (final_src, final_tgt)
    obs__.update(obs_)
    obs = json.loads(json.dumps(obs__))
    outs = [None] * world_size
    dist.all_gather_object(outs, obs)
    if rank != 0:
        return ''
    reports = tuple((RankReport(rank=r, observation=o) for r, o in enumerate(outs)))
    failure = judge_state_dict(case, Outcome(kind=OutcomeKind.OK, ranks=reports, seconds=0.0))
    if failure is not None and failure.signature in ['mismatch:dcp@async_save:shard1', 'mismatch:dcp@save:shard1', 'mismatch:state_dict@combined:shard1', 'mismatch:state_dict@fsdp1_optim_state_dict:shard1', 'mismatch:state_dict@split:shard1']:
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
