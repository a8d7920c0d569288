#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=83769381c29cc681 sources=055acc69e02fb753 seconds=40.9
"""Reproduces shardfuzz corpus entry dcp-exception-418da060d0db.json: exception:dcp:builtins.KeyError@torch/distributed/checkpoint/state_dict.py:_get_optim_state_dict

Observed: The FSDP2 bug of corpus/parity-mismatch-5f3ad2a543cd (a frozen unit with
reshard_after_forward=False under a replicate()d root is never resharded) met through
get_optimizer_state_dict: the optimizer holds the sharded parameter, the module the unsharded
one, so the optimizer's parameter has no name. Passes with reshard_after_forward=True or a
fully_shard root. docs/known_bugs.md. (rank 0 raised builtins.KeyError: 0)
Known torch bug: a frozen fully_shard unit without resharding under a replicate'd root is never
resharded: a leaf unfrozen later never trains (KeyError in get_optimizer_state_dict); upstream:
none found.
Expected: no rank raises.

    torchrun --nproc-per-node 4 THIS_FILE.py

prints REPRODUCED and exits 1 while the failure is there, else exits 0.
"""

from __future__ import annotations
from dataclasses import dataclass, field
import torch
import enum
from dataclasses import dataclass
from dataclasses import dataclass, field
from dataclasses import replace
import builtins
from typing import ClassVar
import os
from typing import ClassVar
from torch import nn
import torch.distributed as dist
import torch.nn.functional as F
import inspect
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
        from torch.distributed.device_mesh import init_device_mesh
        key = (shape, names)
        self._meshes[key] = init_device_mesh(self.device.type, shape, mesh_dim_names=names)
        return self._meshes[key]
    _cases: object = 0

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

def iter_paths(block, prefix=''):
    yield (prefix, block)
    for i, child in enumerate(block.children):
        path = str(i)
        yield (path, child)

def param_names(node):
    pass

@dataclass(frozen=True)
class ModuleTree:
    width: object
    root: object

    def paths(self):
        return dict(iter_paths(self.root))

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

    @property
    def paths(self):
        return (self.path, *())

@dataclass(frozen=True)
class CheckpointOptions:

    def names(self):
        pass

@dataclass(frozen=True)
class Composition:
    shards: object = ()
    replicates: object = ()
    checkpoint_first: object = True
    mesh: object = ()
    wrapper: object = Wrapper.NONE
    checkpoint_options: object = field(default_factory=CheckpointOptions)

    def reshard_after_forward(self, spec):
        pass

    @property
    def sharded_paths(self):
        return [p for spec in self.shards for p in ('0',)]

    def steps(self):
        order = {'checkpoint': 3, 'fully_shard': 1, 'replicate': 2}
        items = [('checkpoint', p) for p in ()] + [('replicate', p) for p in self.replicates]
        items += [('fully_shard', spec.path) for spec in self.shards]

        def key(item):
            api, path = item
            depth = min((q.count('.') + (q != '') for q in self._spec_paths(api, path)))
            return (-depth, order[api], path)
        return sorted(items, key=key)

    def _spec_paths(self, api, path):
        if api == 'fully_shard':
            return next((s.paths for s in self.shards if s.path == path))
        return (path,)

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
    module_stateful: object = False
    mode: object = DcpMode.ROUND_TRIP
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

class PointwiseConv1d(nn.Conv1d):

    def forward(self, x):
        return super().forward(x.unsqueeze(-1)).squeeze(-1)

def build_leaf(leaf, width):
    module = _build_leaf(leaf, width)
    if leaf.frozen:
        module.requires_grad_(False)
    return module

def _build_leaf(leaf, width):
    return PointwiseConv1d(width, width, kernel_size=1, bias=False)

def build_node(node, width):
    if isinstance(node, Leaf):
        return build_leaf(node, width)
    return TreeBlock([build_node(c, width) for c in node.children], False, width, False, False)

def build_model(tree, device):
    with torch.device(device):
        return build_node(tree.root, 1)

def replicate_kwargs(model, tree, comp, path, ctx):
    kwargs = {'find_unused_parameters': False}
    kwargs['device_ids'] = None
    return kwargs

def checkpoint_kwargs(opts):
    kwargs = {}
    return kwargs
TORCH_DTYPES = {Dtype.FLOAT32: torch.float32, Dtype.FLOAT64: torch.float64, Dtype.BFLOAT16: torch.bfloat16, Dtype.FLOAT16: torch.float16}
_WRAPPER_PREFIXES = ('_fsdp_wrapped_module.', 'module.', '_checkpoint_wrapped_module.')

def clean_name(name):
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, '')
    return name

def mesh_for(comp, ctx):
    if (4, 1):
        return ctx.mesh(tuple((4, 1)), ('replicate', 'shard'))

def apply_fully_shard(model, spec, mesh):
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
    kwargs = {'mesh': mesh, 'reshard_after_forward': False}
    modules = [model.get_submodule(p) for p in ('0',)]
    fully_shard(modules if () else modules[0], **kwargs)

@dataclass
class Composed:
    model: object
    fsdp_roots: object = field(default_factory=list)
    wrapper: object = Wrapper.NONE
    param_names: object = field(default_factory=list)

def compose(model, comp, ctx, tree=None):
    from torch.distributed._composable import checkpoint, replicate
    ckpt_kwargs = checkpoint_kwargs(comp.checkpoint_options)
    mesh = mesh_for(comp, ctx)
    specs = {'0': s for s in comp.shards}
    for api, path in comp.steps():
        if api == 'fully_shard':
            apply_fully_shard(model, specs[path], mesh)
        else:
            replicate(model.get_submodule(path), **replicate_kwargs(model, tree, comp, path, ctx))
    sharded = comp.sharded_paths
    tops = [p for p in sharded if not any((False for q in sharded))]
    return Composed(model=model, fsdp_roots=[model.get_submodule(p) for p in tops])

def make_optimizer(params, training, later=()):
    held = {id(p) for p in later}
    params = [p for p in params if p.requires_grad or id(p) in held]
    groups = params
    foreach = False
    return torch.optim.SGD(groups, lr=0.01, momentum=0.0, foreach=foreach)

def batches(case, training, width, ctx, tp_size=1):
    dtype = TORCH_DTYPES[training.dtype]
    gen = torch.Generator().manual_seed(0)
    b = 1
    lo = ctx.rank // tp_size * b
    out = []
    for _ in range(2):
        step = []
        for _ in range(1):
            x = torch.randn(ctx.world_size * b, width, generator=gen, dtype=dtype)
            y = torch.randn(ctx.world_size * b, width, generator=gen, dtype=dtype)
            step.append((x[lo:lo + b].to(ctx.device), y[lo:lo + b].to(ctx.device)))
        out.append(step)
    return out

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

    def names(self):
        pass

def build_side(tree, comp, training, ctx, *, seed, meta=False, schedule=()):
    torch.manual_seed(seed)
    device = ctx.device
    model = build_model(tree, device).to(TORCH_DTYPES[training.dtype])
    composed = compose(model, comp, ctx)
    return Side(composed=composed, comp=comp, training=training, schedule=schedule)

def change_requires_grad(side, step):
    return

def requires_grad(side):
    pass

def add_optimizer(side, training, *, frozen_in_optimizer=False, empty_group=False):
    params = list(side.model.parameters())
    frozen = [p for p in params if not p.requires_grad]
    side.opt = make_optimizer(params, training, later=frozen)
    side.param_names = {id(p): clean_name(n) for n, p in side.model.named_parameters()}
    return side.opt

def body_optimizer(side, training, body):
    return add_optimizer(side, training, frozen_in_optimizer=True, empty_group=False)

def seed_segment(case, ctx, segment):
    torch.manual_seed((0 * 7919 + segment * 104729 + ctx.rank + 1) % 2 ** 63)

def all_batches(case, training, steps, tree, ctx):
    return [step[0] for step in batches(case, replace(training, steps=steps), 1, ctx)]

def train_steps(side, data, ctx):
    assert side.opt is not None
    losses = []
    for x, y in data:
        change_requires_grad(side, side.step)
        side.step += 1
        loss = F.mse_loss(side.model(x).to(y.dtype), y)
        loss.backward()
        side.opt.step()
        side.opt.zero_grad(set_to_none=False)
        losses.append(loss.item())
    return losses

def torch_kwargs(fn, kwargs):
    params = inspect.signature(fn).parameters
    missing = sorted((k for k in kwargs if k not in params))
    return kwargs

def state_dict_options(o):
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    extra = {n: True for n in ('ignore_frozen_params', 'flatten_optimizer_state_dict') if getattr(o, n)}
    return StateDictOptions(full_state_dict=False, cpu_offload=False, broadcast_from_rank0=False, strict=True, **torch_kwargs(StateDictOptions, extra))

def case_dir(case, ctx):
    digest = hashlib.sha1('{"body": {"absent": false, "async_save": false, "async_saves": 0, "cache_staged": false, "checkpoint_dir": "", "convert": false, "deadlock": false, "drop": [], "empty_group": false, "entries": ["model", "optimizer", "scalars", "counter"], "frozen_in_optimizer": true, "kind": "dcp", "load_cpu_offload": false, "load_full_state_dict": false, "load_planner": null, "mode": "round_trip", "module_stateful": true, "no_dist": false, "orders": [[0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3]], "overwrite": "none", "own_group": false, "patched": false, "process_checkpointer": false, "requires_grad": [], "save_cpu_offload": false, "save_full_state_dict": false, "save_planner": null, "skip": [], "source": {"auto_wrap": false, "checkpoint_first": false, "checkpoint_options": {"context_fn": "none", "debug": false, "determinism_check": null, "early_stop": null, "preserve_rng_state": true}, "checkpoints": [], "find_unused": false, "knobs": {"abort_and_reset": false, "all_reduce_hook_scale": null, "backward_prefetch": 0, "explicit_unshard": false, "force_sum_reduction": false, "forward_prefetch": 0, "gradient_divide_factor": null, "late_reshard_after_forward": null, "pg_allocator": false, "reduce_scatter_unused": false, "reshard_after_backward_last": false, "rs_max_buffers": 0}, "mesh": [4, 1], "meta_init": false, "replicate_options": {"batched_grad_copy": false, "bucket_cap_mb": null, "bucket_cap_mb_list": [], "delay_all_reduce": false, "device_id": false, "dim": 0, "forward_sync_buffers": null, "gradient_as_bucket_view": false, "group": "default", "ignored_modules": [], "init_sync": true, "skip_all_reduce_unused_params": false, "static_graph": false}, "replicates": [""], "shards": [{"group": [], "ignored": [], "mixed_precision": null, "offload": false, "path": "0", "reshard_after_forward": false, "shard_dim": 0}], "tp": [], "tp_size": 1, "wrapper": "none"}, "stager": null, "steps_after": 1, "storage_objects": false, "target": {"auto_wrap": false, "checkpoint_first": false, "checkpoint_options": {"context_fn": "none", "debug": false, "determinism_check": null, "early_stop": null, "preserve_rng_state": true}, "checkpoints": [], "find_unused": false, "knobs": {"abort_and_reset": false, "all_reduce_hook_scale": null, "backward_prefetch": 0, "explicit_unshard": false, "force_sum_reduction": false, "forward_prefetch": 0, "gradient_divide_factor": null, "late_reshard_after_forward": null, "pg_allocator": false, "reduce_scatter_unused": false, "reshard_after_backward_last": false, "rs_max_buffers": 0}, "mesh": [], "meta_init": false, "replicate_options": {"batched_grad_copy": false, "bucket_cap_mb": null, "bucket_cap_mb_list": [], "delay_all_reduce": false, "device_id": false, "dim": 0, "forward_sync_buffers": null, "gradient_as_bucket_view": false, "group": "default", "ignored_modules": [], "init_sync": true, "skip_all_reduce_unused_params": false, "static_graph": false}, "replicates": [], "shards": [{"group": [], "ignored": [], "mixed_precision": null, "offload": false, "path": "", "reshard_after_forward": false, "shard_dim": 0}], "tp": [], "tp_size": 1, "wrapper": "none"}, "target_meta_init": false, "torch_save_reader": false, "training": {"accum_sync": "always", "batch_per_rank": 1, "compile": "none", "dtype": "float32", "eps": 0.0001, "foreach": false, "grad_accum": 1, "lr": 0.01, "momentum": 0.0, "optimizer": "sgd", "param_groups": 1, "same_input": false, "set_to_none": false, "skips": [], "steps": 1, "unfreeze": []}, "tree": {"root": {"buffer": false, "children": [{"bias": false, "frozen": true, "kind": "conv1d"}, {"bias": false, "frozen": false, "kind": "conv1d"}], "residual": false, "scale": false}, "width": 1}, "use_collectives": true, "writer": {"per_thread_copy_ahead": 10000000, "single_file_per_rank": true, "sync_files": true, "thread_count": 1}}, "property": "dcp", "schema": 1, "seed": 0, "world_size": 4}'.encode()).hexdigest()[:12]
    count = getattr(ctx, '_cases', 0)
    return os.path.join('/tmp/shardfuzz-dcp-3656', f'{digest}-{count}')

def _options(full, offload, *, load, strict=True):
    return Options(full_state_dict=full, cpu_offload=offload, broadcast_from_rank0=load and full and offload, strict=strict)

def _values(body, case, side, ctx, get, put, fresh, skip):
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
    out = {}
    for entry in body.entries:
        if entry is DcpItem.MODEL:
            out[entry] = side.model
        else:
            assert side.opt is not None
            out[entry] = get_optimizer_state_dict(side.model, side.opt, options=state_dict_options(get))

def prepare_side(body, side, options):
    pass
_LAST_PLANNER = [None]
_CTX = [None]

def run_dcp(case, body, ctx):
    return _run_dcp(case, body, ctx)

def _run_dcp(case, body, ctx):
    t = body.training
    get_save = _options(False, False, load=False)
    get_load = _options(False, False, load=False)
    put = _options(False, False, load=True, strict=not ())
    path = '' or case_dir(case, ctx)
    _LAST_PLANNER[0], _CTX[0] = (None, ctx)
    if body.mode is DcpMode.ROUND_TRIP and ctx.rank == 0:
        shutil.rmtree(path, ignore_errors=True)
    obs = {}
    data = all_batches(case, t, 1 + 1, body.tree, ctx)
    src = None
    src = build_side(body.tree, body.source, t, ctx, seed=0, schedule=())
    body_optimizer(src, t, body)
    prepare_side(body, src, get_save)
    seed_segment(case, ctx, 0)
    obs['losses_before'] = train_steps(src, data[:1], ctx)
    values = _values(body, case, src, ctx, get_save, put, fresh=False, skip=())

def main():
    import os
    import torch
    import torch.distributed as dist
    case = Case(property='dcp', world_size=4, seed=0, body=DcpBody(tree=ModuleTree(width=1, root=Block(children=(Leaf(kind=LeafKind.CONV1D, bias=False, frozen=True), Leaf(kind=LeafKind.CONV1D, bias=False)))), source=Composition(shards=(ShardSpec(path='0', reshard_after_forward=False),), replicates=('',), checkpoint_first=False, mesh=(4, 1)), target=Composition(shards=(ShardSpec(path='', reshard_after_forward=False),), checkpoint_first=False), entries=(DcpItem.MODEL, DcpItem.OPTIMIZER, DcpItem.SCALARS, DcpItem.COUNTER), training=Training(lr=0.01, eps=0.0001, steps=1, batch_per_rank=1, set_to_none=False, foreach=False), orders=((0, 1, 2, 3), (0, 1, 2, 3), (0, 1, 2, 3), (0, 1, 2, 3)), module_stateful=True, frozen_in_optimizer=True))
    dist.init_process_group('gloo')
    rank, world_size = (dist.get_rank(), dist.get_world_size())
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import re
    import traceback
    try:
        run_dcp(case, case.body, ctx)
    except BaseException as e:
        frames = re.findall('File "([^"]+)", line \\d+, in (\\S+)', traceback.format_exc())
        path, fn = [(p, f) for p, f in frames if '/torch/' in p and (not f.endswith('comp>'))][-1]
        found = f"{type(e).__module__}.{type(e).__qualname__}@torch/{path.rpartition('/torch/')[2]}:{fn}"
        if found in ['builtins.KeyError@torch/distributed/checkpoint/state_dict.py:_get_optim_state_dict']:
            print(f'REPRODUCED exception:dcp:builtins.KeyError@torch/distributed/checkpoint/state_dict.py:_get_optim_state_dict: rank {ctx.rank} raised {found}: {e}', flush=True)
            os._exit(1)
        print(f"FAIL (not the entry's failure): rank {ctx.rank} raised {found}: {e}", flush=True)
        os._exit(0)
    print('PASS: no rank raised')
if __name__ == '__main__':
    main()
