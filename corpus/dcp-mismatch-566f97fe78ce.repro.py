#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=00e158dc66e4194e sources=7d6f5cb23a31c8e4 seconds=352.0
"""Reproduces shardfuzz corpus entry dcp-mismatch-566f97fe78ce.json: mismatch:dcp@set_optimizer_state_dict:frozen-optimizer-state-dropped

Observed: the optimizer state differs after the load: ['0.weight'] is missing
Known torch bug: set_optimizer_state_dict drops the saved optimizer state of a parameter frozen
(requires_grad=False) when it is loaded: a parameter trained, then frozen, checkpointed and
unfrozen after resuming restarts with fresh optimizer state (get_optimizer_state_dict saved it);
upstream: https://github.com/pytorch/pytorch/issues/192202.
Expected: the property's judge finds nothing.

    torchrun --nproc-per-node 2 THIS_FILE.py

prints REPRODUCED and exits 1 while the failure is there, else exits 0.
"""

from __future__ import annotations
from dataclasses import dataclass, field
import torch
import enum
from dataclasses import dataclass
from dataclasses import dataclass, field
import builtins
from typing import ClassVar
import dataclasses
import json
import os
from typing import ClassVar
from torch import nn
from contextlib import contextmanager
import copy
import torch.distributed as dist
import torch.nn.functional as F
from dataclasses import dataclass, field, replace
import hashlib
import shutil

def __getattr__(name):
    raise AttributeError(f"module 'fuzz' has no attribute {name!r}")

@dataclass
class RankContext:
    rank: object
    world_size: object
    device: object
    backend: object

    def mesh(self, shape, names):
        pass
    _cases: object = 0

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

def has_params(node):
    return node.kind in PARAM_LEAVES
    return node.scale or any((has_params(c) for c in node.children))

@dataclass(frozen=True)
class ModuleTree:
    width: object
    root: object

    def paths(self):
        pass

    @property
    def size(self):
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
    mesh: object = ()
    wrapper: object = Wrapper.NONE

    def reshard_after_forward(self, spec):
        pass

    def steps(self):
        pass

class Optimizer(str, enum.Enum):
    SGD = 'sgd'
    ADAM = 'adam'
    ADAMW = 'adamw'

@dataclass(frozen=True)
class Training:
    optimizer: object = Optimizer.SGD
    lr: object = 0.1
    momentum: object = 0.0
    eps: object = 0.001
    steps: object = 2
    batch_per_rank: object = 2
    dtype: object = Dtype.FLOAT32
    set_to_none: object = True
    param_groups: object = 1
    foreach: object = None

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
class Case:
    property: object
    world_size: object
    seed: object
    body: object

    @builtins.property
    def size(self):
        pass

@dataclass(frozen=True)
class RequiresGrad:
    path: object
    step: object
    trainable: object

def trainable_at(tree, changes, step):
    flags = {p: not n.frozen for p, n in tree.paths().items() if isinstance(n, Leaf) and has_params(n)}
    for c in sorted(changes, key=lambda c: c.step):
        if c.step <= step:
            flags[c.path] = c.trainable
    return flags

def trained_then_frozen(body):
    steps = body.training.steps
    at_load = trainable_at(body.tree, body.requires_grad, steps - 1)
    trained = {p for s in range(steps) for p, on in trainable_at(body.tree, body.requires_grad, s).items() if on}
    return sorted((p for p in trained if not at_load[p]))

@dataclass(frozen=True)
class Options:
    strict: object = True

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

    @property
    def size(self):
        pass

class DcpItem(str, enum.Enum):
    MODEL = 'model'
    OPTIMIZER = 'optimizer'
    APP = 'app'
    SCALARS = 'scalars'
    COUNTER = 'counter'
    EXTRA = 'extra'

class DcpMode(str, enum.Enum):
    ROUND_TRIP = 'round_trip'
    SAVE_ONLY = 'save_only'
    LOAD_ONLY = 'load_only'

@dataclass(frozen=True)
class DcpBody(Body):
    KIND: ClassVar[str] = 'dcp'
    PROGRAM: ClassVar[str] = 'fuzz._rank.dcp:run_dcp'
    tree: object
    source: object
    target: object
    entries: object
    training: object = field(default_factory=Training)
    orders: object = ()
    skip: object = ()
    patched: object = False
    async_save: object = False
    mode: object = DcpMode.ROUND_TRIP
    cache_staged: object = False
    no_dist: object = False
    requires_grad: object = ()
    stager: object = None

    @property
    def classic_fsdp1(self):
        return (False or False) and (not self.patched) and (DcpItem.APP not in self.entries)

    @property
    def size(self):
        pass

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

def build_node(node, width):
    if isinstance(node, Leaf):
        module = nn.Linear(width, width, bias=False)
        return module
    return TreeBlock([build_node(c, width) for c in node.children], False, width, False, False)

def build_model(tree, device):
    return build_node(tree.root, 2)
TORCH_DTYPES = {Dtype.FLOAT32: torch.float32, Dtype.FLOAT64: torch.float64, Dtype.BFLOAT16: torch.bfloat16, Dtype.FLOAT16: torch.float16}
_WRAPPER_PREFIXES = ('_fsdp_wrapped_module.', 'module.', '_checkpoint_wrapped_module.')

def clean_name(name):
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, '')
    return name

@dataclass
class Composed:
    model: object
    wrapper: object = Wrapper.NONE

    @contextmanager
    def full_parameters(self):
        out = {}
        for n, p in self.model.named_parameters():
            out[clean_name(n)] = p.detach()
        yield out

def batches(case, training, width, ctx, tp_size=1):
    dtype = TORCH_DTYPES[training.dtype]
    gen = torch.Generator().manual_seed(0)
    lo = ctx.rank // tp_size * 1
    out = []
    for _ in range(3):
        step = []
        _ = next(iter(range(1)))
        x = torch.randn(ctx.world_size * 1, width, generator=gen, dtype=dtype)
        y = torch.randn(ctx.world_size * 1, width, generator=gen, dtype=dtype)
        step.append((x[lo:lo + 1].to(ctx.device), y[lo:lo + 1].to(ctx.device)))
        out.append(step)
    return out
PROBE_ROWS = 3
FRESH_SEED = 24301

@dataclass
class Side:
    composed: object
    comp: object
    training: object
    opt: object = None
    schedule: object = ()
    step: object = 0

    @property
    def model(self):
        return self.composed.model

    @property
    def plain(self):
        pass

    def names(self):
        current = {id(p): clean_name(n) for n, p in self.model.named_parameters()}
        return {**self.param_names, **current}

def build_side(tree, comp, training, ctx, *, seed, meta=False, schedule=()):
    torch.manual_seed(seed)
    device = ctx.device
    model = build_model(tree, device).to(TORCH_DTYPES[training.dtype])
    composed = Composed(model)
    return Side(composed=composed, comp=comp, training=training, schedule=schedule)

def change_requires_grad(side, step):
    changes = [c for c in side.schedule if 1 == step]
    if not changes:
        return
    model = side.model
    paths = ['0' for c in changes]
    out = {path: [] for path in paths}
    name, p_ = next(iter(model.named_parameters()))
    owner = '.'.join((c_ for c_ in name.split('.')[:-1] if c_.isdigit()))
    out[owner].append(p_)
    c = next(iter(changes))
    p = next(iter(out['0']))
    p.requires_grad_(False)

def requires_grad(side):
    return {clean_name(n): p.requires_grad for n, p in side.model.named_parameters()}

def body_optimizer(side, training, body):
    params = list(side.model.parameters())
    frozen = []
    params_ = params
    held = {id(p_) for p_ in frozen}
    params_ = [p_ for p_ in params_ if p_.requires_grad or id(p_) in held]
    groups = params_
    side.opt = torch.optim.SGD(groups, lr=training.lr, momentum=training.momentum, foreach=None)
    side.param_names = {id(p): clean_name(n) for n, p in side.model.named_parameters()}
    return side.opt

def train_steps(side, data, ctx):
    assert side.opt is not None
    losses = []
    for x, y in data:
        change_requires_grad(side, side.step)
        side.step += 1
        loss = F.mse_loss(side.model(x).to(y.dtype), y)
        loss.backward()
        for p in side.model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= ctx.world_size
        side.opt.step()
        side.opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses

def _flat(t):
    return [float(v) for v in t.detach().double().cpu().flatten().tolist()]

def observe_model(side):
    with side.composed.full_parameters() as params:
        out = {n: [float(v) for v in t.double().cpu().flatten().tolist()] for n, t in params.items()}
    return out

def _jsonable(value):
    if isinstance(value, torch.Tensor):
        return _flat(value)
    return value

def observe(side, case, tree, ctx, *, model=True):
    names = side.names()
    out_ = []
    group = next(iter(side.opt.param_groups))
    item = {k: _jsonable(v) for k, v in sorted(group.items()) if k != 'params'}
    item['params'] = [names.get(id(p), '?') for p in group['params']]
    out_.append(item)
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
    gen = torch.Generator().manual_seed(0 + 1)
    x = torch.randn(PROBE_ROWS, 2, generator=gen, dtype=TORCH_DTYPES[side.training.dtype]).to(ctx.device)
    out___ = _flat(side.model(x))
    if ctx.rank == 0:
        obs.update(model=params, probe=out___)
        obs['optimizer'] = out__
    return obs

def state_dict_options(o):
    pass

def case_dir(case, ctx):
    digest = hashlib.sha1('{"body": {"absent": false, "async_save": false, "async_saves": 0, "cache_staged": false, "checkpoint_dir": "", "convert": false, "deadlock": false, "drop": [], "empty_group": false, "entries": ["model", "optimizer"], "frozen_in_optimizer": false, "kind": "dcp", "load_cpu_offload": false, "load_full_state_dict": false, "load_planner": null, "mode": "round_trip", "module_stateful": false, "no_dist": false, "orders": [], "overwrite": "none", "own_group": false, "patched": false, "process_checkpointer": false, "requires_grad": [{"path": "0", "step": 1, "trainable": false}], "save_cpu_offload": false, "save_full_state_dict": false, "save_planner": null, "skip": [], "source": {"auto_wrap": false, "checkpoint_first": true, "checkpoint_options": {"context_fn": "none", "debug": false, "determinism_check": null, "early_stop": null, "preserve_rng_state": true}, "checkpoints": [], "find_unused": false, "knobs": {"abort_and_reset": false, "all_reduce_hook_scale": null, "backward_prefetch": 0, "explicit_unshard": false, "force_sum_reduction": false, "forward_prefetch": 0, "gradient_divide_factor": null, "late_reshard_after_forward": null, "pg_allocator": false, "reduce_scatter_unused": false, "reshard_after_backward_last": false, "rs_max_buffers": 0}, "mesh": [], "meta_init": false, "replicate_options": {"batched_grad_copy": false, "bucket_cap_mb": null, "bucket_cap_mb_list": [], "delay_all_reduce": false, "device_id": false, "dim": 0, "forward_sync_buffers": null, "gradient_as_bucket_view": false, "group": "default", "ignored_modules": [], "init_sync": true, "skip_all_reduce_unused_params": false, "static_graph": false}, "replicates": [], "shards": [], "tp": [], "tp_size": 1, "wrapper": "none"}, "stager": null, "steps_after": 1, "storage_objects": false, "target": {"auto_wrap": false, "checkpoint_first": true, "checkpoint_options": {"context_fn": "none", "debug": false, "determinism_check": null, "early_stop": null, "preserve_rng_state": true}, "checkpoints": [], "find_unused": false, "knobs": {"abort_and_reset": false, "all_reduce_hook_scale": null, "backward_prefetch": 0, "explicit_unshard": false, "force_sum_reduction": false, "forward_prefetch": 0, "gradient_divide_factor": null, "late_reshard_after_forward": null, "pg_allocator": false, "reduce_scatter_unused": false, "reshard_after_backward_last": false, "rs_max_buffers": 0}, "mesh": [], "meta_init": false, "replicate_options": {"batched_grad_copy": false, "bucket_cap_mb": null, "bucket_cap_mb_list": [], "delay_all_reduce": false, "device_id": false, "dim": 0, "forward_sync_buffers": null, "gradient_as_bucket_view": false, "group": "default", "ignored_modules": [], "init_sync": true, "skip_all_reduce_unused_params": false, "static_graph": false}, "replicates": [], "shards": [], "tp": [], "tp_size": 1, "wrapper": "none"}, "target_meta_init": false, "torch_save_reader": false, "training": {"accum_sync": "always", "batch_per_rank": 1, "compile": "none", "dtype": "float32", "eps": 0.001, "foreach": null, "grad_accum": 1, "lr": 0.1, "momentum": 0.9, "optimizer": "sgd", "param_groups": 1, "same_input": false, "set_to_none": true, "skips": [], "steps": 2, "unfreeze": []}, "tree": {"root": {"buffer": false, "children": [{"bias": false, "frozen": false, "kind": "linear"}, {"bias": false, "frozen": false, "kind": "linear"}], "residual": false, "scale": false}, "width": 2}, "use_collectives": true, "writer": {"per_thread_copy_ahead": 10000000, "single_file_per_rank": true, "sync_files": true, "thread_count": 1}}, "property": "dcp", "schema": 1, "seed": 0, "world_size": 2}'.encode()).hexdigest()[:12]
    count = getattr(ctx, '_cases', 0)
    return os.path.join('/tmp/shardfuzz-dcp-6213', f'{digest}-{count}')

def _options(full, offload, *, load, strict=True):
    pass

def _values(body, case, side, ctx, get, put, fresh, skip):
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
    out = {}
    for entry in body.entries:
        if entry is DcpItem.MODEL:
            out[entry] = get_model_state_dict(side.model, options=state_dict_options(get))
        else:
            assert side.opt is not None
            out[entry] = get_optimizer_state_dict(side.model, side.opt, options=state_dict_options(get))
    return out

def _arrange(body, values, ctx):
    order = body.orders[ctx.rank] if () else range(len(body.entries))
    return {body.entries[i].value: values[body.entries[i]] for i in order if body.entries[i] in values}

def _tensors(value, path=''):
    return [(path, id(value))]
    return [t for k, v in value.items() for t in _tensors(v, f'{path}.{k}')]
    return [t for i, v in enumerate(value) for t in _tensors(v, f'{path}[{i}]')]
    return []

def _observe_entries(values):
    out = {}
    entry, value = next(iter(values.items()))
    pass
    return out

def _run_dcp(case, body, ctx):
    t = body.training
    get_save = _options(False, False, load=False)
    get_load = _options(False, False, load=False)
    put = _options(False, False, load=True, strict=not ())
    path = '' or case_dir(case, ctx)
    shutil.rmtree(path, ignore_errors=True)
    obs = {}
    steps = 2 + 1
    data = [step_[0] for step_ in batches(case, replace(t, steps=steps), 2, ctx)]
    src = None
    src = build_side(body.tree, body.source, t, ctx, seed=0, schedule=body.requires_grad)
    body_optimizer(src, t, body)
    obs['losses_before'] = train_steps(src, data[:2], ctx)
    values = _values(body, case, src, ctx, get_save, put, fresh=False, skip=())
    state = _arrange(body, values, ctx)
    import torch.distributed.checkpoint as dcp
    kwargs_ = {}
    kwargs_['checkpoint_id'] = path
    dcp.save(state, **kwargs_)
    saved = {**observe(src, case, body.tree, ctx), **_observe_entries(values)}
    taken = values.get(DcpItem.OPTIMIZER)
    out = {}
    for fqn, state_ in sorted(taken.get('state', {}).items()):
        entry = {key: _jsonable(state_[key]) for key in sorted(state_)}
        out[clean_name(fqn)] = entry
    if ctx.rank == 0:
        saved['taken_optimizer'] = out
    moves = any((e in body.entries and e not in () for e in (DcpItem.OPTIMIZER, DcpItem.APP)))
    obs['saved'] = saved
    import torch.distributed.checkpoint as dcp__
    dist.barrier()
    out_ = None
    torch.manual_seed(0 + 3 * FRESH_SEED)
    model = build_model(body.tree, torch.device('cpu')).to(TORCH_DTYPES[body.training.dtype])
    state__ = model.state_dict()
    dcp__.load({'model': state__}, checkpoint_id=path, no_dist=True)
    out_ = {clean_name(k_): _jsonable(v_) for k_, v_ in state__.items()}
    dist.barrier()
    reloaded = out_
    if ctx.rank == 0:
        obs['reloaded'] = reloaded
    tgt = build_side(body.tree, body.target, t, ctx, seed=0 + FRESH_SEED, meta=False, schedule=body.requires_grad)
    fresh_training_out = replace(t, lr=0.1 * 0.37, momentum=0.5, eps=0.001 * 10)
    body_optimizer(tgt, fresh_training_out, body)
    for step in range(tgt.step, 2):
        change_requires_grad(tgt, step)
    tgt.step = max(tgt.step, 2)
    dropped = []
    obs['dropped'] = dropped
    obs['fresh'] = observe(tgt, case, body.tree, ctx, model=not False)
    values = _values(body, case, tgt, ctx, get_load, put, fresh=True, skip=())
    state = _arrange(body, values, ctx)
    plain = {k: v for k, v in state.items() if isinstance(v, (dict, torch.Tensor))}
    tensors = {k: _tensors(v) for k, v in plain.items()}
    before = requires_grad(tgt)
    import torch.distributed.checkpoint as dcp_
    dcp_.load(state, checkpoint_id=path)
    key_, value = next(iter(plain.items()))
    now = dict(_tensors(value))
    obs['in_place'] = ''
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict
    options = state_dict_options(put)
    msd = values[DcpItem.MODEL]
    set_model_state_dict(tgt.model, msd, options=options)
    assert tgt.opt is not None
    set_optimizer_state_dict(tgt.model, tgt.opt, values[DcpItem.OPTIMIZER], options=options)
    obs['requires_grad'] = {'before': before, 'after': requires_grad(tgt)}
    obs['loaded'] = {**observe(tgt, case, body.tree, ctx), **_observe_entries(values)}
    data_ = data[2:]
    obs_ = {}
    losses = train_steps(src, data_, ctx)
    losses_src, final_src = (losses, observe_model(src))
    obs_['losses_source'] = losses_src
    obs_['losses_target'] = train_steps(tgt, data_, ctx)
    final_tgt = observe_model(tgt)
    if ctx.rank == 0:
        obs_['final_source'], obs_['final_target'] = (final_src, final_tgt)
    obs.update(obs_)
    dist.barrier()
    shutil.rmtree(path, ignore_errors=True)
    return obs

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
class Stall:
    name: object
    deadlocked: object
    after: object = 10.0
    hold: object = 3.0

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
    conditional: object = False
FSDP1_HSDP_SHARD1 = KnownBug('fsdp1-hybrid-shard-dim-1', 'FSDP1 HYBRID_SHARD with a shard dimension of size 1 never averages gradients across replicas', symptoms=frozenset({'mismatch'}), upstream='pytorch/pytorch#154888', relation='same bug', ends_ranks=False, tag=':shard1')
FOREACH_MIXED = KnownBug('foreach-mixed-dtensor-tensor', 'foreach optimizers over a mix of DTensor (fully_shard) and plain (replicate) parameters raise', upstream='pytorch/pytorch#183207', relation='same symptom (reached there through ignored_params)')
INT_RESHARD_DIM1 = KnownBug('fully_shard-int-reshard-shard-dim-1', 'fully_shard with an int reshard_after_forward and Shard(1) placements: IndexError in foreach_all_gather_copy_out')
FROZEN_INT_RESHARD = KnownBug('fully_shard-frozen-int-reshard', "a frozen fully_shard unit with an int reshard_after_forward under a replicate'd root stays in its post-forward state", symptoms=frozenset({'mismatch'}), ends_ranks=False, tag=':frozen-int-reshard')
UNFROZEN_UNRESHARDED = KnownBug('fully_shard-unfrozen-unresharded', "a frozen fully_shard unit without resharding under a replicate'd root is never resharded: a leaf unfrozen later never trains (KeyError in get_optimizer_state_dict)", symptoms=frozenset({'mismatch', 'exception'}), ends_ranks=False, tag=':unfrozen-unresharded')
UNUSED_NO_ALL_REDUCE = KnownBug('fully_shard-unused-no-all-reduce', 'HSDP with set_requires_all_reduce(False): a unit unused on the last microbatch loses its accumulated gradient', symptoms=frozenset({'mismatch', 'exception'}), ends_ranks=False, tag=':unused-no-all-reduce')
FSDP1_UNFROZEN_FROZEN_UNIT = KnownBug('fsdp1-no-shard-unfrozen-in-frozen-unit', 'FSDP1 NO_SHARD, a unit all frozen at wrapping: a leaf unfrozen later never trains', symptoms=frozenset({'mismatch'}), upstream='pytorch/pytorch#85831', relation='related', see_also=('pytorch/pytorch#104148', 'pytorch/pytorch#105371'), ends_ranks=False, tag=':unfrozen-frozen-unit')
MP_UNIFORM_GRAD_DTYPE = KnownBug('fully_shard-reduce-dtype-no-sync-uniform-grad-dtype', "MixedPrecisionPolicy(reduce_dtype) with set_requires_gradient_sync(False) and a parameter unused on a no-sync microbatch: 'FSDP reduce-scatter expects uniform gradient dtype'", upstream='pytorch/pytorch#196996', relation='same bug', state='open; an earlier fix (pull request #160279) is not in torch 2.13', see_also=('pytorch/pytorch#160279', 'pytorch/pytorch#190627'))
MP_NEVER_RUN_NO_SYNC = KnownBug('fully_shard-reduce-dtype-no-sync-never-run', "MixedPrecisionPolicy(reduce_dtype) with set_requires_gradient_sync(False): a unit that never ran forward has no '_unsharded_param' in the root's post-backward", upstream='pytorch/pytorch#194058', relation='same bug (pull request)', state='closed; the fix is not in torch 2.13')
MP_FROZEN_AT_LAZY_INIT = KnownBug('fully_shard-mp-frozen-at-lazy-init', 'MixedPrecisionPolicy: a unit all frozen at lazy init gets no orig/reduce dtype; unfrozen later, its low-precision gradient is never cast back', upstream='pytorch/pytorch#186998', relation='same bug', state='closed, yet still present in torch 2.13.0 (fix pull request #187376 not in 2.13)', see_also=('pytorch/pytorch#187376',))
BROADCAST_EMPTY = KnownBug('set_state_dict-broadcast-empty', 'set_state_dict(broadcast_from_rank0=True) deadlocks when ranks other than 0 pass an empty model state dict', symptoms=frozenset({'hang', 'crash', 'exception'}), upstream='pytorch/pytorch#157781', relation='same symptom', state='open', see_also=('pytorch/pytorch#158836',), odds=KNOWN_HANG_ODDS, docs='docs/state_dict.md')
STATELESS_FULL = KnownBug('set_optimizer_state_dict-full-stateless', "set_optimizer_state_dict(full_state_dict=True) for an optimizer without tensor state: 'Expected device to be set'", docs='docs/state_dict.md')
FLAT_FULL_OPTIM = KnownBug('set_optimizer_state_dict-flat-full-keyerror', "set_optimizer_state_dict(full_state_dict=True, flatten_optimizer_state_dict=True) raises KeyError 'param_groups.0.params.0' for any model: the full-state branch takes the optimizer's local state dict with the flatten option still on, so the loaded and the local dicts have different keys", relation='none found after three phrasings; two other flatten bugs are in see_also', state='present in torch 2.13.0', see_also=('pytorch/pytorch#192224', 'pytorch/pytorch#192225'), docs='docs/state_dict.md')
FSDP1_FULL_OFFLOAD = KnownBug('fsdp1-full-state-dict-offload-to-cpu', 'FSDP1 FULL_STATE_DICT with offload_to_cpu on CPU: state_dict() clones a freed buffer (SIGSEGV), optim_state_dict aliases the gathered states', symptoms=frozenset({'crash', 'mismatch'}), upstream='pytorch/pytorch#188989', relation="same root cause for the model state dict (to_cpu frees a CPU buffer); none found for the optimizer's aliasing", state='closed; its fix (pull request #188990) is not in torch 2.13', see_also=('pytorch/pytorch#188990', 'Lightning-AI/pytorch-lightning#21804'), docs='docs/state_dict.md')
FSDP1_FROZEN_UNIT = KnownBug('fsdp1-no-shard-frozen-unit-state-dict', "FSDP1 NO_SHARD with an auto-wrapped unit of frozen parameters: state_dict() after training raises 'FSDP assumes ... is in the state_dict'", upstream='pytorch/pytorch#85831', relation='related', docs='docs/state_dict.md')
FSDP1_DCP_STATELESS = KnownBug('fsdp1-dcp-stateless-optimizer', "the classic FSDP1 DCP recipe with an optimizer without state: optim_state_dict_to_load refuses the dict without 'state'", docs='docs/state_dict.md')
FSDP1_DCP_EMPTY_SHARD = KnownBug('dcp-load-empty-sharded-tensor-pre-2.4-guess', "dcp.load of an FSDP1 sharded state dict where a rank holds no chunk of a parameter: the planner guesses a pre-2.4 checkpoint, 'Missing key in checkpoint state_dict'", see_also=('pytorch/pytorch#137327',), docs='docs/state_dict.md')
FSDP1_ASYNC_DEFAULT_STAGER = KnownBug('async_save-default-stager-sharded-tensor', "dcp.async_save's default stager calls data_ptr() on ShardedTensors", docs='docs/state_dict.md')
CACHED_STAGING_NEEDS_ACCELERATOR = KnownBug('filesystemwriter-cache-staged-pin-memory', 'FileSystemWriter(cache_staged_state_dict=True) pins its staging copy: async_save fails on a host without an accelerator', see_also=('pytorch/pytorch#189991',), docs='docs/state_dict.md')
CACHED_STAGING_PINNED_METADATA = KnownBug('filesystemwriter-cache-staged-pinned-metadata', 'a checkpoint staged by FileSystemWriter(cache_staged_state_dict=True) records pin_memory=True; the classic FSDP1 load_sharded_optimizer_state_dict then refuses its unpinned ShardedTensors', docs='docs/state_dict.md')
FSDP1_HSDP_OPTIMIZER_LOAD = KnownBug('fsdp1-hsdp-load_sharded_optimizer_state_dict', 'load_sharded_optimizer_state_dict chunks optimizer state over the whole world: wrong Adam state in FSDP1 HYBRID_SHARD over a 2-D mesh', symptoms=frozenset({'mismatch'}), see_also=('pytorch/pytorch#111096',), ends_ranks=False, tag=':fsdp1-hsdp-load_sharded_optimizer_state_dict')
FSDP1_HSDP_RANK0_BROADCAST = KnownBug('fsdp1-hsdp-shard1-rank0-broadcast', 'set_optimizer_state_dict(full, cpu_offload) into FSDP1 HYBRID_SHARD with a shard dimension of 1 broadcasts from global rank 0 in a one-rank group', upstream='pytorch/pytorch#155680', relation='same line', state='open; #128444 (same path) was fixed only in part by pull request #128446', see_also=('pytorch/pytorch#128444',))
FSDP1_COMPILE_SHARDED_GRAD = KnownBug('fsdp1-compile-recompile-sharded-grad', "torch.compile over FSDP1 (use_orig_params=True, sharded): recompiling the wrapped module's forward while its parameters hold sharded gradients raises InternalTorchDynamoError 'attempting to assign a gradient of size ...'", upstream='pytorch/pytorch#111317', relation='same symptom (a comment there: SHARD_GRAD_OP, use_orig_params=True, float32)', state='open', see_also=('pytorch/pytorch#93288',))
DIVIDE_FACTOR_TWICE = KnownBug('fully_shard-divide-factor-single-shard-twice', 'set_gradient_divide_factor(f) on a fully_shard unit whose shard group is one rank, with set_force_sum_reduction_for_comms(True) or a float16 / float64 reduce dtype: gradients are divided by f twice (once where the single-rank branch copies the input, once more as the post-divide)', symptoms=frozenset({'mismatch'}), relation='none found after three phrasings; the single-rank division came with the pull request in see_also, and a later one reworks that branch without the post-divide', state='present in torch 2.13.0', see_also=('pytorch/pytorch#167178', 'pytorch/pytorch#196348'), ends_ranks=False, tag=':divide-factor-twice')
FROZEN_OPTIM_STATE_DROPPED = KnownBug('set_optimizer_state_dict-frozen-state-dropped', 'set_optimizer_state_dict drops the saved optimizer state of a parameter frozen (requires_grad=False) when it is loaded: a parameter trained, then frozen, checkpointed and unfrozen after resuming restarts with fresh optimizer state (get_optimizer_state_dict saved it)', symptoms=frozenset({'mismatch'}), upstream='pytorch/pytorch#192202', relation='same bug', state='open; fix pull request #192307 open, not in torch 2.13.0', see_also=('pytorch/pytorch#192307',), ends_ranks=False, tag=':frozen-optimizer-state-dropped', docs='docs/state_dict.md', odds=4)
PLAN_CACHE_FAILED_SAVE = KnownBug('dcp-plan-cache-after-failed-save', "DefaultSavePlanner(enable_plan_caching=True): a save that fails (FileSystemWriter(overwrite=False) refusing an existing checkpoint) leaves its plans cached; the next save with that planner class raises TypeError 'NoneType' object is not iterable in _create_global_plan", upstream='pytorch/pytorch#176289', relation='same bug (pull request: save plan caching during validation failures)', state='fixed in torch 2.13 (plans are cached only after a successful save); present in torch 2.11', fixed_in='2.13', docs='docs/state_dict.md')
CHECKPOINT_DEBUG = KnownBug('checkpoint-debug-always-refused', "composable checkpoint(module, debug=True) raises ValueError 'debug=True is incompatible with non-default context_fn' on the first forward whatever the caller passes: it always hands torch.utils.checkpoint a context_fn of its own", upstream='pytorch/pytorch#185285', relation='same bug (pull request: allow debug mode with context_fn in checkpoint(); an earlier attempt in see_also)', state='not in torch 2.13.0', see_also=('pytorch/pytorch#175338',), conditional=True)
SAC_OVER_FSDP_UNIT = KnownBug('selective-checkpoint-over-fully_shard-unit', "selective activation checkpointing (context_fn=create_selective_checkpoint_contexts) over a region holding a fully_shard unit whose state differs between forward and recomputation (kept unsharded by set_reshard_after_backward(False), prefetched, frozen): the replay counts FSDP2's record_function markers and raises 'profiler._record_function_enter_new.default invocation index N encountered during backward but not found in storage'", upstream='pytorch/pytorch#196862', relation='same bug (pull request: exclude all-gather internals and profiler ops from selective checkpointing)', state='not in torch 2.13.0', see_also=('pytorch/pytorch#185178', 'pytorch/torchtitan#3427'), conditional=True)
DELAY_ALL_REDUCE_ROOT = KnownBug('ddp-delay-all-reduce-root-params-reduced-twice', "DistributedDataParallel(delay_all_reduce_named_params=..., param_to_hook_all_reduce=...): a delayed parameter of the root module itself stays in the reducer too (the reducer leaves out f'{module_name}.{name}', which is '.<name>' for the root's own parameters), so it is all-reduced twice, racing, and its gradient is wrong now and then; every parameter replicate() hands DDP is one (an nn.ParameterList's)", symptoms=frozenset({'mismatch'}), relation='none found after five phrasings; the option came with the pull request in see_also', state='present in torch 2.13.0', see_also=('pytorch/pytorch#95669',), ends_ranks=False, tag=':delay-all-reduce', odds=4)
DELAY_BUFFER_FLOAT32 = KnownBug('ddp-delay-all-reduce-float32-buffer', "DistributedDataParallel(delay_all_reduce_named_params=..., param_to_hook_all_reduce=...) over parameters that are not float32: the delayed gradients' buffer is made with torch.zeros and no dtype, and _clear_grad_buffer raises 'attempting to assign a gradient with dtype 'float' to a tensor with grad_dtype 'Double''", relation='none found after three phrasings (the error text, the buffer, the option); the option came with the pull request in see_also', state='present in torch 2.13.0', see_also=('pytorch/pytorch#95669',))
STAGER_REUSED_AFTER_CLOSE = KnownBug('default-stager-reused-after-close', "dcp.async_save(async_stager=DefaultStager(...)) reused for a second save: DefaultStager._stage closes its StateDictStager after every stage, which empties its copy dispatch table, and the next stage raises KeyError: <class 'type'> in deepcopy_with_tensor_offload", upstream='pytorch/pytorch#183413', relation='same bug (a regression of the pull request in see_also, which added the close)', state='present in torch 2.11; torch 2.13.0 stages again after a close', see_also=('pytorch/pytorch#170431', 'pytorch/torchtitan#3476'), fixed_in='2.13', docs='docs/state_dict.md')
COMPILED_UNFREEZE_PLAIN = KnownBug('compile-unfrozen-plain-param-no-recompile', "torch.compile (aot_eager) of a module whose plain (non-DTensor) parameter was frozen when it was compiled: after requires_grad_(True) the compiled forward is reused without a recompile and the parameter gets no gradient (met through fully_shard's ignored_params, which stay plain tensors)", symptoms=frozenset({'mismatch'}), upstream='pytorch/pytorch#139476', relation='same bug (Dynamo reuses a compiled frame when the requires_grad of module parameters changes)', state='present in torch 2.11; torch 2.13.0 recompiles (the torch-only reproducer passes there)', fixed_in='2.13', ends_ranks=False, tag=':compiled-unfreeze')

def present(bug, torch_version):
    pass

def get(bug_id):
    pass

def int_reshard_dim1(comp):
    pass

def shard1(comp):
    pass

def fsdp1_shard1(comp):
    return comp.wrapper is Wrapper.FSDP1_HYBRID_SHARD and comp.mesh[1] == 1 and (comp.mesh[0] > 1)

def unused_no_all_reduce(tree, comp, training):
    pass

def fsdp1_compiled_with_sharded_grads(comp, training, world_size):
    pass

def divide_factor_twice(comp, training, world_size):
    pass

def never_run_under_no_sync(tree, comp, training):
    pass

def unfrozen_in_frozen_mp_unit(tree, comp, training):
    pass

def checkpoint_debug(comp):
    pass

def selective_over_unit(comp):
    pass

def delayed_all_reduce(comp):
    pass

def stager_reused(body):
    pass

def delayed_not_float32(comp, training):
    pass

def compiled_unfreeze_ignored(comp, training):
    pass

def fsdp1_hsdp_2d(comp):
    return comp.wrapper is Wrapper.FSDP1_HYBRID_SHARD and comp.mesh[0] > 1 and (comp.mesh[1] > 1)

def fsdp1_full_offload(body, world_size):
    pass

def fsdp1_dcp_stateless(body):
    pass

def fsdp1_dcp_empty_shard(body, world_size):
    pass

def fsdp1_async_default_stager(body):
    pass

def hsdp_optimizer_load(body):
    return isinstance(body, DcpBody) and fsdp1_hsdp_2d(body.target) and body.classic_fsdp1 and (DcpItem.OPTIMIZER in body.entries) and (DcpItem.OPTIMIZER not in body.skip)

def broadcast_empty(body):
    pass

def frozen_state_dropped(body):
    loaded = any((e in body.entries and e not in body.skip for e in (DcpItem.OPTIMIZER, DcpItem.APP))) and (not body.classic_fsdp1)
    return loaded and bool(trained_then_frozen(body))

def plan_cache_failed_save(body):
    pass

def stateless_full(body):
    pass

def flat_full_optimizer(body):
    pass

def _comps(case):
    pass

def _per_comp(condition):

    def met(case):
        pass
    return met

def _with_training(condition):

    def met(case):
        pass
    return met

def _saving(condition):
    return lambda case: isinstance(case.body, (StateDictBody, DcpBody)) and condition(case)

def _frozen_int_reshard(case):
    pass

def _foreach_mixed(case):
    pass

def _unfrozen_unresharded(case):
    pass

def _fsdp1_frozen_source(case):
    pass

def _fsdp1_unfrozen_frozen_unit(case):
    pass
CONDITIONS = ((INT_RESHARD_DIM1, lambda case: any((int_reshard_dim1(c) for c in _comps(case)))), (FSDP1_HSDP_SHARD1, lambda case: any((fsdp1_shard1(c) for c in _comps(case)))), (FSDP1_FROZEN_UNIT, _fsdp1_frozen_source), (FSDP1_FULL_OFFLOAD, _saving(lambda case: fsdp1_full_offload(case.body, case.world_size))), (FSDP1_DCP_STATELESS, _saving(lambda case: fsdp1_dcp_stateless(case.body))), (FSDP1_DCP_EMPTY_SHARD, _saving(lambda case: fsdp1_dcp_empty_shard(case.body, case.world_size))), (FSDP1_ASYNC_DEFAULT_STAGER, _saving(lambda case: fsdp1_async_default_stager(case.body))), (CACHED_STAGING_NEEDS_ACCELERATOR, lambda case: isinstance(case.body, DcpBody) and case.body.cache_staged), (BROADCAST_EMPTY, _saving(lambda case: broadcast_empty(case.body))), (STATELESS_FULL, _saving(lambda case: stateless_full(case.body))), (FLAT_FULL_OPTIM, _saving(lambda case: flat_full_optimizer(case.body))), (PLAN_CACHE_FAILED_SAVE, _saving(lambda case: plan_cache_failed_save(case.body))), (FSDP1_HSDP_OPTIMIZER_LOAD, _saving(lambda case: hsdp_optimizer_load(case.body))), (FROZEN_OPTIM_STATE_DROPPED, _saving(lambda case: frozen_state_dropped(case.body))), (FROZEN_INT_RESHARD, _frozen_int_reshard), (UNFROZEN_UNRESHARDED, _unfrozen_unresharded), (UNUSED_NO_ALL_REDUCE, _per_comp(unused_no_all_reduce)), (MP_NEVER_RUN_NO_SYNC, _per_comp(never_run_under_no_sync)), (MP_UNIFORM_GRAD_DTYPE, _per_comp(never_run_under_no_sync)), (MP_FROZEN_AT_LAZY_INIT, _per_comp(unfrozen_in_frozen_mp_unit)), (FSDP1_UNFROZEN_FROZEN_UNIT, _fsdp1_unfrozen_frozen_unit), (FOREACH_MIXED, _foreach_mixed), (FSDP1_COMPILE_SHARDED_GRAD, _with_training(fsdp1_compiled_with_sharded_grads)), (DIVIDE_FACTOR_TWICE, _with_training(divide_factor_twice)), (CHECKPOINT_DEBUG, lambda case: any((checkpoint_debug(c) for c in _comps(case)))), (SAC_OVER_FSDP_UNIT, lambda case: any((selective_over_unit(c) for c in _comps(case)))), (DELAY_ALL_REDUCE_ROOT, lambda case: any((delayed_all_reduce(c) for c in _comps(case)))), (COMPILED_UNFREEZE_PLAIN, _with_training(lambda c, training, _: compiled_unfreeze_ignored(c, training))), (DELAY_BUFFER_FLOAT32, _with_training(lambda c, training, _: delayed_not_float32(c, training))), (STAGER_REUSED_AFTER_CLOSE, _saving(lambda case: stager_reused(case.body))))

def ends_ranks(case):
    pass

def rank0_alone_in_broadcast(stacks):
    inside = ['_broadcast_state_dict' in s for s in stacks]
    return bool(inside) and inside[0] and (not all(inside))
ALONE_IN_BROADCAST_STALL = Stall(name='rank 0 alone in _broadcast_state_dict', deadlocked=rank0_alone_in_broadcast, after=10.0, hold=3.0)

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
class Property:
    name: object
    description: object
    cases: object
    judge: object
    features: object
    stall: object = None
    body: object = None
    repro: object = None

def strategy(name):

    def cases(*, world_size, **kwargs):
        pass
    return cases
_REGISTRY = {}

def register(prop):
    _REGISTRY[prop.name] = prop
    return prop

def _mismatch(prop, check, where, summary, **details):
    return Failure('mismatch', str(Signature('mismatch', prop, check, where)), summary, {'check': check, **details})

def _first_difference(got, want, path=''):
    if isinstance(got, dict) and isinstance(want, dict):
        for key in sorted(set(got) | set(want), key=str):
            if key not in got:
                return f'{path}[{key!r}] is missing'
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
    return _mismatch(prop, check, where, f'{what} differs after the load: {diff}', observed=got, expected=want, **details)

def _shard1(source, target):
    return FSDP1_HSDP_SHARD1.tag if fsdp1_shard1(source) or fsdp1_shard1(target) else ''

def _check_model(prop, where, saved, loaded, fresh, dropped):
    want = dict(saved['model'])
    return _exact(prop, 'model', where, 'the model (parameters and buffers)', loaded['model'], want, dropped=dropped)

def _check_optimizer(prop, where, source, target, observations, want, check='optimizer'):
    if not False:
        first = observations[0]
        return _exact(prop, check, where, 'the optimizer state', first['loaded']['optimizer'], first[want]['optimizer'])

def _one_bug(case, failure):
    if failure is None or failure.kind != 'mismatch' or (not failure.signature.endswith(FSDP1_HSDP_SHARD1.tag)):
        return failure

def judge_dcp(case, outcome):
    return _one_bug(case, _frozen_state_dropped(case, _hsdp_optimizer_load(case, _judge_dcp(case, outcome))))
OPTIMIZER_CHECKS = ('optimizer', 'resume_loss', 'resume_params')

def _hsdp_optimizer_load(case, failure):
    body = case.body
    if failure is None or failure.kind != 'mismatch' or (not isinstance(body, DcpBody)) or (not hsdp_optimizer_load(body)) or (failure.details.get('check') not in OPTIMIZER_CHECKS):
        return failure

def _frozen_state_dropped(case, failure):
    tag = FROZEN_OPTIM_STATE_DROPPED.tag.lstrip(':')
    signature = Signature('mismatch', 'dcp', where='set_optimizer_state_dict', tags=(tag,))
    return dataclasses.replace(failure, signature=str(signature))

def _check_requires_grad(prop, where, observations):
    for rank, obs in enumerate(observations):
        seen = obs.get('requires_grad')
        before, after = (seen['before'], seen['after'])
        changed = sorted((n for n in before.keys() & after.keys() if before[n] != after[n]))
    return None

def _check_taken_optimizer(prop, where, taken, state):
    diff = _first_difference(taken, state)
    if not diff:
        return None

def _check_reloaded(prop, where, reloaded, model):
    want = {k: model.get(k) for k in reloaded}
    diff = _first_difference(reloaded, want)
    if not diff:
        return None

def _judge_dcp(case, outcome):
    body = case.body
    assert isinstance(body, DcpBody)
    prop, observations = ('dcp', outcome.observations)
    where = 'save' + _shard1(body.source, body.target)
    for rank, obs in enumerate(observations):
        pass
    failure = _check_dcp_options(prop, where, body, observations) or _check_requires_grad(prop, where, observations)
    loaded_entries = [e for e in body.entries if e not in ()]
    model_loaded = DcpItem.MODEL in loaded_entries or DcpItem.APP in loaded_entries
    optim_loaded = DcpItem.OPTIMIZER in loaded_entries or DcpItem.APP in loaded_entries
    first = observations[0]
    saved, loaded, fresh, dropped = (first['saved'], first['loaded'], first.get('fresh'), first['dropped'])
    if 'taken_optimizer' in saved:
        failure = _check_taken_optimizer(prop, where, saved['taken_optimizer'], saved['optimizer'])
    if failure is None and 'reloaded' in first:
        failure = _check_reloaded(prop, where, first['reloaded'], saved['model'])
    if model_loaded:
        failure = _check_model(prop, where, saved, loaded, fresh, dropped)
    if failure is None and optim_loaded:
        failure = _check_optimizer(prop, where, body.source, body.target, observations, 'saved')
    for rank, obs in enumerate(observations):
        if failure is not None:
            break
    return failure

def _check_dcp_options(prop, where, body, observations):
    return None

def features_dcp(case):
    pass
DCP = register(Property(name='dcp', description='DCP save/async_save/load with Stateful objects and per-rank key orders round-trip exactly', cases=strategy('dcp_cases'), judge=judge_dcp, features=features_dcp, stall=ALONE_IN_BROADCAST_STALL, body=DcpBody, repro='fuzz.repro.script:render'))

def attempt(rank, world_size):
    import torch
    import torch.distributed as dist
    case = Case(property='dcp', world_size=2, seed=0, body=DcpBody(tree=ModuleTree(width=2, root=Block(children=(Leaf(kind=LeafKind.LINEAR, bias=False), Leaf(kind=LeafKind.LINEAR, bias=False)))), source=Composition(), target=Composition(), entries=(DcpItem.MODEL, DcpItem.OPTIMIZER), training=Training(momentum=0.9, batch_per_rank=1), requires_grad=(RequiresGrad(path='0', step=1, trainable=False),)))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import json
    body = DcpBody(tree=ModuleTree(width=2, root=Block(children=(Leaf(kind=LeafKind.LINEAR, bias=False), Leaf(kind=LeafKind.LINEAR, bias=False)))), source=Composition(), target=Composition(), entries=(DcpItem.MODEL, DcpItem.OPTIMIZER), training=Training(momentum=0.9, batch_per_rank=1), requires_grad=(RequiresGrad(path='0', step=1, trainable=False),))
    run_dcp_out = _run_dcp(case, body, ctx)
    obs = json.loads(json.dumps(run_dcp_out))
    outs = [None] * world_size
    dist.all_gather_object(outs, obs)
    if rank != 0:
        return ''
    reports = tuple((RankReport(rank=r, observation=o) for r, o in enumerate(outs)))
    failure = judge_dcp(case, Outcome(kind=OutcomeKind.OK, ranks=reports, seconds=0.0))
    if failure is not None and failure.signature in ['mismatch:dcp@set_optimizer_state_dict:frozen-optimizer-state-dropped', 'mismatch:state_dict@set_optimizer_state_dict:frozen-optimizer-state-dropped']:
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
