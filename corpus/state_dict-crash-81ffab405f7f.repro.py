#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=627b92f9c75a2fc3 sources=c2f9d3144d82dce8 seconds=512.9
"""Reproduces shardfuzz corpus entry state_dict-crash-81ffab405f7f.json: crash:state_dict:signal

Observed: FSDP1 FULL_STATE_DICT with offload_to_cpu on CPU: model.state_dict() clones an already
freed buffer in _full_post_state_dict_hook's param_hook (SIGSEGV); FSDP.optim_state_dict reuses
one gather buffer, so exp_avg equals exp_avg_sq. Reproducer: docs/state_dict.md. (rank 0 died
(signal SIGSEGV))
Known torch bug: FSDP1 FULL_STATE_DICT with offload_to_cpu on CPU: state_dict() clones a freed
buffer (SIGSEGV), optim_state_dict aliases the gathered states; upstream:
https://github.com/pytorch/pytorch/issues/188989.
Expected: no rank dies.

    torchrun --nproc-per-node 2 THIS_FILE.py

prints REPRODUCED and exits 1 while the failure is there, else exits 0.
"""

from __future__ import annotations
from typing import Any
from dataclasses import dataclass, field
import torch
import enum
from dataclasses import dataclass
from typing import Union
from dataclasses import dataclass, field, fields
from dataclasses import replace
import builtins
from typing import Any, ClassVar
from typing import Any, Union
import os
from typing import ClassVar
from torch import nn
from contextlib import nullcontext
import copy
import torch.distributed as dist
from dataclasses import dataclass, field, replace

@dataclass
class RankContext:
    rank: object
    world_size: object
    device: object
    backend: object
    _meshes: object = field(default_factory=dict)

    def mesh(self, shape: tuple[int, ...], names: tuple[str, ...]) -> Any:
        from torch.distributed.device_mesh import init_device_mesh
        key = (shape, names)
        if key not in self._meshes:
            self._meshes[key] = init_device_mesh(self.device.type, shape, mesh_dim_names=names)
        return self._meshes[key]
    extra_groups: object = field(default_factory=list)
    _groups: object = field(default_factory=dict)

    def group(self, name: str) -> Any:
        import torch.distributed as dist
        if name not in self._groups:
            self._groups[name] = dist.new_group(list(range(self.world_size)))
            self.extra_groups.append(self._groups[name])
        return self._groups[name]
MAX_WIDTH = 64

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

    def __post_init__(self) -> None:
        if not self.bias and self.kind not in PARAM_LEAVES:
            pass
        if self.frozen and self.kind not in PARAM_LEAVES:
            pass

@dataclass(frozen=True)
class Block:
    children: object
    residual: object = False
    scale: object = False
    buffer: object = False

    def __post_init__(self) -> None:
        if not self.children:
            pass
Node = Union[Leaf, Block]

def param_names(node: Node) -> list[str]:
    if isinstance(node, Leaf):
        if node.kind not in PARAM_LEAVES:
            return []
        return ['weight', 'bias'] if node.bias else ['weight']
    return ['scale'] if node.scale else []

@dataclass(frozen=True)
class ModuleTree:
    width: object
    root: object

    def __post_init__(self) -> None:
        if not 1 <= self.width <= MAX_WIDTH:
            pass

    def paths(self) -> dict[str, Node]:
        pass

    @property
    def size(self) -> int:
        return len(self.paths())

def contains(outer: str, path: str) -> bool:
    return outer == path or outer == '' or path.startswith(outer + '.')

def is_ancestor(ancestor: str, path: str) -> bool:
    return ancestor != path and contains(ancestor, path)

class Wrapper(str, enum.Enum):
    NONE = 'none'
    DDP = 'ddp'
    FSDP1_FULL_SHARD = 'fsdp1_full_shard'
    FSDP1_SHARD_GRAD_OP = 'fsdp1_shard_grad_op'
    FSDP1_NO_SHARD = 'fsdp1_no_shard'
    FSDP1_HYBRID_SHARD = 'fsdp1_hybrid_shard'

@dataclass(frozen=True)
class Knobs:
    forward_prefetch: object = 0
    backward_prefetch: object = 0
    late_reshard_after_forward: object = None
    explicit_unshard: object = False
    all_reduce_hook_scale: object = None
    gradient_divide_factor: object = None
    abort_and_reset: object = False
    rs_max_buffers: object = 0

    def __post_init__(self) -> None:
        if not 0 <= self.rs_max_buffers <= 4:
            pass
        if self.abort_and_reset and self.explicit_unshard:
            pass
        for name in ('forward_prefetch', 'backward_prefetch'):
            if not 0 <= getattr(self, name) <= 3:
                pass
        if self.all_reduce_hook_scale is not None and self.all_reduce_hook_scale not in (0.5, 2.0):
            pass
        if self.gradient_divide_factor is not None and (not 0.5 <= self.gradient_divide_factor <= 64):
            pass

    @property
    def is_set(self) -> bool:
        return self != Knobs()

    def names(self) -> list[str]:
        out = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value != f.default:
                out.append(f.name + (f':{value}' if f.name == 'late_reshard_after_forward' else ''))
        return out

@dataclass(frozen=True)
class ReplicateOptions:
    bucket_cap_mb: object = None
    bucket_cap_mb_list: object = ()
    init_sync: object = True
    dim: object = 0
    device_id: object = False
    forward_sync_buffers: object = None

    def __post_init__(self) -> None:
        caps = (*(() if self.bucket_cap_mb is None else (self.bucket_cap_mb,)), *self.bucket_cap_mb_list)
        if any((not 0 <= c <= 1024 for c in caps)):
            pass
        if self.dim not in (0, 1):
            pass

    @property
    def is_set(self) -> bool:
        return self != ReplicateOptions()

    def names(self) -> list[str]:
        out = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value == f.default:
                continue
            if f.name == 'group':
                out.append(f'group:{value.value}')
            elif f.name == 'forward_sync_buffers':
                out.append(f'forward_sync_buffers:{value}')
            elif f.name == 'init_sync':
                out.append('init_sync:False')
            else:
                out.append(f.name)
        return out

@dataclass(frozen=True)
class CheckpointOptions:
    preserve_rng_state: object = True
    determinism_check: object = None
    debug: object = False
    early_stop: object = None

    @property
    def is_set(self) -> bool:
        return self != CheckpointOptions()

    def names(self) -> list[str]:
        out = []
        if not self.preserve_rng_state:
            out.append('preserve_rng_state:False')
        if self.determinism_check is not None:
            out.append(f'determinism_check:{self.determinism_check.value}')
        if self.debug:
            out.append('debug')
        if self.early_stop is not None:
            out.append(f'early_stop:{self.early_stop}')
        return out

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
    knobs: object = field(default_factory=Knobs)
    replicate_options: object = field(default_factory=ReplicateOptions)
    checkpoint_options: object = field(default_factory=CheckpointOptions)

    def __post_init__(self) -> None:
        if self.find_unused and self.wrapper is not Wrapper.DDP and (not self.replicates):
            pass
        if self.tp_size < 1:
            pass
        if bool(self.tp) != (self.tp_size > 1):
            pass
        if self.tp and (self.mesh or self.wrapper is not Wrapper.NONE or self.replicates or self.meta_init):
            pass
        if self.tp and '' not in self.sharded_paths:
            pass
        if self.mesh and len(self.mesh) != 2:
            pass
        if self.wrapper is not Wrapper.NONE and (self.shards or self.replicates):
            pass
        if self.auto_wrap and (not self.wrapper.value.startswith('fsdp1')):
            pass
        if self.wrapper is Wrapper.FSDP1_HYBRID_SHARD and (not self.mesh):
            pass
        if self.meta_init and (self.wrapper is not Wrapper.NONE or self.replicates):
            pass
        if self.knobs.is_set and (not self.shards):
            pass
        if self.knobs.late_reshard_after_forward is not None and self.replicates:
            pass
        if self.knobs.late_reshard_after_forward is not None and any((not isinstance(s.reshard_after_forward, bool) for s in self.shards)):
            pass
        if self.knobs.abort_and_reset and ('' not in self.sharded_paths or self.replicates):
            pass
        if self.knobs.is_set and self.tp:
            pass
        if self.replicate_options.is_set and (not self.replicates):
            pass
        if self.checkpoint_options.is_set and (not self.checkpoints):
            pass

    @property
    def sharded_paths(self) -> list[str]:
        return [p for spec in self.shards for p in spec.paths]

    def steps(self) -> list[tuple[str, str]]:
        order = {'checkpoint': 0 if self.checkpoint_first else 3, 'fully_shard': 1, 'replicate': 2}
        items = [('checkpoint', p) for p in self.checkpoints] + [('replicate', p) for p in self.replicates]
        items += [('fully_shard', spec.path) for spec in self.shards]

        def key(item: tuple[str, str]) -> tuple[int, int, str]:
            api, path = item
            depth = min((q.count('.') + (q != '') for q in self._spec_paths(api, path)))
            return (-depth, order[api], path)
        return sorted(items, key=key)

    def _spec_paths(self, api: str, path: str) -> tuple[str, ...]:
        if api == 'fully_shard':
            return next((s.paths for s in self.shards if s.path == path))
        return (path,)
MAX_STEPS = 16

@dataclass(frozen=True)
class Training:
    lr: object = 0.1
    momentum: object = 0.0
    eps: object = 0.001
    steps: object = 2
    batch_per_rank: object = 2
    dtype: object = Dtype.FLOAT32
    grad_accum: object = 1
    set_to_none: object = True
    param_groups: object = 1
    foreach: object = None
    skips: object = ()
    unfreeze: object = ()

    def __post_init__(self) -> None:
        if not 1 <= self.steps <= MAX_STEPS:
            pass
        if not 1 <= self.batch_per_rank <= 64:
            pass
        if not 0.0 < self.lr <= 1.0:
            pass
        if not 0.0 <= self.momentum < 1.0:
            pass
        if self.eps <= 0.0:
            pass
        if self.dtype not in (Dtype.FLOAT32, Dtype.FLOAT64):
            pass
        if not 1 <= self.grad_accum <= 4:
            pass
        if self.param_groups not in (1, 2):
            pass
        for i, skip in enumerate(self.skips):
            if not 0 <= skip.step < self.steps:
                pass
            if not 0 <= skip.microbatch < self.grad_accum:
                pass
            if skip in self.skips[:i]:
                pass
        for i, later in enumerate(self.unfreeze):
            if not 1 <= later.step < self.steps:
                pass
            if any((u.path == later.path for u in self.unfreeze[:i])):
                pass
MAX_WORLD_SIZE = 64

class Body:
    KIND: ClassVar[str]
    PROGRAM: ClassVar[str]
    registry: ClassVar[dict[str, type[Body]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        Body.registry[cls.KIND] = cls

    @property
    def size(self) -> tuple[int, int]:
        return (1, 1)

@dataclass(frozen=True)
class Case:
    property: object
    world_size: object
    seed: object
    body: object

    def __post_init__(self) -> None:
        if not 1 <= self.world_size <= MAX_WORLD_SIZE:
            pass
        if not 0 <= self.seed < 2 ** 63:
            pass

    @builtins.property
    def size(self) -> tuple[int, int]:
        return self.body.size

def is_plain(comp: Composition) -> bool:
    return not comp.shards and (not comp.replicates) and (comp.wrapper is Wrapper.NONE)

def is_fsdp1(comp: Composition) -> bool:
    return comp.wrapper.value.startswith('fsdp1')

def _check_drop(drop: tuple[int, ...]) -> None:
    if any((i < 0 for i in drop)) or len(set(drop)) != len(drop):
        pass

def _check_frozen_in_optimizer(tree: ModuleTree, frozen_in_optimizer: bool) -> None:
    if frozen_in_optimizer and (not any((getattr(n, 'frozen', False) for n in tree.paths().values()))):
        pass

@dataclass(frozen=True)
class RequiresGrad:
    path: object
    step: object
    trainable: object

class Api(str, enum.Enum):
    SPLIT = 'split'
    COMBINED = 'combined'
    MODULE = 'module'
    FSDP1 = 'fsdp1_optim_state_dict'

@dataclass(frozen=True)
class Options:
    full_state_dict: object = False
    cpu_offload: object = False
    broadcast_from_rank0: object = False
    strict: object = True
    ignore_frozen_params: object = False
    flatten_optimizer_state_dict: object = False

@dataclass(frozen=True)
class StateDictBody(Body):
    KIND: ClassVar[str] = 'state_dict'
    PROGRAM: ClassVar[str] = 'fuzz._rank.state_dict:run_state_dict'
    tree: object
    source: object
    target: object
    training: object = field(default_factory=Training)
    steps_after: object = 1
    api: object = Api.SPLIT
    save: object = field(default_factory=Options)
    load: object = field(default_factory=Options)
    target_meta_init: object = False
    drop: object = ()
    frozen_in_optimizer: object = False
    empty_group: object = False
    requires_grad: object = ()

    def __post_init__(self) -> None:
        _check_drop(self.drop)
        _check_frozen_in_optimizer(self.tree, self.frozen_in_optimizer)
        save, load = (self.save, self.load)
        if self.requires_grad and save.ignore_frozen_params:
            pass
        if save.broadcast_from_rank0 or not save.strict:
            pass
        self._check_frozen_and_flat()
        if self.api is Api.FSDP1:
            if not (is_fsdp1(self.source) and is_fsdp1(self.target)):
                pass
            self._check_fsdp1()
            return
        if load.full_state_dict != save.full_state_dict:
            pass
        if not save.full_state_dict:
            if problem:
                pass
        if load.broadcast_from_rank0 and (not load.full_state_dict):
            pass
        if save.full_state_dict and save.cpu_offload and (not load.broadcast_from_rank0):
            pass
        if self.api is Api.COMBINED and self.target_meta_init:
            pass
        if self.drop and load.strict:
            pass
        if self.drop and self.target_meta_init:
            pass

    def _check_frozen_and_flat(self) -> None:
        save, load = (self.save, self.load)
        if load.ignore_frozen_params:
            pass
        if save.ignore_frozen_params:
            if self.api not in (Api.SPLIT, Api.COMBINED):
                pass
            if any((getattr(n, 'frozen', False) for n in self.tree.paths().values())):
                if load.strict:
                    pass
                if self.target_meta_init:
                    pass
        if save.flatten_optimizer_state_dict != load.flatten_optimizer_state_dict:
            pass
        if save.flatten_optimizer_state_dict:
            if self.api is Api.FSDP1:
                pass
            if self.empty_group:
                pass

    def _check_fsdp1(self) -> None:
        save, load = (self.save, self.load)
        if load.full_state_dict != save.full_state_dict:
            pass
        if load.cpu_offload or not load.strict:
            pass
        if load.broadcast_from_rank0 and (not load.full_state_dict):
            pass
        if self.drop:
            pass
        if not save.full_state_dict:
            if problem:
                pass

    @property
    def size(self) -> tuple[int, int]:
        return (self.tree.size, self.training.steps + self.steps_after)

class TreeBlock(nn.Module):

    def __init__(self, children: list[nn.Module], residual: bool, width: int, scale: bool, buffer: bool) -> None:
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        for name, child in self.named_children():
            if name in self.skipped:
                continue
            y = child(y)
        if self.scale is not None:
            y = y * self.scale
        if self.shift is not None:
            y = y + self.shift
        return x + y if self.residual else y

class PointwiseConv1d(nn.Conv1d):

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.unsqueeze(-1)).squeeze(-1)

def build_leaf(leaf: Leaf, width: int) -> nn.Module:
    module = _build_leaf(leaf, width)
    if leaf.frozen:
        module.requires_grad_(False)
    return module

def _build_leaf(leaf: Leaf, width: int) -> nn.Module:
    if leaf.kind is LeafKind.LINEAR:
        return nn.Linear(width, width, bias=leaf.bias)
    if leaf.kind is LeafKind.LAYER_NORM:
        return nn.LayerNorm(width, bias=leaf.bias)
    if leaf.kind is LeafKind.CONV1D:
        return PointwiseConv1d(width, width, kernel_size=1, bias=leaf.bias)
    if leaf.kind is LeafKind.DROPOUT:
        return nn.Dropout(0.5)
    if leaf.kind is LeafKind.RELU:
        return nn.ReLU()
    if leaf.kind is LeafKind.TANH:
        return nn.Tanh()
    if leaf.kind is LeafKind.GELU:
        return nn.GELU()
    raise AssertionError(f'unhandled leaf kind {leaf.kind}')

def build_node(node: Node, width: int) -> nn.Module:
    if isinstance(node, Leaf):
        return build_leaf(node, width)
    return TreeBlock([build_node(c, width) for c in node.children], node.residual, width, node.scale, node.buffer)

def build_model(tree: ModuleTree, device: torch.device) -> nn.Module:
    with torch.device(device):
        return build_node(tree.root, tree.width)
TORCH_DTYPES = {Dtype.FLOAT32: torch.float32, Dtype.FLOAT64: torch.float64, Dtype.BFLOAT16: torch.bfloat16, Dtype.FLOAT16: torch.float16}
_WRAPPER_PREFIXES = ('_fsdp_wrapped_module.', 'module.', '_checkpoint_wrapped_module.')

def clean_name(name: str) -> str:
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, '')
    return name

def tp_mesh(comp: Composition, ctx: RankContext) -> Any:
    return ctx.mesh((ctx.world_size // comp.tp_size, comp.tp_size), ('shard', 'tp'))

@dataclass
class Composed:
    model: object
    fsdp_roots: object = field(default_factory=list)
    wrapper: object = Wrapper.NONE
    param_names: object = field(default_factory=list)
    knobs: object = None

    def no_sync(self) -> Any:
        if self.wrapper is Wrapper.NONE:
            return nullcontext()
        return self.model.no_sync()

def compose(model: nn.Module, comp: Composition, ctx: RankContext, tree: ModuleTree | None=None) -> Composed:
    from torch.distributed._composable import checkpoint, replicate
    if comp.wrapper is not Wrapper.NONE:
        names = [n for n, _ in model.named_parameters()]
        for path in comp.checkpoints:
            checkpoint(model.get_submodule(path), **ckpt_kwargs)
        return Composed(model=_wrap(model, comp, ctx), wrapper=comp.wrapper, param_names=names)
    if comp.tp:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
        plan = {}
        for pair in comp.tp:
            plan[pair.colwise] = ColwiseParallel()
            plan[pair.rowwise] = RowwiseParallel()
        parallelize_module(model, tp_mesh(comp, ctx)['tp'], plan)
    specs = {s.path: s for s in comp.shards}
    for api, path in comp.steps():
        if api == 'checkpoint':
            checkpoint(model.get_submodule(path), **ckpt_kwargs)
        elif api == 'fully_shard':
            apply_fully_shard(model, specs[path], mesh)
    sharded = comp.sharded_paths
    tops = [p for p in sharded if not any((is_ancestor(q, p) for q in sharded))]
    return Composed(model=model, fsdp_roots=[model.get_submodule(p) for p in tops])

def _wrap(model: nn.Module, comp: Composition, ctx: RankContext) -> nn.Module:
    if comp.wrapper is Wrapper.DDP:
        from torch.nn.parallel import DistributedDataParallel as DDP
        device_ids = None if ctx.device.type == 'cpu' else [ctx.device]
        return DDP(model, device_ids=device_ids, find_unused_parameters=comp.find_unused)
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    strategy = {Wrapper.FSDP1_FULL_SHARD: ShardingStrategy.FULL_SHARD, Wrapper.FSDP1_SHARD_GRAD_OP: ShardingStrategy.SHARD_GRAD_OP, Wrapper.FSDP1_NO_SHARD: ShardingStrategy.NO_SHARD, Wrapper.FSDP1_HYBRID_SHARD: ShardingStrategy.HYBRID_SHARD}[comp.wrapper]
    kwargs = {'sharding_strategy': strategy, 'device_id': ctx.device, 'use_orig_params': True}
    if comp.wrapper is Wrapper.FSDP1_HYBRID_SHARD:
        pass
    if comp.auto_wrap:
        kwargs['auto_wrap_policy'] = ModuleWrapPolicy({TreeBlock})
    return FSDP(model, **kwargs)

def make_optimizer(params: Any, training: Training, later: Any=()) -> torch.optim.Optimizer:
    held = {id(p) for p in later}
    params = [p for p in params if p.requires_grad or id(p) in held]
    groups = params
    if training.param_groups == 2:
        groups = [{'params': params[0::2]}, {'params': params[1::2], 'lr': training.lr / 2}]
        groups = [g for g in groups if g['params']]
    foreach = training.foreach
    return torch.optim.AdamW(groups, lr=training.lr, eps=training.eps, foreach=foreach)
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
    def model(self) -> nn.Module:
        return self.composed.model

    @property
    def plain(self) -> bool:
        return is_plain(self.comp)

    @property
    def fsdp1(self) -> bool:
        return is_fsdp1(self.comp)

    def names(self) -> dict[int, str]:
        current = {id(p): clean_name(n) for n, p in self.model.named_parameters()}
        return {**self.param_names, **current}

def build_side(tree: ModuleTree, comp: Composition, training: Training, ctx: RankContext, *, seed: int, meta: bool=False, schedule: tuple[RequiresGrad, ...]=()) -> Side:
    torch.manual_seed(seed)
    device = torch.device('meta') if meta else ctx.device
    model = build_model(tree, device).to(TORCH_DTYPES[training.dtype])
    composed = Composed(model) if is_plain(comp) else compose(model, comp, ctx)
    return Side(composed=composed, comp=comp, training=training, schedule=schedule)

def catch_up(side: Side, steps: int) -> None:
    for step in range(side.step, steps):
        pass
    side.step = max(side.step, steps)

def requires_grad(side: Side) -> dict[str, bool]:
    return {clean_name(n): p.requires_grad for n, p in side.model.named_parameters()}

def fresh_training(training: Training) -> Training:
    return replace(training, lr=training.lr * 0.37, momentum=momentum, eps=training.eps * 10)

def add_optimizer(side: Side, training: Training, *, frozen_in_optimizer: bool=False, empty_group: bool=False) -> torch.optim.Optimizer:
    params = list(side.model.parameters())
    frozen = [p for p in params if not p.requires_grad] if frozen_in_optimizer else []
    side.opt = make_optimizer(params, training, later=frozen)
    if empty_group:
        side.opt.add_param_group({'params': [], 'lr': training.lr / 4})
    side.param_names = {id(p): clean_name(n) for n, p in side.model.named_parameters()}
    return side.opt

def body_optimizer(side: Side, training: Training, body: Any) -> torch.optim.Optimizer:
    return add_optimizer(side, training, frozen_in_optimizer=body.frozen_in_optimizer, empty_group=body.empty_group)

def seed_segment(case: Case, ctx: RankContext, segment: int) -> None:
    torch.manual_seed((case.seed * 7919 + segment * 104729 + ctx.rank + 1) % 2 ** 63)

def all_batches(case: Case, training: Training, steps: int, tree: ModuleTree, ctx: RankContext) -> list[Any]:
    pass

def model_keys(side: Side) -> list[str]:
    return sorted((clean_name(k) for k in side.model.state_dict()))

def fsdp1_state_dict_type(side: Side, *, full: bool, offload: bool, rank0_only: bool=False) -> None:
    from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig, ShardedOptimStateDictConfig, ShardedStateDictConfig, StateDictType, FullyShardedDataParallel as FSDP
    if full:
        FSDP.set_state_dict_type(side.model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(offload_to_cpu=offload, rank0_only=rank0_only), FullOptimStateDictConfig(offload_to_cpu=offload, rank0_only=rank0_only))
    else:
        FSDP.set_state_dict_type(side.model, StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig(offload_to_cpu=offload), ShardedOptimStateDictConfig(offload_to_cpu=offload))

def fsdp1_optim_state_dict(side: Side) -> dict[str, Any]:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    assert side.opt is not None
    osd = FSDP.optim_state_dict(side.model, side.opt)
    return osd

def state_dict_options(o: Options) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    extra = {n: True for n in ('ignore_frozen_params', 'flatten_optimizer_state_dict') if getattr(o, n)}

def frozen_names(side: Side) -> list[str]:
    return sorted((clean_name(n) for n, p in side.model.named_parameters() if not p.requires_grad))

def _take(body: StateDictBody, side: Side) -> tuple[dict[str, Any], dict[str, Any]]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict, get_state_dict
    options = state_dict_options(body.save)
    assert side.opt is not None
    if body.api is Api.FSDP1:
        only0 = body.load.broadcast_from_rank0
        fsdp1_state_dict_type(side, full=body.save.full_state_dict, offload=body.save.cpu_offload, rank0_only=only0)
        return (side.model.state_dict(), fsdp1_optim_state_dict(side))
    if body.api is Api.COMBINED:
        return get_state_dict(side.model, side.opt, options=options)
    if body.api is Api.MODULE:
        msd = side.model.state_dict()
    else:
        msd = get_model_state_dict(side.model, options=options)
    return (msd, get_optimizer_state_dict(side.model, side.opt, options=options))

def incompatible(result: Any) -> dict[str, list[str]]:
    missing = getattr(result, 'missing_keys', []) or []
    unexpected = getattr(result, 'unexpected_keys', []) or []
    return {'missing': sorted((clean_name(k) for k in missing)), 'unexpected': sorted((clean_name(k) for k in unexpected))}

def run_state_dict(case: Case, body: StateDictBody, ctx: RankContext) -> dict[str, Any]:
    t = body.training
    data = all_batches(case, t, t.steps + body.steps_after, body.tree, ctx)
    src = build_side(body.tree, body.source, t, ctx, seed=case.seed, schedule=body.requires_grad)
    body_optimizer(src, t, body)
    seed_segment(case, ctx, 0)
    msd, osd = _take(body, src)
    ignored = []
    if body.save.ignore_frozen_params:
        ignored = frozen_names(src)
        every = model_keys(src)
        if ctx.rank == 0:
            obs['ignore_frozen'] = {'keys': sorted((clean_name(k) for k in msd)), 'expected': sorted(set(every) - set(ignored))}
    if body.save.flatten_optimizer_state_dict:
        if ctx.rank == 0:
            obs['flat_optimizer'] = flat_obs
    if not src.fsdp1:
        if ctx.rank == 0:
            obs['taken_optimizer'] = taken
    msd, osd = copy.deepcopy((msd, osd))
    if src.fsdp1 and (not is_fsdp1(body.target)):
        if ctx.rank == 0:
            obs['saved']['optimizer'] = saved_optim
    tgt = build_side(body.tree, body.target, t, ctx, seed=case.seed + FRESH_SEED, meta=body.target_meta_init, schedule=body.requires_grad)
    if not body.target_meta_init:
        body_optimizer(tgt, fresh_training(t), body)
        catch_up(tgt, t.steps)
    obs['dropped'] = dropped
    if dropped:
        msd = {k: v for k, v in msd.items() if k not in dropped}
    if body.api is Api.FSDP1 and body.load.broadcast_from_rank0:
        pass
    elif body.load.broadcast_from_rank0 and ctx.rank != 0:
        msd, osd = ({}, {})
    before = requires_grad(tgt)
    obs['load_result'] = incompatible(result)
    obs['requires_grad'] = {'before': before, 'after': after}
    if body.steps_after:
        pass
    return obs

def main():
    import os
    import re
    import subprocess
    import sys
    if not os.environ.get('REPRO_CHILD'):
        env = {**os.environ, 'REPRO_CHILD': '1'}
        child = subprocess.run([sys.executable, __file__], env=env, stderr=subprocess.PIPE, text=True)
        frames = re.findall('File "[^"]+/torch/([^"]+)", line \\d+ in (\\S+)', child.stderr)
        found = f'signal {child.returncode}@torch/{frames[0][0]}:{frames[0][1]}' if frames else ''
        if found in ['signal -11@torch/distributed/fsdp/_state_dict_utils.py:param_hook']:
            print(f"REPRODUCED crash:state_dict:signal SIGSEGV@torch/distributed/fsdp/_state_dict_utils.py:param_hook: rank {os.environ['RANK']} died: {found}", flush=True)
            sys.exit(1)
        print(f'PASS or another failure: exit {child.returncode}', flush=True)
        sys.exit(0)
    import faulthandler
    faulthandler.enable()
    import os
    import torch
    import torch.distributed as dist
    case = Case(property='state_dict', world_size=2, seed=0, body=StateDictBody(tree=ModuleTree(width=1, root=Block(children=(Leaf(kind=LeafKind.CONV1D, bias=False), Leaf(kind=LeafKind.CONV1D, bias=False, frozen=True)))), source=Composition(wrapper=Wrapper.FSDP1_FULL_SHARD), target=Composition(wrapper=Wrapper.FSDP1_FULL_SHARD), training=Training(lr=0.01, eps=0.0001, steps=1, batch_per_rank=1, set_to_none=False), api=Api.FSDP1, save=Options(full_state_dict=True, cpu_offload=True), load=Options(full_state_dict=True)))
    dist.init_process_group('gloo')
    rank, world_size = (dist.get_rank(), dist.get_world_size())
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    run_state_dict(case, case.body, ctx)
if __name__ == '__main__':
    main()
