#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=0845a1e0c476c07f sources=9d7be58e4208c9df seconds=534.5
"""Reproduces shardfuzz corpus entry dcp-exception-11c7f72baa01.json: exception:dcp:torch.distributed.checkpoint.api.CheckpointException@torch/distributed/checkpoint/default_planner.py:create_default_local_load_plan
Known torch bug: dcp.load of an FSDP1 sharded state dict where a rank holds no chunk of a
parameter: the planner guesses a pre-2.4 checkpoint, 'Missing key in checkpoint state_dict';
upstream: https://github.com/pytorch/pytorch/issues/163480.
Observed: rank 0 raised torch.distributed.checkpoint.api.CheckpointException:
CheckpointException ranks:dict_keys([1]) Traceback (most recent call last): (RANK 1) File ...
Run: torchrun --nproc-per-node 2 THIS_FILE.py: prints REPRODUCED and exits 1 while the
failure is there, else exits 0 (expected: no rank raises).
"""

from __future__ import annotations
from dataclasses import dataclass, field
import torch
import enum
from dataclasses import dataclass
from dataclasses import dataclass, field, fields
from functools import cached_property
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
    _meshes: object = field(default_factory=dict)

    def mesh(self, shape, names):
        ...
    _cases: object = 0
    extra_groups: object = field(default_factory=list)
    _groups: object = field(default_factory=dict)

    def group(self, name):
        ...

    def _check_in_step(self):
        ...

    def end_case(self):
        ...

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

    def __post_init__(self):
        pass

@dataclass(frozen=True)
class Block:
    children: object
    residual: object = False
    scale: object = False
    buffer: object = False

    def __post_init__(self):
        pass

def param_names(node):
    ...

@dataclass(frozen=True)
class ModuleTree:
    width: object
    root: object

    def __post_init__(self):
        pass

    def paths(self):
        pass

    @property
    def size(self):
        ...

class Wrapper(str, enum.Enum):
    NONE = 'none'
    DDP = 'ddp'
    FSDP1_FULL_SHARD = 'fsdp1_full_shard'
    FSDP1_SHARD_GRAD_OP = 'fsdp1_shard_grad_op'
    FSDP1_NO_SHARD = 'fsdp1_no_shard'
    FSDP1_HYBRID_SHARD = 'fsdp1_hybrid_shard'

@dataclass(frozen=True)
class CheckpointOptions:
    preserve_rng_state: object = True
    determinism_check: object = None
    debug: object = False
    early_stop: object = None

    @property
    def is_set(self):
        return self != CheckpointOptions()

    def names(self):
        ...

@dataclass(frozen=True)
class Composition:
    shards: object = ()
    replicates: object = ()
    checkpoints: object = ()
    checkpoint_first: object = True
    mesh: object = ()
    wrapper: object = Wrapper.NONE
    auto_wrap: object = False
    meta_init: object = False
    tp: object = ()
    tp_size: object = 1
    find_unused: object = False
    checkpoint_options: object = field(default_factory=CheckpointOptions)

    def __post_init__(self):
        pass

    def uniform_precision(self):
        ...

    def reshard_after_forward(self, spec):
        ...

    @property
    def sharded_paths(self):
        ...

    @property
    def shard_ignored(self):
        ...

    def steps(self):
        order = {'checkpoint': 0 if self.checkpoint_first else 3, 'fully_shard': 1, 'replicate': 2}
        items = [('checkpoint', p) for p in self.checkpoints] + [('replicate', p) for p in self.replicates]
        items += [('fully_shard', spec.path) for spec in self.shards]

        def key(item):
            ...
        return sorted(items, key=key)

    def _spec_paths(self, api, path):
        ...

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
    grad_accum: object = 1
    set_to_none: object = True
    same_input: object = False
    param_groups: object = 1
    foreach: object = None
    skips: object = ()
    unfreeze: object = ()

    def __post_init__(self):
        pass

    def skipped_at(self, step, microbatch):
        ...

    def unused_on_some_microbatches(self, tree):
        ...

def _check_checkpoint_options(tree, comp, where):
    if comp.checkpoint_options.preserve_rng_state:
        return

def _check_tp(tree, comp, where):
    paths = tree.paths()
    used = []

def check_mesh(comp, world_size, where='composition'):
    shard_size = comp.mesh[1] if comp.mesh else world_size // comp.tp_size

class Body:
    KIND: ClassVar[str]
    PROGRAM: ClassVar[str]
    registry: ClassVar[dict[str, type[Body]]] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        Body.registry[cls.KIND] = cls

    def validate_for(self, world_size):
        ...

    @property
    def size(self):
        ...

@dataclass(frozen=True)
class Case:
    property: object
    world_size: object
    seed: object
    body: object

    def __post_init__(self):
        self.body.validate_for(self.world_size)

    @builtins.property
    def size(self):
        ...
SCHEMA_VERSION = 1

def case_to_json(case):
    pass

def case_to_text(case):
    return json.dumps(case_to_json(case), sort_keys=True)

def dcp_root(driver_pid):
    return os.path.join(tempfile.gettempdir(), f'shardfuzz-dcp-{driver_pid}')

def is_plain(comp):
    return not comp.shards and (not comp.replicates) and (comp.wrapper is Wrapper.NONE)

def is_fsdp1(comp):
    return comp.wrapper.value.startswith('fsdp1')

def _check_side(comp, tree, where):
    pass

def _check_common(tree, source, target, training, steps_after, meta):
    _check_side(source, tree, 'source')
    _check_side(target, tree, 'target')

def _check_drop(drop):
    pass

def _check_frozen_in_optimizer(tree, frozen_in_optimizer):
    pass

def _check_schedule(body):
    problem = schedule_problem(body.tree, body.source, body.target, body.training, body.steps_after, body.requires_grad, body.frozen_in_optimizer)

def schedule_problem(tree, source, target, training, steps_after, changes, frozen_in_optimizer):
    if not changes:
        return None

@dataclass(frozen=True)
class Options:
    full_state_dict: object = False
    cpu_offload: object = False
    broadcast_from_rank0: object = False
    strict: object = True
    ignore_frozen_params: object = False
    flatten_optimizer_state_dict: object = False

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
    steps_after: object = 1
    orders: object = ()
    skip: object = ()
    drop: object = ()
    save_full_state_dict: object = False
    save_cpu_offload: object = False
    load_full_state_dict: object = False
    load_cpu_offload: object = False
    module_stateful: object = False
    patched: object = False
    async_save: object = False
    storage_objects: object = False
    target_meta_init: object = False
    mode: object = DcpMode.ROUND_TRIP
    checkpoint_dir: object = ''
    deadlock: object = False
    async_saves: object = 0
    cache_staged: object = False
    no_dist: object = False
    frozen_in_optimizer: object = False
    empty_group: object = False
    save_planner: object = None
    load_planner: object = None
    absent: object = False
    convert: object = False
    own_group: object = False
    requires_grad: object = ()
    stager: object = None
    process_checkpointer: object = False
    use_collectives: object = True
    torch_save_reader: object = False

    def reloads_elsewhere(self):
        pass

    def reloads_in_half_world(self, world_size):
        ...

    def __post_init__(self):
        _check_common(self.tree, self.source, self.target, self.training, self.steps_after, self.target_meta_init)
        _check_drop(self.drop)
        _check_frozen_in_optimizer(self.tree, self.frozen_in_optimizer)
        _check_schedule(self)
        self._check_options()
        self._check_async_options()
        entries = self.entries
        if is_fsdp1(self.source) or is_fsdp1(self.target):
            self._check_fsdp1()
        self._check_saves()

    @property
    def classic_fsdp1(self):
        return (is_fsdp1(self.source) or is_fsdp1(self.target)) and (not self.patched) and (DcpItem.APP not in self.entries)

    def _check_fsdp1(self):
        pass

    def _check_saves(self):
        round_trip = self.mode is DcpMode.ROUND_TRIP

    def _check_options(self):
        fsdp1 = is_fsdp1(self.source) or is_fsdp1(self.target)
        for name in ('absent', 'convert'):
            if not getattr(self, name):
                continue

    def _check_async_options(self):
        for name in ('stager', 'process_checkpointer'):
            if getattr(self, name) in (None, False):
                continue

    def _check_rank_local(self):
        ...

    def _check_torch_save_reader(self):
        ...

    def _check_no_dist(self):
        ...

    @property
    def size(self):
        ...

    def collective_entries(self):
        ...

    def validate_for(self, world_size):
        for where, comp in (('source', self.source), ('target', self.target)):
            if not is_plain(comp):
                check_mesh(comp, world_size, where)
        n = len(self.entries)

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

def build_leaf(leaf, width):
    module = _build_leaf(leaf, width)
    return module

def _build_leaf(leaf, width):
    if leaf.kind is LeafKind.LINEAR:
        return nn.Linear(width, width, bias=leaf.bias)
    if leaf.kind is LeafKind.LAYER_NORM:
        return nn.LayerNorm(width, bias=leaf.bias)
    if leaf.kind is LeafKind.TANH:
        return nn.Tanh()

def build_node(node, width):
    if isinstance(node, Leaf):
        return build_leaf(node, width)
    return TreeBlock([build_node(c, width) for c in node.children], node.residual, width, node.scale, node.buffer)

def build_model(tree, device):
    with torch.device(device):
        return build_node(tree.root, tree.width)

def checkpoint_kwargs(opts):
    kwargs = {}
    if not opts.is_set:
        return kwargs
TORCH_DTYPES = {Dtype.FLOAT32: torch.float32, Dtype.FLOAT64: torch.float64, Dtype.BFLOAT16: torch.bfloat16, Dtype.FLOAT16: torch.float16}
_WRAPPER_PREFIXES = ('_fsdp_wrapped_module.', 'module.', '_checkpoint_wrapped_module.')

def clean_name(name):
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, '')
    return name

@dataclass
class Composed:
    model: object
    fsdp_roots: object = field(default_factory=list)
    wrapper: object = Wrapper.NONE
    param_names: object = field(default_factory=list)
    knobs: object = None

    def no_sync(self):
        ...

    def set_sync(self, requires_gradient_sync=True, requires_all_reduce=True):
        ...

    @contextmanager
    def full_parameters(self):
        from torch.distributed.tensor import DTensor
        if self.wrapper.value.startswith('fsdp1'):
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            modules = {clean_name(n): m for n, m in self.model.named_modules()}
            with FSDP.summon_full_params(self.model):
                out = {}
                for name in self.param_names:
                    owner, _, attr = name.rpartition('.')
                    out[name] = getattr(modules[owner], attr).detach().clone()
                yield out
            return

def compose(model, comp, ctx, tree=None):
    from torch.distributed._composable import checkpoint, replicate
    ckpt_kwargs = checkpoint_kwargs(comp.checkpoint_options)
    if comp.wrapper is not Wrapper.NONE:
        names = [n for n, _ in model.named_parameters()]
        return Composed(model=_wrap(model, comp, ctx), wrapper=comp.wrapper, param_names=names)

def _wrap(model, comp, ctx):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    strategy = {Wrapper.FSDP1_FULL_SHARD: ShardingStrategy.FULL_SHARD, Wrapper.FSDP1_SHARD_GRAD_OP: ShardingStrategy.SHARD_GRAD_OP, Wrapper.FSDP1_NO_SHARD: ShardingStrategy.NO_SHARD, Wrapper.FSDP1_HYBRID_SHARD: ShardingStrategy.HYBRID_SHARD}[comp.wrapper]
    kwargs = {'sharding_strategy': strategy, 'device_id': ctx.device, 'use_orig_params': True}
    return FSDP(model, **kwargs)

def full_parameters(model):
    ...
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
        return is_plain(self.comp)

    @property
    def fsdp1(self):
        return is_fsdp1(self.comp)

    def names(self):
        current = {id(p): clean_name(n) for n, p in self.model.named_parameters()}
        return {**self.param_names, **current}

def build_side(tree, comp, training, ctx, *, seed, meta=False, schedule=()):
    torch.manual_seed(seed)
    device = torch.device('meta') if meta else ctx.device
    model = build_model(tree, device).to(TORCH_DTYPES[training.dtype])
    composed = Composed(model) if is_plain(comp) else compose(model, comp, ctx)
    return Side(composed=composed, comp=comp, training=training, schedule=schedule)

def change_requires_grad(side, step):
    changes = [c for c in side.schedule if c.step == step]
    if not changes:
        return

def catch_up(side, steps):
    for step in range(side.step, steps):
        change_requires_grad(side, step)
    side.step = max(side.step, steps)

def requires_grad(side):
    return {clean_name(n): p.requires_grad for n, p in side.model.named_parameters()}

def fresh_training(training):
    momentum = 0.5 if training.optimizer is Optimizer.SGD and training.momentum else 0.0
    return replace(training, lr=training.lr * 0.37, momentum=momentum, eps=training.eps * 10)

def body_optimizer(side, training, body):
    pass

def seed_segment(case, ctx, segment):
    torch.manual_seed((case.seed * 7919 + segment * 104729 + ctx.rank + 1) % 2 ** 63)

def all_batches(case, training, steps, tree, ctx):
    pass

def _flat(t):
    from torch.distributed.tensor import DTensor
    return [float(v) for v in t.detach().double().cpu().flatten().tolist()]

def reshard(model):
    from torch.distributed.fsdp import FSDPModule
    for module in model.modules():
        pass

def dropped_keys(side, drop):
    if not drop:
        return []

def fsdp1_state_dict_type(side, *, full, offload, rank0_only=False):
    from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig, ShardedOptimStateDictConfig, ShardedStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    FSDP.set_state_dict_type(side.model, StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig(offload_to_cpu=offload), ShardedOptimStateDictConfig(offload_to_cpu=offload))

def case_dir(case, ctx):
    digest = hashlib.sha1(case_to_text(case).encode()).hexdigest()[:12]
    count = getattr(ctx, '_cases', 0)
    return os.path.join(dcp_root(os.environ.get('SHARDFUZZ_PARENT_PID', os.getppid())), f'{digest}-{count}')

def scalar_values(case, body, rank=0):
    s = (case.seed + (rank * 7919 if body.no_dist else 0)) % 100003
    return {'step': body.training.steps, 'loss': s / 7.0, 'tag': f'case-{s}', 'done': bool(s % 2), 'history': [s / 3.0, -1.5, 1e-300]}

class Scalars:

    def __init__(self, values):
        self.values = dict(values)

    def state_dict(self):
        return dict(self.values)

    def load_state_dict(self, state_dict):
        ...

def _options(full, offload, *, load, strict=True):
    return Options(full_state_dict=full, cpu_offload=offload, broadcast_from_rank0=load and full and offload, strict=strict)

def _values(body, case, side, ctx, get, put, fresh, skip):
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
    out = {}
    salt = ctx.rank if body.no_dist else 0
    classic = side.fsdp1 and body.classic_fsdp1
    for entry in body.entries:
        if entry is DcpItem.MODEL:
            if classic:
                out[entry] = side.model.state_dict()
        elif entry is DcpItem.SCALARS:
            values = scalar_values(case, body, salt)
            out[entry] = Scalars({k: type(v)() if fresh else v for k, v in values.items()})
    return out

def prepare_side(body, side, options):
    if side.fsdp1 and body.classic_fsdp1:
        fsdp1_state_dict_type(side, full=False, offload=options.cpu_offload)

def _arrange(body, values, ctx):
    order = body.orders[ctx.rank] if body.orders else range(len(body.entries))
    return {body.entries[i].value: values[body.entries[i]] for i in order if body.entries[i] in values}
_LAST_PLANNER = [None]

def _save_planner(body):
    if body.save_planner is None:
        return {}

def _load_planner(body):
    if body.load_planner is None:
        return {}

def _group(body):
    return {'process_group': _async_group(_CTX[0])} if body.own_group else {}
_CTX = [None]

def _writer_kwargs(body, path, overwrite=None):
    kwargs = {'no_dist': True} if body.no_dist else {}
    kwargs.update(_group(body))
    kwargs['checkpoint_id'] = path
    kwargs.update(_save_planner(body))
    return kwargs

def _save(body, state, path, overwrite=None):
    import torch.distributed.checkpoint as dcp
    kwargs = _writer_kwargs(body, path, overwrite)
    kwargs.update(_collectives(body))
    dcp.save(state, **kwargs)

def _collectives(body):
    return {} if body.use_collectives else {'use_collectives': False}

def _load(body, state, path):
    import torch.distributed.checkpoint as dcp
    kwargs = {'no_dist': True} if body.no_dist else {}
    kwargs.update(_load_planner(body))
    kwargs.update(_group(body))
    dcp.load(state, checkpoint_id=path, **kwargs)

def _async_group(ctx):
    ...

def run_dcp(case, body, ctx):
    if not body.process_checkpointer:
        return _run_dcp(case, body, ctx)

def _run_dcp(case, body, ctx):
    t = body.training
    get_save = _options(body.save_full_state_dict, body.save_cpu_offload, load=False)
    get_load = _options(body.load_full_state_dict, body.load_cpu_offload, load=False)
    put = _options(body.load_full_state_dict, body.load_cpu_offload, load=True, strict=not body.drop)
    path = body.checkpoint_dir or case_dir(case, ctx)
    _LAST_PLANNER[0], _CTX[0] = (None, ctx)
    if body.mode is DcpMode.ROUND_TRIP and ctx.rank == 0:
        shutil.rmtree(path, ignore_errors=True)
    own = os.path.join(path, f'rank-{ctx.rank}') if body.no_dist else path
    obs = {}
    data = all_batches(case, t, t.steps + body.steps_after, body.tree, ctx)
    src = None
    source_done = None
    if body.mode is not DcpMode.LOAD_ONLY:
        src = build_side(body.tree, body.source, t, ctx, seed=case.seed, schedule=body.requires_grad)
        body_optimizer(src, t, body)
        prepare_side(body, src, get_save)
        seed_segment(case, ctx, 0)
        values = _values(body, case, src, ctx, get_save, put, fresh=False, skip=())
        state = _arrange(body, values, ctx)
        _save(body, state, own)
    tgt = build_side(body.tree, body.target, t, ctx, seed=case.seed + FRESH_SEED, meta=body.target_meta_init, schedule=body.requires_grad)
    body_optimizer(tgt, fresh_training(t), body)
    catch_up(tgt, t.steps)
    prepare_side(body, tgt, put)
    dropped = dropped_keys(tgt, body.drop)
    obs['dropped'] = dropped
    values = _values(body, case, tgt, ctx, get_load, put, fresh=True, skip=body.skip)
    state = _arrange(body, values, ctx)
    plain = {k: v for k, v in state.items() if isinstance(v, (dict, torch.Tensor))}
    before = requires_grad(tgt)
    _load(body, state, own)

def attempt(rank, world_size):
    import torch
    import torch.distributed as dist
    case = Case(property='dcp', world_size=2, seed=34, body=DcpBody(tree=ModuleTree(width=1, root=Block(children=(Leaf(kind=LeafKind.LINEAR), Block(children=(Leaf(kind=LeafKind.LINEAR), Leaf(kind=LeafKind.TANH), Leaf(kind=LeafKind.LAYER_NORM)), scale=True), Leaf(kind=LeafKind.LINEAR, bias=False)), buffer=True)), source=Composition(wrapper=Wrapper.FSDP1_FULL_SHARD), target=Composition(wrapper=Wrapper.FSDP1_FULL_SHARD), entries=(DcpItem.MODEL, DcpItem.SCALARS), training=Training(momentum=0.9)))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import re
    import traceback
    try:
        run_dcp(case, case.body, ctx)
    except BaseException as e:
        frames = re.findall('File "([^"]+)", line \\d+, in (\\S+)', traceback.format_exc())
        path, fn = ([(p, f) for p, f in frames if '/torch/' in p and (not f.endswith('comp>'))] or [('?', '?')])[-1]
        found = f'{type(e).__module__}.{type(e).__qualname__}@torch/{path.rpartition("/torch/")[2]}:{fn}'
        if found in ['torch.distributed.checkpoint.api.CheckpointException@torch/distributed/checkpoint/default_planner.py:create_default_local_load_plan']:
            return f'REPRODUCED exception:dcp:torch.distributed.checkpoint.api.CheckpointException@torch/distributed/checkpoint/default_planner.py:create_default_local_load_plan: rank {rank} raised {found}: {e}'
        return f"FAIL (not the entry's failure): rank {rank} raised {found}: {e}"
    return 'PASS: no rank raised'

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
