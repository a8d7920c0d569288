#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=8fe6d7b1f8b8192a sources=b2f61a16b7315ba5 seconds=528.8
# Reproduces shardfuzz corpus entry dcp-mismatch-175e579ba153.json: mismatch:dcp@async_save:fsdp1-hsdp-load_sharded_optimizer_state_dict
# Known torch bug: load_sharded_optimizer_state_dict chunks optimizer state over the whole world:
# wrong Adam state in FSDP1 HYBRID_SHARD over a 2-D mesh; upstream: none found.
# Observed: Into FSDP1 HYBRID_SHARD over a 2-D mesh, load_sharded_optimizer_state_dict lays the
# optimizer state out as chunks over the whole world instead of the model's DTensors over the ...
# Run: torchrun --nproc-per-node 4 THIS_FILE.py: prints REPRODUCED and exits 1 while the failure
# is there, else exits 0 (expected: the property's judge finds nothing).

from __future__ import annotations
from dataclasses import dataclass, field
import torch
import enum
from dataclasses import dataclass
from dataclasses import dataclass, field, fields
from dataclasses import replace
import builtins
from typing import ClassVar
import dataclasses
import json
import os
import tempfile
from typing import ClassVar
from torch import nn
from contextlib import contextmanager
import torch.nn.functional as F
import copy
import torch.distributed as dist
import inspect
from dataclasses import dataclass, field, replace
import hashlib
import shutil
from functools import cache
from pathlib import Path
import math
import atexit

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

def param_names(node):
    pass

@dataclass(frozen=True)
class ModuleTree:
    width: object
    root: object

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
class CheckpointOptions:
    debug: object = False

    def names(self):
        pass

@dataclass(frozen=True)
class Composition:
    shards: object = ()
    replicates: object = ()
    checkpoints: object = ()
    mesh: object = ()
    wrapper: object = Wrapper.NONE
    checkpoint_options: object = field(default_factory=CheckpointOptions)

    def reshard_after_forward(self, spec):
        pass

    def steps(self):
        pass

@dataclass(frozen=True)
class Training:
    lr: object = 0.1
    momentum: object = 0.0
    eps: object = 0.001
    steps: object = 2
    dtype: object = Dtype.FLOAT32
    set_to_none: object = True
    param_groups: object = 1
    foreach: object = None

class Body:
    KIND: ClassVar[str]
    PROGRAM: ClassVar[str]
    registry: ClassVar[dict[str, type[Body]]] = {}

    def __init_subclass__(cls, **kwargs):
        pass

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
DEFAULT_FQN_MODIFIERS = '_fqn_modifiers'

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
class WriterOptions:

    def changed(self):
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != f.default}

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
    save_cpu_offload: object = False
    load_cpu_offload: object = False
    async_save: object = False
    storage_objects: object = False
    deadlock: object = False
    overwrite: object = Overwrite.NONE
    cache_staged: object = False
    frozen_in_optimizer: object = False
    empty_group: object = False
    writer: object = field(default_factory=WriterOptions)
    stager: object = None

    @property
    def classic_fsdp1(self):
        pass

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
        self.skipped: frozenset[str] = frozenset()

    def forward(self, x):
        y = x
        for name, child in self.named_children():
            y = child(y)
        if self.scale is not None:
            y = y * self.scale
        if self.shift is not None:
            y = y + self.shift
        return x + y if self.residual else y

def build_leaf():
    pass

def _build_leaf():
    pass

def build_node(node, width):
    if isinstance(node, Leaf):
        return build_leaf()
    return TreeBlock([build_node(c, width) for c in node.children], node.residual, width, node.scale, node.buffer)
FUSED_CHILD = 'fused'

def build_model(tree, device):
    with torch.device(device):
        return build_node(tree.root, 12)
TORCH_DTYPES = {Dtype.FLOAT32: torch.float32, Dtype.FLOAT64: torch.float64, Dtype.BFLOAT16: torch.bfloat16, Dtype.FLOAT16: torch.float16}
_WRAPPER_PREFIXES = ('_fsdp_wrapped_module.', 'module.', '_checkpoint_wrapped_module.', f'{FUSED_CHILD}.')

def clean_name(name):
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, '')
    return name

def mesh_for(ctx):
    if (2, 2):
        return ctx.mesh(tuple((2, 2)), ('replicate', 'shard'))

@dataclass
class Composed:
    model: object
    wrapper: object = Wrapper.NONE
    param_names: object = field(default_factory=list)

    @contextmanager
    def full_parameters(self):
        from torch.distributed.tensor import DTensor
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        modules = {clean_name(n): m for n, m in self.model.named_modules()}
        with FSDP.summon_full_params(self.model):
            out = {}
            for name in self.param_names:
                owner, _, attr = name.rpartition('.')
                out[name] = getattr(modules[owner], attr).detach().clone()
            yield out
        return

def compose(model, comp, ctx):
    from torch.distributed._composable import checkpoint, replicate
    names = [n for n, _ in model.named_parameters()]
    return Composed(model=_wrap(model, comp, ctx), wrapper=comp.wrapper, param_names=names)

def _wrap(model, comp, ctx):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    strategy = {Wrapper.FSDP1_FULL_SHARD: ShardingStrategy.FULL_SHARD, Wrapper.FSDP1_SHARD_GRAD_OP: ShardingStrategy.SHARD_GRAD_OP, Wrapper.FSDP1_NO_SHARD: ShardingStrategy.NO_SHARD, Wrapper.FSDP1_HYBRID_SHARD: ShardingStrategy.HYBRID_SHARD}[comp.wrapper]
    kwargs = {'sharding_strategy': strategy, 'device_id': ctx.device, 'use_orig_params': True}
    if comp.wrapper is Wrapper.FSDP1_HYBRID_SHARD:
        kwargs['device_mesh'] = mesh_for(ctx)
    return FSDP(model, **kwargs)

def make_optimizer(params, training, later=()):
    held = {id(p) for p in later}
    params = [p for p in params if p.requires_grad or id(p) in held]
    groups = params
    foreach = None
    return torch.optim.SGD(groups, lr=training.lr, momentum=training.momentum, foreach=foreach)

def batches(training, ctx):
    dtype = TORCH_DTYPES[training.dtype]
    gen = torch.Generator().manual_seed(0)
    b = 2
    lo = ctx.rank // 1 * b
    out = []
    for _ in range(2):
        step = []
        for _ in range(1):
            x = torch.randn(ctx.world_size * b, 12, generator=gen, dtype=dtype)
            y = torch.randn(ctx.world_size * b, 12, generator=gen, dtype=dtype)
            step.append((x[lo:lo + b].to(ctx.device), y[lo:lo + b].to(ctx.device)))
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
    param_names: object = field(default_factory=dict)
    schedule: object = ()
    step: object = 0

    @property
    def model(self):
        return self.composed.model

    @property
    def plain(self):
        pass

    @property
    def fsdp1(self):
        pass

    def names(self):
        pass

def build_side(tree, comp, training, ctx, *, seed, schedule=()):
    torch.manual_seed(seed)
    device = ctx.device
    model = build_model(tree, device).to(TORCH_DTYPES[training.dtype])
    composed = compose(model, comp, ctx)
    return Side(composed=composed, comp=comp, training=training, schedule=schedule)

def fresh_training(training):
    momentum = 0.5
    return replace(training, lr=0.01 * 0.37, momentum=momentum, eps=0.0001 * 10)

def add_optimizer(side, training):
    params = list(side.model.parameters())
    frozen = []
    side.opt = make_optimizer(params, training, later=frozen)
    side.param_names = {id(p): clean_name(n) for n, p in side.model.named_parameters()}
    return side.opt

def body_optimizer(side, training):
    return add_optimizer(side, training)

def all_batches(training, steps, tree, ctx):
    return [step[0] for step in batches(replace(training, steps=steps), ctx)]

def train_steps(side, data, ctx):
    assert side.opt is not None
    losses = []
    for x, y in data:
        side.step += 1
        loss = F.mse_loss(side.model(x).to(y.dtype), y)
        loss.backward()
        side.opt.step()
        side.opt.zero_grad(set_to_none=False)
        losses.append(loss.item())
    return losses

def _flat(t):
    from torch.distributed.tensor import DTensor
    return [float(v) for v in t.detach().double().cpu().flatten().tolist()]

def observe_model(side):
    with side.composed.full_parameters() as params:
        out = {n: [float(v) for v in t.double().cpu().flatten().tolist()] for n, t in params.items()}
    for n, b in side.model.named_buffers():
        out[clean_name(n)] = _flat(b)
    return out

def _jsonable(value):
    pass

def observe_groups(side):
    pass

def observe_optimizer(side):
    pass

def probe(side, case, tree, ctx):
    pass

def observe(side, case, tree, ctx, *, model=True):
    obs = {'groups': observe_groups(side)}
    params = observe_model(side)
    optim = observe_optimizer(side)
    out = probe(side, case, tree, ctx)
    obs['optimizer_local'] = optim
    if ctx.rank == 0:
        obs.update(model=params, probe=out)
    return obs

def dropped_keys(side, drop):
    pass

def fsdp1_state_dict_type(side, *, full, offload, rank0_only=False):
    from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig, ShardedOptimStateDictConfig, ShardedStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    FSDP.set_state_dict_type(side.model, StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig(offload_to_cpu=offload), ShardedOptimStateDictConfig(offload_to_cpu=offload))

def fsdp1_optim_state_dict(side):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    assert side.opt is not None
    osd = FSDP.optim_state_dict(side.model, side.opt)
    return osd

def fsdp1_load_optimizer(side, osd):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    assert side.opt is not None
    side.opt.load_state_dict(FSDP.optim_state_dict_to_load(side.model, side.opt, osd))

def torch_kwargs(fn, kwargs):
    params = inspect.signature(fn).parameters
    missing = sorted((k for k in kwargs if k not in params))
    return kwargs

def resume_source(case, src, data, ctx):
    losses = train_steps(src, data, ctx)
    return (losses, observe_model(src))

def resume_both(case, src, tgt, data, ctx, source_done=None):
    obs = {}
    losses_src, final_src = resume_source(case, src, data, ctx)
    obs['losses_source'] = losses_src
    obs['losses_target'] = train_steps(tgt, data, ctx)
    final_tgt = observe_model(tgt)
    if ctx.rank == 0:
        obs['final_source'], obs['final_target'] = (final_src, final_tgt)
    return obs

def case_dir(case, ctx):
    digest = hashlib.sha1('{"body": {"absent": false, "async_save": true, "async_saves": 0, "cache_staged": false, "checkpoint_dir": "", "convert": false, "deadlock": false, "drop": [], "empty_group": false, "entries": ["model", "optimizer", "counter", "scalars", "extra"], "frozen_in_optimizer": false, "kind": "dcp", "load_cpu_offload": true, "load_full_state_dict": false, "load_planner": null, "mode": "round_trip", "module_stateful": false, "no_dist": false, "orders": [[0, 3, 1, 4, 2], [0, 4, 2, 3, 1], [0, 4, 2, 1, 3], [0, 2, 1, 3, 4]], "overwrite": "true", "own_group": false, "patched": false, "process_checkpointer": false, "requires_grad": [], "save_cpu_offload": true, "save_full_state_dict": false, "save_planner": null, "skip": [], "source": {"auto_wrap": false, "checkpoint_first": true, "checkpoint_options": {"context_fn": "none", "debug": false, "determinism_check": null, "early_stop": null, "preserve_rng_state": true}, "checkpoints": [], "find_unused": false, "knobs": {"abort_and_reset": false, "all_reduce_hook_scale": null, "backward_prefetch": 0, "custom_all_gather": false, "custom_reduce_scatter": false, "explicit_unshard": false, "force_sum_reduction": false, "forward_prefetch": 0, "gradient_divide_factor": null, "late_reshard_after_forward": null, "no_unshard_in_backward": false, "pg_allocator": false, "reduce_scatter_unused": false, "reshard_after_backward_last": false, "rs_max_buffers": 0, "separate_rs_group": false}, "mesh": [], "meta_init": false, "replicate_options": {"batched_grad_copy": false, "bucket_cap_mb": null, "bucket_cap_mb_list": [], "delay_all_reduce": false, "device_id": false, "dim": 0, "forward_sync_buffers": null, "gradient_as_bucket_view": false, "group": "default", "ignored_modules": [], "init_sync": true, "skip_all_reduce_unused_params": false, "static_graph": false}, "replicates": [], "shards": [], "spmd": false, "spmd_mse_loss": false, "tp": [], "tp_size": 1, "wrapper": "fsdp1_full_shard"}, "stager": null, "steps_after": 1, "storage_objects": true, "target": {"auto_wrap": false, "checkpoint_first": true, "checkpoint_options": {"context_fn": "none", "debug": false, "determinism_check": null, "early_stop": null, "preserve_rng_state": true}, "checkpoints": [], "find_unused": false, "knobs": {"abort_and_reset": false, "all_reduce_hook_scale": null, "backward_prefetch": 0, "custom_all_gather": false, "custom_reduce_scatter": false, "explicit_unshard": false, "force_sum_reduction": false, "forward_prefetch": 0, "gradient_divide_factor": null, "late_reshard_after_forward": null, "no_unshard_in_backward": false, "pg_allocator": false, "reduce_scatter_unused": false, "reshard_after_backward_last": false, "rs_max_buffers": 0, "separate_rs_group": false}, "mesh": [2, 2], "meta_init": false, "replicate_options": {"batched_grad_copy": false, "bucket_cap_mb": null, "bucket_cap_mb_list": [], "delay_all_reduce": false, "device_id": false, "dim": 0, "forward_sync_buffers": null, "gradient_as_bucket_view": false, "group": "default", "ignored_modules": [], "init_sync": true, "skip_all_reduce_unused_params": false, "static_graph": false}, "replicates": [], "shards": [], "spmd": false, "spmd_mse_loss": false, "tp": [], "tp_size": 1, "wrapper": "fsdp1_hybrid_shard"}, "target_meta_init": false, "torch_save_reader": false, "training": {"accum_sync": "always", "batch_per_rank": 2, "compile": "none", "dtype": "float32", "eps": 0.0001, "foreach": null, "grad_accum": 1, "lr": 0.01, "momentum": 0.9, "optimizer": "sgd", "param_groups": 1, "same_input": false, "set_to_none": false, "skips": [], "steps": 1, "unfreeze": []}, "tree": {"root": {"buffer": false, "children": [{"buffer": true, "children": [{"bias": true, "frozen": false, "kind": "relu"}, {"buffer": false, "children": [{"bias": true, "frozen": false, "kind": "relu"}, {"bias": true, "frozen": true, "kind": "conv1d"}], "residual": false, "scale": true}], "residual": false, "scale": false}, {"bias": false, "frozen": true, "kind": "conv1d"}, {"buffer": true, "children": [{"bias": true, "frozen": false, "kind": "relu"}], "residual": true, "scale": false}], "residual": false, "scale": false}, "width": 12}, "use_collectives": true, "writer": {"per_thread_copy_ahead": 10000000, "single_file_per_rank": true, "sync_files": true, "thread_count": 1}}, "property": "dcp", "schema": 1, "seed": 0, "world_size": 4}'.encode()).hexdigest()[:12]
    count = getattr(ctx, '_cases', 0)
    return os.path.join('/tmp/shardfuzz-dcp-3201', f'{digest}-{count}')

def _options(full, offload, *, load, strict=True):
    pass

def _values(body, case, side, ctx, get, put, fresh, skip):
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
    out = {}
    salt = 0
    for entry in body.entries:
        if entry is DcpItem.MODEL:
            out[entry] = side.model.state_dict()
        elif entry is DcpItem.OPTIMIZER:
            assert side.opt is not None
            if not fresh:
                out[entry] = fsdp1_optim_state_dict(side)
        elif entry is DcpItem.SCALARS:
            pass
        elif entry is DcpItem.COUNTER:
            pass
    return out

def prepare_side(body, side, options):
    fsdp1_state_dict_type(side, full=False, offload=True)

def _observe_saved(body, case, src, ctx, values):
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
    saved = {**observe(src, case, body.tree, ctx), **_observe_entries(values)}
    taken = values.get(DcpItem.OPTIMIZER)
    moves = any((e in body.entries and e not in () for e in (DcpItem.OPTIMIZER, DcpItem.APP)))
    return saved

def _arrange(body, values, ctx):
    order = ((0, 3, 1, 4, 2), (0, 4, 2, 3, 1), (0, 4, 2, 1, 3), (0, 2, 1, 3, 4))[ctx.rank] if ((0, 3, 1, 4, 2), (0, 4, 2, 3, 1), (0, 4, 2, 1, 3), (0, 2, 1, 3, 4)) else range(len(body.entries))
    return {body.entries[i].value: values[body.entries[i]] for i in order if body.entries[i] in values}

def _tensors(value, path=''):
    pass

def _writer(body, path, **options):
    import torch.distributed.checkpoint as dcp
    return dcp.FileSystemWriter(path, **options, **torch_kwargs(dcp.FileSystemWriter, body.writer.changed()))

def _writer_kwargs(body, path, overwrite=None):
    kwargs = {}
    options = {'overwrite': overwrite}
    kwargs['storage_writer'] = _writer(body, path, **options)
    return kwargs

def _wait(result):
    future = getattr(result, 'upload_completion', result)
    future.result()

def _save(body, state, path, overwrite=None):
    import torch.distributed.checkpoint as dcp
    kwargs = _writer_kwargs(body, path, overwrite)
    stager = _stager(body)
    try:
        _wait(dcp.async_save(state, **kwargs, **_async_kwargs(body, stager)))
    finally:
        _close(stager)

def _stager(body):
    pass

def _close(stager):
    pass

def _async_kwargs(body, stager):
    kwargs = {}
    return kwargs

def _load(body, state, path):
    import torch.distributed.checkpoint as dcp
    kwargs = {}
    dcp.load(state, storage_reader=dcp.FileSystemReader(path), **kwargs)

def _save_over(body, state, path, ctx):
    _save(body, state, path, overwrite=True)
    return {}

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

def run_dcp(case, body, ctx):
    return _run_dcp(case, body, ctx)

def _run_dcp(case, body, ctx):
    t = body.training
    get_save = _options(False, True, load=False)
    get_load = _options(False, True, load=False)
    put = _options(False, True, load=True, strict=not ())
    path = '' or case_dir(case, ctx)
    own = path
    obs = {}
    data = all_batches(t, 1 + 1, body.tree, ctx)
    src = None
    source_done = None
    src = build_side(body.tree, body.source, t, ctx, seed=0, schedule=())
    body_optimizer(src, t)
    prepare_side(body, src, get_save)
    obs['losses_before'] = train_steps(src, data[:1], ctx)
    values = _values(body, case, src, ctx, get_save, put, fresh=False, skip=())
    state = _arrange(body, values, ctx)
    obs['overwrite'] = _save_over(body, state, path, ctx)
    obs['saved'] = _observe_saved(body, case, src, ctx, values)
    tgt = build_side(body.tree, body.target, t, ctx, seed=0 + FRESH_SEED, schedule=())
    body_optimizer(tgt, fresh_training(t))
    prepare_side(body, tgt, put)
    dropped = dropped_keys(tgt, ())
    obs['dropped'] = dropped
    obs['fresh'] = observe(tgt, case, body.tree, ctx, model=not False)
    values = _values(body, case, tgt, ctx, get_load, put, fresh=True, skip=())
    state = _arrange(body, values, ctx)
    plain = {k: v for k, v in state.items() if isinstance(v, (dict, torch.Tensor))}
    tensors = {k: _tensors(v) for k, v in plain.items()}
    _load(body, state, own)
    _finish_load(body, tgt, values, put, own)
    obs['loaded'] = {**observe(tgt, case, body.tree, ctx), **_observe_entries(values)}
    obs.update(resume_both(case, src, tgt, data[1:], ctx, source_done))
    dist.barrier()
    if ctx.rank == 0:
        shutil.rmtree(path, ignore_errors=True)
    return obs

def _finish_load(body, side, values, put, path):
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict
    _finish_fsdp1_load(body, side, values, path)
    return

def _finish_fsdp1_load(body, side, values, path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.optimizer import load_sharded_optimizer_state_dict
    side.model.load_state_dict(values[DcpItem.MODEL])
    loaded = load_sharded_optimizer_state_dict(model_state_dict=side.model.state_dict(), optimizer_key='optimizer', storage_reader=dcp.FileSystemReader(path))
    fsdp1_load_optimizer(side, loaded['optimizer'])

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
KNOWN_BUG_ODDS = 16
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
    introduced_in: object = ''
    conditional: object = False
    training_only: object = False

    @property
    def fix(self):
        pass
FSDP1_HSDP_SHARD1 = KnownBug('fsdp1-hybrid-shard-dim-1', 'FSDP1 HYBRID_SHARD with a shard dimension of size 1 never averages gradients across replicas', symptoms=frozenset({'mismatch'}), upstream='pytorch/pytorch#154888', relation='same bug', ends_ranks=False, tag=':shard1')
FSDP1_HSDP_OPTIMIZER_LOAD = KnownBug('fsdp1-hsdp-load_sharded_optimizer_state_dict', 'load_sharded_optimizer_state_dict chunks optimizer state over the whole world: wrong Adam state in FSDP1 HYBRID_SHARD over a 2-D mesh', symptoms=frozenset({'mismatch'}), relation='none found after four phrasings; related: a review there notes that this function does not know the right rank and world size (see_also)', state='present in torch 2.13.0', see_also=('pytorch/pytorch#111096', 'pytorch/pytorch#145978'), ends_ranks=False, tag=':fsdp1-hsdp-load_sharded_optimizer_state_dict')

def fsdp1_shard1(comp):
    pass

def fsdp1_hsdp_2d(comp):
    return comp.wrapper is Wrapper.FSDP1_HYBRID_SHARD and (2, 2)[0] > 1 and ((2, 2)[1] > 1)

def hsdp_optimizer_load(body):
    return isinstance(body, DcpBody) and fsdp1_hsdp_2d(body.target) and True and (DcpItem.OPTIMIZER in body.entries) and (DcpItem.OPTIMIZER not in ())

def ends_ranks(case):
    pass
RESUME_LOSS, RESUME_PARAMS = ('resume_loss', 'resume_params')
RESUME_CHECKS = (RESUME_LOSS, RESUME_PARAMS)

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

def judged_prefix(expected):
    return next((i for i, v in enumerate(expected) if not math.isfinite(v)), len(expected))

def _mismatch(prop, check, where, summary, **details):
    return Failure('mismatch', str(Signature('mismatch', prop, check, where)), summary, {'check': check, **details})

def _first_difference(got, want, path=''):
    pass

def _shard1(source, target):
    return FSDP1_HSDP_SHARD1.tag if fsdp1_shard1(source) or fsdp1_shard1(target) else ''

def _check_model(prop, where, saved, loaded, fresh, dropped):
    pass

def _same_operations(source, target):
    pass

def _check_resume(prop, where, case, same, observations):
    body = case.body
    tol = tolerance_for('float32')
    diverged = False
    for rank, obs in enumerate(observations):
        got, want = (obs['losses_target'], obs['losses_source'])
        judged = judged_prefix(want)
        diverged = diverged or judged < len(want)
        bad = first_mismatch(got[:judged], want[:judged], tol) if not same else next((i for i, (g, w) in enumerate(zip(got[:judged], want[:judged])) if g != w), None)
    first = observations[0]
    got_p, want_p = (first['final_target'], first['final_source'])
    for name, want_v in want_p.items():
        bad_p = first_mismatch(got_p.get(name, []), want_v, tol)
        if bad_p is not None:
            return _mismatch(prop, RESUME_PARAMS, where, f'{name}[{bad_p.index}] is {bad_p.actual!r} after resuming, uninterrupted {bad_p.expected!r} (error {bad_p.error:.3g} > allowed {bad_p.allowed:.3g})', param=name)
    return None

def _one_bug(case, failure):
    if failure is None or failure.kind != 'mismatch' or (not failure.signature.endswith(FSDP1_HSDP_SHARD1.tag)):
        return failure

def judge_dcp(case, outcome):
    return _one_bug(case, _optimizer_load_bug(case, _hsdp_optimizer_load(case, _judge_dcp(case, outcome))))
OPTIMIZER_CHECKS = ('optimizer', *RESUME_CHECKS)

def _hsdp_optimizer_load(case, failure):
    body = case.body
    if failure is None or failure.kind != 'mismatch' or (not isinstance(body, DcpBody)) or (not hsdp_optimizer_load(body)) or (failure.details.get('check') not in OPTIMIZER_CHECKS):
        return failure
    where = 'async_save'
    tag = FSDP1_HSDP_OPTIMIZER_LOAD.tag.lstrip(':')
    return dataclasses.replace(failure, signature=str(Signature('mismatch', 'dcp', where=where, tags=(tag,))))

def _optimizer_load_bug(case, failure):
    body = case.body
    return failure

def _judge_dcp(case, outcome):
    body = case.body
    assert isinstance(body, DcpBody)
    prop, observations = ('dcp', outcome.observations)
    where = 'async_save' + _shard1(body.source, body.target)
    for rank, obs in enumerate(observations):
        pass
    loaded_entries = [e for e in body.entries if e not in ()]
    model_loaded = DcpItem.MODEL in loaded_entries or DcpItem.APP in loaded_entries
    optim_loaded = DcpItem.OPTIMIZER in loaded_entries or DcpItem.APP in loaded_entries
    first = observations[0]
    saved, loaded, fresh, dropped = (first['saved'], first['loaded'], first.get('fresh'), first['dropped'])
    if model_loaded:
        failure = _check_model(prop, where, saved, loaded, fresh, dropped)
    if failure is None and optim_loaded:
        pass
    for rank, obs in enumerate(observations):
        want_groups = obs['saved']['groups'] if optim_loaded else obs['fresh']['groups']
        for key in ('scalars', 'counter', 'extra'):
            if failure is None and key in obs['loaded']:
                got, want = (obs['loaded'][key], obs['saved'][key])
                if key == 'counter':
                    got = {k: v for k, v in got.items() if k != 'agreed'}
                    want = {k: v for k, v in want.items() if k != 'agreed'}
    if failure is None and model_loaded and (not dropped):
        pass
    if failure is None:
        failure = _check_resume(prop, where, case, _same_operations(body.source, body.target), observations)
    return failure

def attempt(rank, world_size):
    import torch
    import torch.distributed as dist
    case = Case(property='dcp', world_size=4, seed=0, body=DcpBody(tree=ModuleTree(width=12, root=Block(children=(Block(children=(Leaf(kind=LeafKind.RELU), Block(children=(Leaf(kind=LeafKind.RELU), Leaf(kind=LeafKind.CONV1D, frozen=True)), scale=True)), buffer=True), Leaf(kind=LeafKind.CONV1D, bias=False, frozen=True), Block(children=(Leaf(kind=LeafKind.RELU),), residual=True, buffer=True)))), source=Composition(wrapper=Wrapper.FSDP1_FULL_SHARD), target=Composition(mesh=(2, 2), wrapper=Wrapper.FSDP1_HYBRID_SHARD), entries=(DcpItem.MODEL, DcpItem.OPTIMIZER, DcpItem.COUNTER, DcpItem.SCALARS, DcpItem.EXTRA), training=Training(lr=0.01, momentum=0.9, eps=0.0001, steps=1, set_to_none=False), orders=((0, 3, 1, 4, 2), (0, 4, 2, 3, 1), (0, 4, 2, 1, 3), (0, 2, 1, 3, 4)), save_cpu_offload=True, load_cpu_offload=True, async_save=True, storage_objects=True, overwrite=Overwrite.TRUE))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import json
    obs = json.loads(json.dumps(run_dcp(case, DcpBody(tree=ModuleTree(width=12, root=Block(children=(Block(children=(Leaf(kind=LeafKind.RELU), Block(children=(Leaf(kind=LeafKind.RELU), Leaf(kind=LeafKind.CONV1D, frozen=True)), scale=True)), buffer=True), Leaf(kind=LeafKind.CONV1D, bias=False, frozen=True), Block(children=(Leaf(kind=LeafKind.RELU),), residual=True, buffer=True)))), source=Composition(wrapper=Wrapper.FSDP1_FULL_SHARD), target=Composition(mesh=(2, 2), wrapper=Wrapper.FSDP1_HYBRID_SHARD), entries=(DcpItem.MODEL, DcpItem.OPTIMIZER, DcpItem.COUNTER, DcpItem.SCALARS, DcpItem.EXTRA), training=Training(lr=0.01, momentum=0.9, eps=0.0001, steps=1, set_to_none=False), orders=((0, 3, 1, 4, 2), (0, 4, 2, 3, 1), (0, 4, 2, 1, 3), (0, 2, 1, 3, 4)), save_cpu_offload=True, load_cpu_offload=True, async_save=True, storage_objects=True, overwrite=Overwrite.TRUE), ctx)))
    outs = [None] * world_size
    dist.all_gather_object(outs, obs)
    if rank != 0:
        return ''
    reports = tuple((RankReport(rank=r, observation=o) for r, o in enumerate(outs)))
    failure = judge_dcp(case, Outcome(kind=OutcomeKind.OK, ranks=reports, seconds=0.0))
    if failure is not None and failure.signature in ['mismatch:dcp@async_save:fsdp1-hsdp-load_sharded_optimizer_state_dict']:
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
