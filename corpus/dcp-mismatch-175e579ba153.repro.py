#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=8fe6d7b1f8b8192a sources=7d6f5cb23a31c8e4 seconds=2800.3
# Reproduces shardfuzz corpus entry dcp-mismatch-175e579ba153.json: mismatch:dcp@async_save:fsdp1-hsdp-load_sharded_optimizer_state_dict
# Known torch bug: load_sharded_optimizer_state_dict chunks optimizer state over the whole world:
# wrong Adam state in FSDP1 HYBRID_SHARD over a 2-D mesh; upstream: none found.
# Observed: Into FSDP1 HYBRID_SHARD over a 2-D mesh, load_sharded_optimizer_state_dict lays the
# optimizer state out as chunks over the whole world instead of the model's DTensors over the ...
# Run: torchrun --nproc-per-node 4 THIS_FILE.py: prints REPRODUCED and exits 1 while the failure
# is there, else exits 0 (expected: the property's judge finds nothing).

from __future__ import annotations
import torch
import enum
import dataclasses
import os
from typing import ClassVar
from torch import nn
from contextlib import contextmanager
import torch.distributed as dist
import torch.nn.functional as F
from dataclasses import dataclass, field, replace
import hashlib
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
    CONV1D = 'conv1d'
    RELU = 'relu'

class Dtype(str, enum.Enum):
    FLOAT32 = 'float32'
    FLOAT64 = 'float64'
    BFLOAT16 = 'bfloat16'
    FLOAT16 = 'float16'

@dataclass()
class Leaf:
    kind: object
    bias: object = True
    frozen: object = False

@dataclass()
class Block:
    children: object
    residual: object = False
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
    set_to_none: object = True
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

def trained_then_frozen(body):
    pass

@dataclass(frozen=True)
class Options:
    pass

@dataclass(frozen=True)
class StateDictBody(Body):
    KIND: ClassVar[str] = 'state_dict'
    PROGRAM: ClassVar[str] = 'fuzz._rank.state_dict:run_state_dict'
    tree: object
    source: object
    target: object
    training: object = field(default_factory=Training)
    load: object = field(default_factory=Options)
    requires_grad: object = ()

    @property
    def size(self):
        pass

class Overwrite(str, enum.Enum):
    NONE = 'none'
    TRUE = 'true'
    FALSE = 'false'

class DcpItem(str, enum.Enum):
    MODEL = 'model'
    OPTIMIZER = 'optimizer'
    APP = 'app'
    SCALARS = 'scalars'
    COUNTER = 'counter'
    EXTRA = 'extra'

@dataclass(frozen=True)
class DcpBody(Body):
    KIND: ClassVar[str] = 'dcp'
    PROGRAM: ClassVar[str] = 'fuzz._rank.dcp:run_dcp'
    tree: object
    source: object
    target: object
    entries: object
    training: object = field(default_factory=Training)
    async_save: object = False
    overwrite: object = Overwrite.NONE
    requires_grad: object = ()

    @property
    def size(self):
        pass

class TreeBlock(nn.Module):

    def __init__(self, children, residual, width, scale, buffer):
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)
        self.residual = residual
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
        return x + y if self.residual else y

class PointwiseConv1d(nn.Conv1d):

    def forward(self, x):
        return super().forward(x.unsqueeze(-1)).squeeze(-1)

def _build_leaf(leaf, width):
    if leaf.kind is LeafKind.CONV1D:
        return PointwiseConv1d(width, width, kernel_size=1, bias=leaf.bias)
    return nn.ReLU()

def build_node(node, width):
    if isinstance(node, Leaf):
        module = _build_leaf(node, width)
        module.requires_grad_(False)
        return module
    return TreeBlock([build_node(c, width) for c in node.children], node.residual, width, node.scale, node.buffer)
_WRAPPER_PREFIXES = ('_fsdp_wrapped_module.', 'module.', '_checkpoint_wrapped_module.')

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
    build_model_out = build_node(tree.root, 12)
    model = build_model_out.to(torch.float32)
    names = [n for n, _ in model.named_parameters()]
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    strategy = {Wrapper.FSDP1_FULL_SHARD: ShardingStrategy.FULL_SHARD, Wrapper.FSDP1_HYBRID_SHARD: ShardingStrategy.HYBRID_SHARD}[comp.wrapper]
    kwargs = {'sharding_strategy': strategy, 'device_id': ctx.device, 'use_orig_params': True}
    if comp.wrapper is Wrapper.FSDP1_HYBRID_SHARD:
        kwargs['device_mesh'] = ctx.mesh((2, 2), ())
    wrap_out = FSDP(model, **kwargs)
    composed = Composed(model=wrap_out, param_names=names)
    return Side(composed=composed, comp=comp, training=training)

def requires_grad(side):
    return {clean_name(n): p.requires_grad for n, p in side.model.named_parameters()}

def body_optimizer(side, training):
    params = list(side.model.parameters())
    params_ = params
    params_ = [p_ for p_ in params_ if p_.requires_grad]
    groups = params_
    side.opt = torch.optim.SGD(groups, lr=training.lr, momentum=training.momentum)
    side.param_names = {id(p): clean_name(n) for n, p in side.model.named_parameters()}

def train_steps(side, data):
    x, y = next(iter(data))
    loss = F.mse_loss(side.model(x).to(y.dtype), y)
    loss.backward()
    side.opt.step()
    side.opt.zero_grad()
    losses = [loss.item()]
    return losses

def observe_model(side):
    with side.composed.full_parameters() as params:
        out = {n: [float(v) for v in t.double().cpu().flatten().tolist()] for n, t in params.items()}
    for n, b in side.model.named_buffers():
        out[clean_name(n)] = [float(v_) for v_ in b.detach().double().cpu().flatten().tolist()]
    return out

def _jsonable(value):
    if isinstance(value, torch.Tensor):
        return [float(v) for v in value.detach().double().cpu().flatten().tolist()]
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
    p_ = next(iter(group_['params']))
    state = side.opt.state.get(p_, {})
    entry = {key: _jsonable(state[key]) for key in sorted(state)}
    if entry:
        out__[names_.get(id(p_), '?')] = entry
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(PROBE_ROWS, 12, generator=gen).to(ctx.device)
    t = side.model(x)
    out___ = [float(v_) for v_ in t.detach().double().cpu().flatten().tolist()]
    obs['optimizer_local'] = out__
    if ctx.rank == 0:
        obs.update(model=params, probe=out___)
    return obs

class Scalars:

    def __init__(self, values):
        self.values = dict(values)

class Counter:

    def __init__(self, ctx):
        self.value = torch.tensor([0.5])
        self.agreed = float('nan')
        self.ctx = ctx

    def state_dict(self):
        total = self.value.clone()
        dist.all_reduce(total)
        self.total = total

    def load_state_dict(self, state_dict):
        check = self.value.clone()
        dist.all_reduce(check)
        self.agreed = float(check.item()) / self.ctx.world_size

    def observe(self):
        return {'value': float(self.value.item()), 'total': float(self.total.item()), 'agreed': self.agreed}

def _observe_entries(values):
    out = {}
    for entry, value in values.items():
        if entry is DcpItem.SCALARS:
            out['scalars'] = value.values
        elif entry is DcpItem.COUNTER:
            out['counter'] = value.observe()
        elif entry is DcpItem.EXTRA:
            out['extra'] = [float(v) for v in value.tolist()]
    return out

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
        return [r.observation for r in self.ranks]
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
    see_also: object = ()
FSDP1_HSDP_SHARD1 = KnownBug('fsdp1-hybrid-shard-dim-1', 'FSDP1 HYBRID_SHARD with a shard dimension of size 1 never averages gradients across replicas', symptoms=frozenset({'mismatch'}), upstream='pytorch/pytorch#154888', relation='same bug', ends_ranks=False, tag=':shard1')
FSDP1_HSDP_OPTIMIZER_LOAD = KnownBug('fsdp1-hsdp-load_sharded_optimizer_state_dict', 'load_sharded_optimizer_state_dict chunks optimizer state over the whole world: wrong Adam state in FSDP1 HYBRID_SHARD over a 2-D mesh', symptoms=frozenset({'mismatch'}), see_also=('pytorch/pytorch#111096',), ends_ranks=False, tag=':fsdp1-hsdp-load_sharded_optimizer_state_dict')

def fsdp1_shard1(comp):
    return comp.wrapper is Wrapper.FSDP1_HYBRID_SHARD and (2, 2)[1] == 1 and (comp.mesh[0] > 1)

def frozen_state_dropped(body):
    loaded = any((e in body.entries and e not in () for e in (DcpItem.OPTIMIZER, DcpItem.APP))) and (not True)
    return loaded and bool(trained_then_frozen(body))

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

def _one_bug(case, failure):
    if failure is None or failure.kind != 'mismatch' or (not failure.signature.endswith(FSDP1_HSDP_SHARD1.tag)):
        return failure

def judge_dcp(case, outcome):
    return _one_bug(case, _frozen_state_dropped(case, _hsdp_optimizer_load(case, _judge_dcp(case, outcome))))
OPTIMIZER_CHECKS = ('optimizer', 'resume_loss', 'resume_params')

def _hsdp_optimizer_load(case, failure):
    tag = FSDP1_HSDP_OPTIMIZER_LOAD.tag.lstrip(':')
    return dataclasses.replace(failure, signature=str(Signature('mismatch', 'dcp', where='async_save', tags=(tag,))))

def _frozen_state_dropped(case, failure):
    body = case.body
    if failure is None or failure.kind != 'mismatch' or (not isinstance(body, (StateDictBody, DcpBody))) or (not frozen_state_dropped(body)) or (failure.details.get('check') not in OPTIMIZER_CHECKS):
        return failure

def _check_requires_grad(prop, where, observations):
    for rank, obs in enumerate(observations):
        seen = obs.get('requires_grad')
        before, after = (seen['before'], seen['after'])
        changed = sorted((n for n in before.keys() & after.keys() if before[n] != after[n]))
    return None

def _judge_dcp(case, outcome):
    body = case.body
    assert isinstance(body, DcpBody)
    prop, observations = ('dcp', outcome.observations)
    where = 'async_save' + _shard1(body.source, body.target)
    for rank, obs in enumerate(observations):
        pass
    failure = _check_dcp_options(prop, where, body, observations) or _check_requires_grad(prop, where, observations)
    loaded_entries = [e for e in body.entries if e not in ()]
    model_loaded = DcpItem.MODEL in loaded_entries or DcpItem.APP in loaded_entries
    optim_loaded = DcpItem.OPTIMIZER in loaded_entries or DcpItem.APP in loaded_entries
    first = observations[0]
    saved, loaded, fresh, dropped = (first['saved'], first['loaded'], first.get('fresh'), first['dropped'])
    if model_loaded:
        failure = _check_model(prop, where, saved, loaded, fresh, dropped)
    if failure is None and optim_loaded:
        failure = _check_optimizer(prop, where, body.source, body.target, observations, 'saved')
    for rank, obs in enumerate(observations):
        want_groups = obs['saved']['groups'] if optim_loaded else obs['fresh']['groups']
        failure = _exact(prop, 'groups', where, f"rank {rank}'s param groups", obs['loaded']['groups'], want_groups)
        for key in ('scalars', 'counter', 'extra'):
            if failure is None and key in obs['loaded']:
                got, want = (obs['loaded'][key], obs['saved'][key])
                if key == 'counter':
                    got = {k: v for k, v in got.items() if k != 'agreed'}
                    want = {k: v for k, v in want.items() if k != 'agreed'}
                failure = _exact(prop, key, where, f"rank {rank}'s {key} entry", got, want)
    if failure is None and model_loaded and (not dropped):
        failure = _exact(prop, 'probe', where, 'the forward output on the fixed input', loaded['probe'], saved['probe'])
    if failure is None:
        failure = _check_resume(prop, where, case, _same_operations(body.source, body.target), observations)
    return failure

def _check_dcp_options(prop, where, body, observations):
    return None

def attempt(rank, world_size):
    case = Case(property='dcp', world_size=4, seed=0, body=DcpBody(tree=ModuleTree(width=12, root=Block(children=())), source=Composition(wrapper=Wrapper.FSDP1_FULL_SHARD), target=Composition(mesh=(), wrapper=Wrapper.FSDP1_HYBRID_SHARD), entries=(DcpItem.MODEL, DcpItem.OPTIMIZER, DcpItem.COUNTER, DcpItem.SCALARS, DcpItem.EXTRA), training=Training(lr=0.01, momentum=0.9, set_to_none=False), async_save=True, overwrite=Overwrite.TRUE))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import json
    t = Training(lr=0.01, momentum=0.9)
    digest = hashlib.sha1('{"body": {"absent": false, "async_save": true, "async_saves": 0, "cache_staged": false, "checkpoint_dir": "", "convert": false, "deadlock": false, "drop": [], "empty_group": false, "entries": ["model", "optimizer", "counter", "scalars", "extra"], "frozen_in_optimizer": false, "kind": "dcp", "load_cpu_offload": true, "load_full_state_dict": false, "load_planner": null, "mode": "round_trip", "module_stateful": false, "no_dist": false, "orders": [[0, 3, 1, 4, 2], [0, 4, 2, 3, 1], [0, 4, 2, 1, 3], [0, 2, 1, 3, 4]], "overwrite": "true", "own_group": false, "patched": false, "process_checkpointer": false, "requires_grad": [], "save_cpu_offload": true, "save_full_state_dict": false, "save_planner": null, "skip": [], "source": {"auto_wrap": false, "checkpoint_first": true, "checkpoint_options": {"context_fn": "none", "debug": false, "determinism_check": null, "early_stop": null, "preserve_rng_state": true}, "checkpoints": [], "find_unused": false, "knobs": {"abort_and_reset": false, "all_reduce_hook_scale": null, "backward_prefetch": 0, "explicit_unshard": false, "force_sum_reduction": false, "forward_prefetch": 0, "gradient_divide_factor": null, "late_reshard_after_forward": null, "pg_allocator": false, "reduce_scatter_unused": false, "reshard_after_backward_last": false, "rs_max_buffers": 0}, "mesh": [], "meta_init": false, "replicate_options": {"batched_grad_copy": false, "bucket_cap_mb": null, "bucket_cap_mb_list": [], "delay_all_reduce": false, "device_id": false, "dim": 0, "forward_sync_buffers": null, "gradient_as_bucket_view": false, "group": "default", "ignored_modules": [], "init_sync": true, "skip_all_reduce_unused_params": false, "static_graph": false}, "replicates": [], "shards": [], "tp": [], "tp_size": 1, "wrapper": "fsdp1_full_shard"}, "stager": null, "steps_after": 1, "storage_objects": true, "target": {"auto_wrap": false, "checkpoint_first": true, "checkpoint_options": {"context_fn": "none", "debug": false, "determinism_check": null, "early_stop": null, "preserve_rng_state": true}, "checkpoints": [], "find_unused": false, "knobs": {"abort_and_reset": false, "all_reduce_hook_scale": null, "backward_prefetch": 0, "explicit_unshard": false, "force_sum_reduction": false, "forward_prefetch": 0, "gradient_divide_factor": null, "late_reshard_after_forward": null, "pg_allocator": false, "reduce_scatter_unused": false, "reshard_after_backward_last": false, "rs_max_buffers": 0}, "mesh": [2, 2], "meta_init": false, "replicate_options": {"batched_grad_copy": false, "bucket_cap_mb": null, "bucket_cap_mb_list": [], "delay_all_reduce": false, "device_id": false, "dim": 0, "forward_sync_buffers": null, "gradient_as_bucket_view": false, "group": "default", "ignored_modules": [], "init_sync": true, "skip_all_reduce_unused_params": false, "static_graph": false}, "replicates": [], "shards": [], "tp": [], "tp_size": 1, "wrapper": "fsdp1_hybrid_shard"}, "target_meta_init": false, "torch_save_reader": false, "training": {"accum_sync": "always", "batch_per_rank": 2, "compile": "none", "dtype": "float32", "eps": 0.0001, "foreach": null, "grad_accum": 1, "lr": 0.01, "momentum": 0.9, "optimizer": "sgd", "param_groups": 1, "same_input": false, "set_to_none": false, "skips": [], "steps": 1, "unfreeze": []}, "tree": {"root": {"buffer": false, "children": [{"buffer": true, "children": [{"bias": true, "frozen": false, "kind": "relu"}, {"buffer": false, "children": [{"bias": true, "frozen": false, "kind": "relu"}, {"bias": true, "frozen": true, "kind": "conv1d"}], "residual": false, "scale": true}], "residual": false, "scale": false}, {"bias": false, "frozen": true, "kind": "conv1d"}, {"buffer": true, "children": [{"bias": true, "frozen": false, "kind": "relu"}], "residual": true, "scale": false}], "residual": false, "scale": false}, "width": 12}, "use_collectives": true, "writer": {"per_thread_copy_ahead": 10000000, "single_file_per_rank": true, "sync_files": true, "thread_count": 1}}, "property": "dcp", "schema": 1, "seed": 0, "world_size": 4}'.encode()).hexdigest()[:12]
    count = getattr(ctx, '_cases', 0)
    path = os.path.join('/tmp/shardfuzz-dcp-9943', f'{digest}-{count}')
    obs__ = {}
    gen = torch.Generator().manual_seed(0)
    lo = rank * 2
    out = []
    for _ in range(2):
        x = torch.randn(8, 12, generator=gen)
        y = torch.randn(8, 12, generator=gen)
        step_ = [(x[lo:lo + 2].to(torch.device('cpu')), y[lo:lo + 2].to(torch.device('cpu')))]
        out.append(step_)
    data = [step[0] for step in out]
    src = build_side(ModuleTree(width=12, root=Block(children=(Block(children=(Leaf(kind=LeafKind.RELU), Block(children=(Leaf(kind=LeafKind.RELU), Leaf(kind=LeafKind.CONV1D, frozen=True)), scale=True)), buffer=True), Leaf(kind=LeafKind.CONV1D, bias=False), Block(children=(Leaf(kind=LeafKind.RELU),), residual=True, buffer=True)))), Composition(wrapper=Wrapper.FSDP1_FULL_SHARD), t, ctx, seed=0)
    body_optimizer(src, t)
    obs__['losses_before'] = train_steps(src, data[:1])
    out_ = {}
    for entry in (DcpItem.MODEL, DcpItem.OPTIMIZER, DcpItem.COUNTER, DcpItem.SCALARS, DcpItem.EXTRA):
        if entry is DcpItem.MODEL:
            out_[entry] = src.model.state_dict()
        elif entry is DcpItem.OPTIMIZER:
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP_
            osd_ = FSDP_.optim_state_dict(src.model, src.opt)
            out_[entry] = osd_
        elif entry is DcpItem.SCALARS:
            out_[entry] = Scalars({'step': 1, 'loss': 0.0, 'tag': 'case-0', 'done': False, 'history': [0.0, -1.5, 1e-300]})
        elif entry is DcpItem.COUNTER:
            out_[entry] = Counter(ctx)
        else:
            out_[entry] = torch.arange(5) * (0 % 97 + 0.25)
    order = ((2,), (2, 3, 1), (0, 4, 2, 1, 3), (0, 2, 1, 3, 4))[rank]
    state = {(DcpItem.MODEL, DcpItem.OPTIMIZER, DcpItem.COUNTER, DcpItem.SCALARS, DcpItem.EXTRA)[i].value: out_[(DcpItem.MODEL, DcpItem.OPTIMIZER, DcpItem.COUNTER, DcpItem.SCALARS, DcpItem.EXTRA)[i]] for i in order if (DcpItem.MODEL, DcpItem.OPTIMIZER, DcpItem.COUNTER, DcpItem.SCALARS, DcpItem.EXTRA)[i] in out_}
    import torch.distributed.checkpoint as dcp_
    kwargs_ = {}
    import torch.distributed.checkpoint as dcp___
    kwargs = {}
    kwargs_['storage_writer'] = dcp___.FileSystemWriter(path, **kwargs)
    result = dcp_.async_save(state, **kwargs_)
    future = getattr(result, 'upload_completion', result)
    future.result()
    obs__['overwrite'] = {}
    saved = {**observe(src, ctx), **_observe_entries(out_)}
    obs__['saved'] = saved
    tgt = build_side(ModuleTree(width=12, root=Block(children=(Block(children=(Leaf(kind=LeafKind.RELU), Block(children=(Leaf(kind=LeafKind.RELU), Leaf(kind=LeafKind.CONV1D, frozen=True)), scale=True)), buffer=True), Leaf(kind=LeafKind.CONV1D, bias=False, frozen=True), Block(children=(Leaf(kind=LeafKind.RELU),), residual=True, buffer=True)))), Composition(mesh=(2, 2), wrapper=Wrapper.FSDP1_HYBRID_SHARD), t, ctx, seed=FRESH_SEED)
    fresh_training_out = replace(t, lr=0.0037, momentum=0.5)
    body_optimizer(tgt, fresh_training_out)
    dropped = []
    obs__['dropped'] = dropped
    obs__['fresh'] = observe(tgt, ctx)
    before = requires_grad(tgt)
    import torch.distributed.checkpoint as dcp
    dcp.load(state, storage_reader=dcp.FileSystemReader(path))
    obs__['in_place'] = ''
    import torch.distributed.checkpoint as dcp__
    from torch.distributed.checkpoint.optimizer import load_sharded_optimizer_state_dict
    tgt.model.load_state_dict(out_[DcpItem.MODEL])
    loaded = load_sharded_optimizer_state_dict(model_state_dict=tgt.model.state_dict(), optimizer_key='optimizer', storage_reader=dcp__.FileSystemReader(path))
    osd = loaded['optimizer']
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    tgt.opt.load_state_dict(FSDP.optim_state_dict_to_load(tgt.model, tgt.opt, osd))
    obs__['requires_grad'] = {'before': before, 'after': requires_grad(tgt)}
    obs__['loaded'] = {**observe(tgt, ctx), **_observe_entries(out_)}
    data_ = data[1:]
    obs_ = {}
    losses = train_steps(src, data_)
    losses_src, final_src = (losses, observe_model(src))
    obs_['losses_source'] = losses_src
    obs_['losses_target'] = train_steps(tgt, data_)
    final_tgt = observe_model(tgt)
    if rank == 0:
        obs_['final_source'], obs_['final_target'] = (final_src, final_tgt)
    obs__.update(obs_)
    obs = json.loads(json.dumps(obs__))
    outs = [None, None, None, None]
    dist.all_gather_object(outs, obs)
    if rank != 0:
        return ''
    reports = tuple((RankReport(rank=r, observation=o) for r, o in enumerate(outs)))
    failure = judge_dcp(case, Outcome(kind=OutcomeKind.OK, ranks=reports, seconds=0.0))
    if failure is not None and failure.signature in ['mismatch:dcp@async_save:fsdp1-hsdp-load_sharded_optimizer_state_dict']:
        observed = hashlib.sha256(json.dumps(outs, sort_keys=True).encode()).hexdigest()[:16]
        return f'REPRODUCED {failure.signature}: observations {observed}: {failure.summary}'
    return f'PASS or another failure: {failure and failure.signature}'

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
