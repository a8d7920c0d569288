#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=162586248377ab4f sources=7d6f5cb23a31c8e4 seconds=175.4
"""Reproduces shardfuzz corpus entry dcp-exception-e248d03a903f.json: exception:dcp:builtins.AssertionError@torch/distributed/checkpoint/state_dict.py:_load_optim_state_dict

Observed: set_optimizer_state_dict(full_state_dict=True) raises AssertionError('Expected device
to be set') for an optimizer without tensor state (SGD without momentum): _load_optim_state_dict
takes the device from the local state's tensors of dim > 0 and finds none. Any model, sharded or
not. (rank 0 raised builtins.AssertionError: Expected device to be set)
Known torch bug: set_optimizer_state_dict(full_state_dict=True) for an optimizer without tensor
state: 'Expected device to be set'; upstream: none found.
Expected: no rank raises.

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
import os
from typing import ClassVar
from torch import nn
import torch.distributed as dist
import inspect
from dataclasses import dataclass, field, replace
import hashlib

def __getattr__(name):
    raise AttributeError(f"module 'fuzz' has no attribute {name!r}")

@dataclass
class RankContext:
    rank: object
    world_size: object
    device: object
    backend: object
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

def param_names(node):
    pass

@dataclass(frozen=True)
class ModuleTree:
    width: object
    root: object

@dataclass(frozen=True)
class Composition:

    def steps(self):
        pass

@dataclass(frozen=True)
class Training:
    lr: object = 0.1
    momentum: object = 0.0
    eps: object = 0.001
    steps: object = 2
    batch_per_rank: object = 2
    dtype: object = Dtype.FLOAT32
    param_groups: object = 1
    foreach: object = None

class Body:
    KIND: ClassVar[str]
    PROGRAM: ClassVar[str]
    registry: ClassVar[dict[str, type[Body]]] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        Body.registry[cls.KIND] = cls

@dataclass(frozen=True)
class Case:
    property: object
    world_size: object
    seed: object
    body: object

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
    load_full_state_dict: object = False
    no_dist: object = False
    frozen_in_optimizer: object = False
    empty_group: object = False
    requires_grad: object = ()

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

def build_leaf(leaf, width):
    module = _build_leaf(leaf, width)
    return module

def _build_leaf(leaf, width):
    return nn.Linear(width, width, bias=True)

def build_node(node, width):
    if isinstance(node, Leaf):
        return build_leaf(node, width)
    return TreeBlock([build_node(c, width) for c in node.children], False, width, False, False)

def build_model(tree, device):
    with torch.device(device):
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
    param_names: object = field(default_factory=list)

def make_optimizer(params, training, later=()):
    held = {id(p) for p in later}
    params = [p for p in params if p.requires_grad or id(p) in held]
    groups = params
    return torch.optim.SGD(groups, lr=training.lr, momentum=0.0, foreach=None)
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

    @property
    def model(self):
        return self.composed.model

    @property
    def plain(self):
        return True

    def names(self):
        current = {id(p): clean_name(n) for n, p in self.model.named_parameters()}
        return {**self.param_names, **current}

def build_side(tree, comp, training, ctx, *, seed, meta=False, schedule=()):
    torch.manual_seed(seed)
    device = ctx.device
    model = build_model(tree, device).to(TORCH_DTYPES[training.dtype])
    composed = Composed(model)
    return Side(composed=composed, comp=comp, training=training, schedule=schedule)

def requires_grad(side):
    return {clean_name(n): p.requires_grad for n, p in side.model.named_parameters()}

def fresh_training(training):
    return replace(training, lr=0.1 * 0.37, momentum=0.0, eps=0.001 * 10)

def add_optimizer(side, training, *, frozen_in_optimizer=False, empty_group=False):
    params = list(side.model.parameters())
    frozen = []
    side.opt = make_optimizer(params, training, later=frozen)
    side.param_names = {id(p): clean_name(n) for n, p in side.model.named_parameters()}
    return side.opt

def body_optimizer(side, training, body):
    return add_optimizer(side, training, frozen_in_optimizer=False, empty_group=False)

def seed_segment(case, ctx, segment):
    torch.manual_seed((0 * 7919 + segment * 104729 + ctx.rank + 1) % 2 ** 63)

def all_batches(case, training, steps, tree, ctx):
    pass

def _flat(t):
    from torch.distributed.tensor import DTensor
    return [float(v) for v in t.detach().double().cpu().flatten().tolist()]

def _jsonable(value):
    if isinstance(value, torch.Tensor):
        return _flat(value)
    return value

def observe_groups(side):
    names = side.names()
    out = []
    for group in side.opt.param_groups:
        item = {k: _jsonable(v) for k, v in sorted(group.items()) if k != 'params'}
        item['params'] = [names.get(id(p), '?') for p in group['params']]
        out.append(item)
    return out

def observe_optimizer(side):
    names = side.names()
    out = {}
    for group in side.opt.param_groups:
        for p in group['params']:
            state = side.opt.state.get(p, {})
            entry = {key: _jsonable(state[key]) for key in sorted(state)}
    return out

def probe(side, case, tree, ctx):
    gen = torch.Generator().manual_seed(0 + 1)
    x = torch.randn(PROBE_ROWS, 2, generator=gen, dtype=TORCH_DTYPES[side.training.dtype]).to(ctx.device)
    seed_segment(case, ctx, 99)
    with torch.no_grad():
        out = _flat(side.model(x))
    return out

def observe(side, case, tree, ctx, *, model=True):
    obs = {'groups': observe_groups(side)}
    optim = observe_optimizer(side)
    out = probe(side, case, tree, ctx)
    if ctx.rank == 0:
        obs.update(model=params, probe=out)
        obs['optimizer'] = optim
    return obs

def dropped_keys(side, drop):
    return []

def torch_kwargs(fn, kwargs):
    params = inspect.signature(fn).parameters
    missing = sorted((k for k in kwargs if k not in params))
    return kwargs

def state_dict_options(o):
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    extra = {n: True for n in ('ignore_frozen_params', 'flatten_optimizer_state_dict') if getattr(o, n)}
    return StateDictOptions(full_state_dict=o.full_state_dict, cpu_offload=False, broadcast_from_rank0=False, strict=True, **torch_kwargs(StateDictOptions, extra))

def case_dir(case, ctx):
    digest = hashlib.sha1('{"body": {"absent": false, "async_save": false, "async_saves": 0, "cache_staged": false, "checkpoint_dir": "", "convert": false, "deadlock": false, "drop": [], "empty_group": false, "entries": ["model", "optimizer"], "frozen_in_optimizer": false, "kind": "dcp", "load_cpu_offload": false, "load_full_state_dict": true, "load_planner": null, "mode": "round_trip", "module_stateful": false, "no_dist": false, "orders": [], "overwrite": "none", "own_group": false, "patched": false, "process_checkpointer": false, "requires_grad": [], "save_cpu_offload": false, "save_full_state_dict": false, "save_planner": null, "skip": [], "source": {"auto_wrap": false, "checkpoint_first": true, "checkpoint_options": {"context_fn": "none", "debug": false, "determinism_check": null, "early_stop": null, "preserve_rng_state": true}, "checkpoints": [], "find_unused": false, "knobs": {"abort_and_reset": false, "all_reduce_hook_scale": null, "backward_prefetch": 0, "explicit_unshard": false, "force_sum_reduction": false, "forward_prefetch": 0, "gradient_divide_factor": null, "late_reshard_after_forward": null, "pg_allocator": false, "reduce_scatter_unused": false, "reshard_after_backward_last": false, "rs_max_buffers": 0}, "mesh": [], "meta_init": false, "replicate_options": {"batched_grad_copy": false, "bucket_cap_mb": null, "bucket_cap_mb_list": [], "delay_all_reduce": false, "device_id": false, "dim": 0, "forward_sync_buffers": null, "gradient_as_bucket_view": false, "group": "default", "ignored_modules": [], "init_sync": true, "skip_all_reduce_unused_params": false, "static_graph": false}, "replicates": [], "shards": [], "tp": [], "tp_size": 1, "wrapper": "none"}, "stager": null, "steps_after": 0, "storage_objects": false, "target": {"auto_wrap": false, "checkpoint_first": true, "checkpoint_options": {"context_fn": "none", "debug": false, "determinism_check": null, "early_stop": null, "preserve_rng_state": true}, "checkpoints": [], "find_unused": false, "knobs": {"abort_and_reset": false, "all_reduce_hook_scale": null, "backward_prefetch": 0, "explicit_unshard": false, "force_sum_reduction": false, "forward_prefetch": 0, "gradient_divide_factor": null, "late_reshard_after_forward": null, "pg_allocator": false, "reduce_scatter_unused": false, "reshard_after_backward_last": false, "rs_max_buffers": 0}, "mesh": [], "meta_init": false, "replicate_options": {"batched_grad_copy": false, "bucket_cap_mb": null, "bucket_cap_mb_list": [], "delay_all_reduce": false, "device_id": false, "dim": 0, "forward_sync_buffers": null, "gradient_as_bucket_view": false, "group": "default", "ignored_modules": [], "init_sync": true, "skip_all_reduce_unused_params": false, "static_graph": false}, "replicates": [], "shards": [], "tp": [], "tp_size": 1, "wrapper": "none"}, "target_meta_init": false, "torch_save_reader": false, "training": {"accum_sync": "always", "batch_per_rank": 1, "compile": "none", "dtype": "float32", "eps": 0.001, "foreach": null, "grad_accum": 1, "lr": 0.1, "momentum": 0.0, "optimizer": "sgd", "param_groups": 1, "same_input": false, "set_to_none": true, "skips": [], "steps": 1, "unfreeze": []}, "tree": {"root": {"buffer": false, "children": [{"bias": true, "frozen": false, "kind": "linear"}], "residual": false, "scale": false}, "width": 2}, "use_collectives": true, "writer": {"per_thread_copy_ahead": 10000000, "single_file_per_rank": true, "sync_files": true, "thread_count": 1}}, "property": "dcp", "schema": 1, "seed": 0, "world_size": 2}'.encode()).hexdigest()[:12]
    count = getattr(ctx, '_cases', 0)
    return os.path.join('/tmp/shardfuzz-dcp-28768', f'{digest}-{count}')

def _options(full, offload, *, load, strict=True):
    return Options(full_state_dict=full, cpu_offload=offload, broadcast_from_rank0=load and full and offload, strict=strict)

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
    if isinstance(value, torch.Tensor):
        return [(path, id(value))]
    if isinstance(value, dict):
        return [t for k, v in value.items() for t in _tensors(v, f'{path}.{k}')]
    if isinstance(value, (list, tuple)):
        return [t for i, v in enumerate(value) for t in _tensors(v, f'{path}[{i}]')]
    return []
_LAST_PLANNER = [None]

def _save_planner(body):
    return {}

def _group(body):
    return {}
_CTX = [None]

def _writer_kwargs(body, path, overwrite=None):
    kwargs = {}
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
    return {}

def run_dcp(case, body, ctx):
    return _run_dcp(case, body, ctx)

def _run_dcp(case, body, ctx):
    t = body.training
    get_save = _options(False, False, load=False)
    get_load = _options(True, False, load=False)
    put = _options(True, False, load=True, strict=not ())
    path = '' or case_dir(case, ctx)
    _LAST_PLANNER[0], _CTX[0] = (None, ctx)
    obs = {}
    data = all_batches(case, t, 1 + 0, body.tree, ctx)
    src = None
    src = build_side(body.tree, body.source, t, ctx, seed=0, schedule=())
    body_optimizer(src, t, body)
    seed_segment(case, ctx, 0)
    values = _values(body, case, src, ctx, get_save, put, fresh=False, skip=())
    state = _arrange(body, values, ctx)
    _save(body, state, path)
    reloaded = _reload_on_one_rank(body, case, ctx, path)
    if ctx.rank == 0:
        obs['reloaded'] = reloaded
    tgt = build_side(body.tree, body.target, t, ctx, seed=0 + FRESH_SEED, meta=False, schedule=())
    body_optimizer(tgt, fresh_training(t), body)
    dropped = dropped_keys(tgt, ())
    obs['dropped'] = dropped
    obs['fresh'] = observe(tgt, case, body.tree, ctx, model=not False)
    values = _values(body, case, tgt, ctx, get_load, put, fresh=True, skip=())
    state = _arrange(body, values, ctx)
    plain = {k: v for k, v in state.items() if isinstance(v, (dict, torch.Tensor))}
    tensors = {k: _tensors(v) for k, v in plain.items()}
    before = requires_grad(tgt)
    _finish_load(body, tgt, values, put, path)

def _reload_on_one_rank(body, case, ctx, path):
    import torch.distributed.checkpoint as dcp
    dist.barrier()
    out = None
    if ctx.rank == 0:
        torch.manual_seed(0 + 3 * FRESH_SEED)
        model = build_model(body.tree, torch.device('cpu')).to(TORCH_DTYPES[body.training.dtype])
        state = model.state_dict()
        dcp.load({'model': state}, checkpoint_id=path, no_dist=True)
        out = {clean_name(k): _jsonable(v) for k, v in state.items()}
    dist.barrier()
    return out

def _finish_load(body, side, values, put, path):
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict
    options = state_dict_options(put)
    msd = values[DcpItem.MODEL]
    set_model_state_dict(side.model, msd, options=options)
    assert side.opt is not None
    set_optimizer_state_dict(side.model, side.opt, values[DcpItem.OPTIMIZER], options=options)

def attempt(rank, world_size):
    import torch
    import torch.distributed as dist
    case = Case(property='dcp', world_size=2, seed=0, body=DcpBody(tree=ModuleTree(width=2, root=Block(children=(Leaf(kind=LeafKind.LINEAR),))), source=Composition(), target=Composition(), entries=(DcpItem.MODEL, DcpItem.OPTIMIZER), training=Training(steps=1, batch_per_rank=1), steps_after=0, load_full_state_dict=True))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import re
    import traceback
    try:
        run_dcp(case, DcpBody(tree=ModuleTree(width=2, root=Block(children=(Leaf(kind=LeafKind.LINEAR),))), source=Composition(), target=Composition(), entries=(DcpItem.MODEL, DcpItem.OPTIMIZER), training=Training(steps=1, batch_per_rank=1), steps_after=0, load_full_state_dict=True), ctx)
    except BaseException as e:
        frames = re.findall('File "([^"]+)", line \\d+, in (\\S+)', traceback.format_exc())
        path, fn = [(p, f) for p, f in frames if '/torch/' in p and (not f.endswith('comp>'))][-1]
        found = f'{type(e).__module__}.{type(e).__qualname__}@torch/{path.rpartition("/torch/")[2]}:{fn}'
        if found in ['builtins.AssertionError@torch/distributed/checkpoint/state_dict.py:_load_optim_state_dict']:
            return f'REPRODUCED exception:dcp:builtins.AssertionError@torch/distributed/checkpoint/state_dict.py:_load_optim_state_dict: rank {rank} raised {found}: {e}'
        return f"FAIL (not the entry's failure): rank {rank} raised {found}: {e}"
    return 'PASS: no rank raised'

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
