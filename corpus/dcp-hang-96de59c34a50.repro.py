#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=87e3671b7d30ca95 sources=001b716bb8af1bc0 seconds=2646.0
# Reproduces shardfuzz corpus entry dcp-hang-96de59c34a50.json: hang:dcp@torch/distributed/_state_dict_utils.py:_broadcast_state_dict:rank0-alone
# Known torch bug: set_state_dict(broadcast_from_rank0=True) deadlocks when ranks other than 0
# pass an empty model state dict; upstream: https://github.com/pytorch/pytorch/issues/157781.
# Observed: rank 0 broadcasts state in _broadcast_state_dict that rank(s) [1] skipped (rank(s) 0,
# 1 missed the deadline in torch/distributed/distributed_c10d.py:broadcast)
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: prints REPRODUCED and exits 1 while the failure
# is there, else exits 0 (expected: every rank finishes).

from __future__ import annotations
import gc
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
import inspect
from dataclasses import dataclass, field, replace
import hashlib
import shutil

def __getattr__(name):
    raise AttributeError(f"module 'fuzz' has no attribute {name!r}")
FULL_GC_EVERY = 50

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
        if key not in self._meshes:
            self._meshes[key] = init_device_mesh(self.device.type, shape, mesh_dim_names=names)
        return self._meshes[key]
    _cases: object = 0
    extra_groups: object = field(default_factory=list)
    _groups: object = field(default_factory=dict)

    def group(self, name):
        ...

    def _check_in_step(self):
        import torch.distributed as dist
        groups = [None]
        for mesh in self._meshes.values():
            groups.extend(mesh.get_all_groups())
        groups.extend(self.extra_groups)
        seen = set()
        mine = torch.tensor([self._cases, self.rank], dtype=torch.int64)
        for group in groups:
            key = id(group if group is not None else dist.group.WORLD)
            seen.add(key)
            size = dist.get_world_size(group)
            parts = [torch.zeros(2, dtype=torch.int64) for _ in range(size)]
            dist.all_gather(parts, mine, group=group)
            out = torch.cat(parts)
            cases = out[0::2].tolist()

    def end_case(self):
        self._check_in_step()
        self._cases += 1
        gc.collect(1 if self._cases % FULL_GC_EVERY else 2)

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

def contains(outer, path):
    return outer == path or outer == '' or path.startswith(outer + '.')

def is_ancestor(ancestor, path):
    return ancestor != path and contains(ancestor, path)

class Wrapper(str, enum.Enum):
    NONE = 'none'
    DDP = 'ddp'
    FSDP1_FULL_SHARD = 'fsdp1_full_shard'
    FSDP1_SHARD_GRAD_OP = 'fsdp1_shard_grad_op'
    FSDP1_NO_SHARD = 'fsdp1_no_shard'
    FSDP1_HYBRID_SHARD = 'fsdp1_hybrid_shard'

@dataclass(frozen=True)
class ShardSpec:
    path: object
    reshard_after_forward: object = True
    shard_dim: object = 0
    group: object = ()
    mixed_precision: object = None
    offload: object = False
    ignored: object = ()

    def __post_init__(self):
        raf = self.reshard_after_forward

    @property
    def paths(self):
        return (self.path, *self.group)

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
    spmd: object = False

    def __post_init__(self):
        pass

    def _check_spmd(self):
        ...

    def uniform_precision(self):
        ...

    def reshard_after_forward(self, spec):
        ...

    @property
    def sharded_paths(self):
        return [p for spec in self.shards for p in spec.paths]

    @property
    def shard_ignored(self):
        return frozenset((p for spec in self.shards for p in spec.ignored))

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
        if api == 'fully_shard':
            return next((s.paths for s in self.shards if s.path == path))

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
DEFAULT_FQN_MODIFIERS = '_fqn_modifiers'

def _check_side(comp, tree, where):
    pass

def _check_drop(drop):
    pass

def _check_frozen_in_optimizer(tree, frozen_in_optimizer):
    pass

def _check_schedule(body):
    pass

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
        _check_drop(self.drop)
        _check_frozen_in_optimizer(self.tree, self.frozen_in_optimizer)
        _check_schedule(self)
        self._check_options()
        self._check_async_options()
        entries = self.entries
        self._check_saves()

    @property
    def classic_fsdp1(self):
        ...

    def _check_fsdp1(self):
        ...

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
                pass
        n = len(self.entries)

class TreeBlock(nn.Module):

    def __init__(self, children, residual, width, scale, buffer):
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)
        self.residual = residual
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(width)) if scale else None
        self.shift = None
        self.skipped: frozenset[str] = frozenset()

    def forward(self, x):
        y = x
        for name, child in self.named_children():
            y = child(y)
        return x + y if self.residual else y

def build_leaf(leaf, width):
    module = _build_leaf(leaf, width)
    return module

def _build_leaf(leaf, width):
    if leaf.kind is LeafKind.LINEAR:
        return nn.Linear(width, width, bias=leaf.bias)

def build_node(node, width):
    if isinstance(node, Leaf):
        return build_leaf(node, width)
    return TreeBlock([build_node(c, width) for c in node.children], node.residual, width, node.scale, node.buffer)
FUSED_CHILD = 'fused'

def fuse(model, paths, method=DEFAULT_FQN_MODIFIERS):
    pass

def build_model(tree, device):
    with torch.device(device):
        return build_node(tree.root, tree.width)
TORCH_DTYPES = {Dtype.FLOAT32: torch.float32, Dtype.FLOAT64: torch.float64, Dtype.BFLOAT16: torch.bfloat16, Dtype.FLOAT16: torch.float16}
_WRAPPER_PREFIXES = ('_fsdp_wrapped_module.', 'module.', '_checkpoint_wrapped_module.', f'{FUSED_CHILD}.')

def clean_name(name):
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, '')
    return name

def mesh_for(comp, ctx):
    return ctx.mesh((ctx.world_size,), ('shard',))

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
        out = {}
        for n, p in self.model.named_parameters():
            out[clean_name(n)] = (p.full_tensor() if isinstance(p, DTensor) else p).detach()
        yield out

def compose(model, comp, ctx, tree=None):
    from torch.distributed._composable import checkpoint, replicate
    mesh = mesh_for(comp, ctx)
    specs = {s.path: s for s in comp.shards}
    for api, path in comp.steps():
        if api == 'fully_shard':
            pass
    sharded = comp.sharded_paths
    tops = [p for p in sharded if not any((is_ancestor(q, p) for q in sharded))]
    return Composed(model=model, fsdp_roots=[model.get_submodule(p) for p in tops])

def make_optimizer(params, training, later=()):
    held = {id(p) for p in later}
    params = [p for p in params if p.requires_grad or id(p) in held]
    groups = params
    foreach = training.foreach
    if training.optimizer is Optimizer.SGD:
        return torch.optim.SGD(groups, lr=training.lr, momentum=training.momentum, foreach=foreach)

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

def build_side(tree, comp, training, ctx, *, seed, meta=False, schedule=(), fused=(), fqn_modifiers=DEFAULT_FQN_MODIFIERS):
    torch.manual_seed(seed)
    device = torch.device('meta') if meta else ctx.device
    model = build_model(tree, device).to(TORCH_DTYPES[training.dtype])
    fuse(model, fused, fqn_modifiers)
    composed = Composed(model) if is_plain(comp) else compose(model, comp, ctx)
    return Side(composed=composed, comp=comp, training=training, schedule=schedule)

def requires_grad(side):
    return {clean_name(n): p.requires_grad for n, p in side.model.named_parameters()}

def fresh_training(training):
    momentum = 0.5 if training.optimizer is Optimizer.SGD and training.momentum else 0.0
    return replace(training, lr=training.lr * 0.37, momentum=momentum, eps=training.eps * 10)

def add_optimizer(side, training, *, frozen_in_optimizer=False, empty_group=False):
    params = list(side.model.parameters())
    frozen = [p for p in params if not p.requires_grad] if frozen_in_optimizer else []
    side.opt = make_optimizer(params, training, later=frozen)
    side.param_names = {id(p): clean_name(n) for n, p in side.model.named_parameters()}
    return side.opt

def body_optimizer(side, training, body):
    return add_optimizer(side, training, frozen_in_optimizer=body.frozen_in_optimizer, empty_group=body.empty_group)

def seed_segment(case, ctx, segment):
    torch.manual_seed((case.seed * 7919 + segment * 104729 + ctx.rank + 1) % 2 ** 63)

def all_batches(case, training, steps, tree, ctx):
    pass

def dropped_keys(side, drop):
    if not drop:
        return []

def torch_kwargs(fn, kwargs):
    params = inspect.signature(fn).parameters
    missing = sorted((k for k in kwargs if k not in params))
    return kwargs

def state_dict_options(o, fqn_modifiers=DEFAULT_FQN_MODIFIERS):
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    extra = {n: True for n in ('ignore_frozen_params', 'flatten_optimizer_state_dict') if getattr(o, n)}
    return StateDictOptions(full_state_dict=o.full_state_dict, cpu_offload=o.cpu_offload, broadcast_from_rank0=o.broadcast_from_rank0, strict=o.strict, **torch_kwargs(StateDictOptions, extra))

def case_dir(case, ctx):
    digest = hashlib.sha1(case_to_text(case).encode()).hexdigest()[:12]
    count = getattr(ctx, '_cases', 0)
    return os.path.join(dcp_root(os.environ.get('SHARDFUZZ_PARENT_PID', os.getppid())), f'{digest}-{count}')

class App:

    def __init__(self, side, get, put):
        self.side, self.get, self.put = (side, get, put)

    def state_dict(self):
        from torch.distributed.checkpoint.state_dict import get_state_dict
        assert self.side.opt is not None
        msd, osd = get_state_dict(self.side.model, self.side.opt, options=state_dict_options(self.get))
        return {'model': msd, 'optimizer': osd}

    def load_state_dict(self, state_dict):
        from torch.distributed.checkpoint.state_dict import set_state_dict
        assert self.side.opt is not None
        set_state_dict(self.side.model, self.side.opt, model_state_dict=state_dict['model'], optim_state_dict=state_dict['optimizer'], options=state_dict_options(self.put))

def _options(full, offload, *, load, strict=True):
    return Options(full_state_dict=full, cpu_offload=offload, broadcast_from_rank0=load and full and offload, strict=strict)

def _values(body, case, side, ctx, get, put, fresh, skip):
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
    out = {}
    salt = ctx.rank if body.no_dist else 0
    classic = side.fsdp1 and body.classic_fsdp1
    for entry in body.entries:
        if entry is DcpItem.APP:
            out[entry] = App(side, get, put)
    return out

def prepare_side(body, side, options):
    pass

def _arrange(body, values, ctx):
    order = body.orders[ctx.rank] if body.orders else range(len(body.entries))
    return {body.entries[i].value: values[body.entries[i]] for i in order if body.entries[i] in values}

def _tensors(value, path=''):
    ...

def _in_place_problem(state, before, tensors):
    return ''
_LAST_PLANNER = [None]

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
    prepare_side(body, tgt, put)
    dropped = dropped_keys(tgt, body.drop)
    obs['dropped'] = dropped
    values = _values(body, case, tgt, ctx, get_load, put, fresh=True, skip=body.skip)
    state = _arrange(body, values, ctx)
    plain = {k: v for k, v in state.items() if isinstance(v, (dict, torch.Tensor))}
    tensors = {k: _tensors(v) for k, v in plain.items()}
    before = requires_grad(tgt)
    _load(body, state, own)
    obs['in_place'] = _in_place_problem(state, plain, tensors)
    _finish_load(body, tgt, values, put, own)
    obs['requires_grad'] = {'before': before, 'after': requires_grad(tgt)}
    if body.mode is DcpMode.ROUND_TRIP:
        dist.barrier()
        if ctx.rank == 0:
            shutil.rmtree(path, ignore_errors=True)
    return obs

def _finish_load(body, side, values, put, path):
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict
    options = state_dict_options(put)

def main():
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import torch
    import torch.distributed as dist
    case = Case(property='dcp', world_size=2, seed=0, body=DcpBody(tree=ModuleTree(width=2, root=Block(children=(Leaf(kind=LeafKind.LINEAR),))), source=Composition(shards=(ShardSpec(path=''),)), target=Composition(shards=(ShardSpec(path=''),)), entries=(DcpItem.APP,), training=Training(momentum=0.9, steps=1, batch_per_rank=1), steps_after=0, load_full_state_dict=True, load_cpu_offload=True))
    dist.init_process_group('gloo')
    rank, world_size = (dist.get_rank(), dist.get_world_size())
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import sys
    import threading
    import time
    import traceback
    finished = threading.Event()

    def watch():
        time.sleep(20)
        frames = traceback.extract_stack(sys._current_frames()[threading.main_thread().ident])
        if any((f'torch/{f.filename.rpartition("/torch/")[2]}:{f.name}' in ['torch/distributed/_state_dict_utils.py:_broadcast_state_dict'] for f in frames)):
            print(f'REPRODUCED hang:dcp@torch/distributed/_state_dict_utils.py:_broadcast_state_dict:rank0-alone: rank {ctx.rank} is stuck', flush=True)
            os._exit(1)
        if finished.is_set():
            print('PASS: every rank finished', flush=True)
        else:
            where = f'{frames[-1].filename}:{frames[-1].name}' if frames else '?'
            print(f"FAIL (not the entry's failure): rank {ctx.rank} is still running, in {where}", flush=True)
        os._exit(0)
    threading.Thread(target=watch, daemon=True).start()
    run_dcp(case, case.body, ctx)
    finished.set()
    time.sleep(20 + 5)
    os._exit(0)
if __name__ == '__main__':
    main()
