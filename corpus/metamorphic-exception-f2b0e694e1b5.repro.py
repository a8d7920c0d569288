#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=14b13112cdb7665b sources=845e968d7c09e2fe seconds=403.7
"""Reproduces shardfuzz corpus entry metamorphic-exception-f2b0e694e1b5.json: exception:metamorphic:torch._dynamo.exc.InternalTorchDynamoError@torch/nn/modules/conv.py:_conv_forward

Observed: torch.compile over FSDP1 (use_orig_params=True, sharded): Dynamo recompiles the
wrapped module's forward while its parameters hold sharded gradients and fails
(InternalTorchDynamoError 'attempting to assign a gradient of size ...'); found at 4 ranks on
torch 2.11, reproduced at 2 and 4 ranks on torch 2.13 CPU. Reproducer: docs/known_bugs.md.
Known torch bug: torch.compile over FSDP1 (use_orig_params=True, sharded): recompiling the
wrapped module's forward while its parameters hold sharded gradients raises
InternalTorchDynamoError 'attempting to assign a gradient of size ...'; upstream:
https://github.com/pytorch/pytorch/issues/111317.
Expected: no rank raises.

    torchrun --nproc-per-node 4 THIS_FILE.py

prints REPRODUCED and exits 1 while the failure is there, else exits 0.
"""

from __future__ import annotations
import importlib
from typing import Any
from dataclasses import dataclass, field
import torch
import enum
import typing
from dataclasses import dataclass
from typing import Union
from dataclasses import dataclass, field, fields
from functools import cached_property
from dataclasses import replace
import builtins
from typing import Any, ClassVar
import dataclasses
from typing import Any, Union
import os
from typing import ClassVar
from torch import nn
import functools
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
import copy
import torch.distributed as dist
import torch.nn.functional as F
_EXPORTS = {'Case': 'fuzz.model', 'case_from_json': 'fuzz.model', 'case_to_json': 'fuzz.model', 'SCHEMA_VERSION': 'fuzz.model', 'RankPool': 'fuzz.pool', 'Outcome': 'fuzz.verdict', 'OutcomeKind': 'fuzz.verdict', 'Property': 'fuzz.properties', 'all_properties': 'fuzz.properties', 'get_property': 'fuzz.properties', 'Failure': 'fuzz.signature', 'explore': 'fuzz.explore', 'run_case': 'fuzz.explore', 'Entry': 'fuzz.corpus', 'load_corpus': 'fuzz.corpus', 'load_entry': 'fuzz.corpus', 'save_entry': 'fuzz.corpus', 'ShardfuzzError': 'fuzz.errors', 'InvalidArgument': 'fuzz.errors', 'CaseError': 'fuzz.errors', 'PoolError': 'fuzz.errors'}

def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'fuzz' has no attribute {name!r}")

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

class ShardfuzzError(Exception):
    pass

class InvalidArgument(ShardfuzzError, ValueError):
    pass

class CaseError(ShardfuzzError, ValueError):

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        super().__init__(f'{path}: {message}')

class PoolError(ShardfuzzError, RuntimeError):
    pass
MAX_WIDTH = 64
MAX_DEPTH = 6

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
            raise CaseError('bias', f'bias=False only applies to parameter leaves, not {self.kind.value}')
        if self.frozen and self.kind not in PARAM_LEAVES:
            raise CaseError('frozen', f'frozen=True only applies to parameter leaves, not {self.kind.value}')

@dataclass(frozen=True)
class Block:
    children: object
    residual: object = False
    scale: object = False
    buffer: object = False

    def __post_init__(self) -> None:
        if not self.children:
            raise CaseError('children', 'a block needs at least one child')
Node = Union[Leaf, Block]

def iter_paths(block: Block, prefix: str='') -> typing.Iterator[tuple[str, Node]]:
    yield (prefix, block)
    for i, child in enumerate(block.children):
        path = f'{prefix}.{i}' if prefix else str(i)
        if isinstance(child, Block):
            yield from iter_paths(child, path)
        else:
            yield (path, child)

def has_params(node: Node) -> bool:
    if isinstance(node, Leaf):
        return node.kind in PARAM_LEAVES
    return node.scale or any((has_params(c) for c in node.children))

def owns_params(node: Node) -> bool:
    if isinstance(node, Leaf):
        return node.kind in PARAM_LEAVES
    return node.scale

def forward_order(block: Block, prefix: str='') -> list[str]:
    out = []
    for i, child in enumerate(block.children):
        path = f'{prefix}.{i}' if prefix else str(i)
        if isinstance(child, Block):
            out += forward_order(child, path)
        elif owns_params(child):
            out.append(path)
    if block.scale:
        out.append(prefix)
    return out

def param_names(node: Node) -> list[str]:
    if isinstance(node, Leaf):
        if node.kind not in PARAM_LEAVES:
            return []
        return ['weight', 'bias'] if node.bias else ['weight']
    return ['scale'] if node.scale else []

def tree_depth(node: Node) -> int:
    if isinstance(node, Leaf):
        return 0
    return 1 + max((tree_depth(c) for c in node.children))

@dataclass(frozen=True)
class ModuleTree:
    width: object
    root: object

    def __post_init__(self) -> None:
        if not 1 <= self.width <= MAX_WIDTH:
            raise CaseError('width', f'width={self.width} is outside 1..{MAX_WIDTH}')
        if tree_depth(self.root) > MAX_DEPTH:
            raise CaseError('root', f'tree depth {tree_depth(self.root)} exceeds {MAX_DEPTH}')

    def paths(self) -> dict[str, Node]:
        return dict(iter_paths(self.root))

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
class MixedPrecision:
    param_dtype: object = None
    reduce_dtype: object = None
    output_dtype: object = None
    cast_forward_inputs: object = True

@dataclass(frozen=True)
class ShardSpec:
    path: object
    reshard_after_forward: object = True
    shard_dim: object = 0
    group: object = ()
    mixed_precision: object = None
    offload: object = False
    ignored: object = ()

    def __post_init__(self) -> None:
        raf = self.reshard_after_forward
        if not isinstance(raf, bool) and raf < 2:
            raise CaseError('reshard_after_forward', f'an int must be a divisor >= 2 of the shard size, got {raf}')
        if self.shard_dim not in (0, 1):
            raise CaseError('shard_dim', f'shard_dim={self.shard_dim} must be 0 or 1')

    @property
    def paths(self) -> tuple[str, ...]:
        return (self.path, *self.group)

@dataclass(frozen=True)
class Knobs:
    forward_prefetch: object = 0
    backward_prefetch: object = 0
    reshard_after_backward_last: object = False
    late_reshard_after_forward: object = None
    explicit_unshard: object = False
    all_reduce_hook_scale: object = None
    gradient_divide_factor: object = None
    abort_and_reset: object = False
    rs_max_buffers: object = 0
    reduce_scatter_unused: object = False

    def __post_init__(self) -> None:
        if not 0 <= self.rs_max_buffers <= 4:
            raise CaseError('rs_max_buffers', f'rs_max_buffers={self.rs_max_buffers} is outside 0..4 (0: not set)')
        if self.abort_and_reset and self.explicit_unshard:
            raise CaseError('abort_and_reset', 'not drawn with explicit_unshard')
        for name in ('forward_prefetch', 'backward_prefetch'):
            if not 0 <= getattr(self, name) <= 3:
                raise CaseError(name, f'{name}={getattr(self, name)} is outside 0..3')
        if self.all_reduce_hook_scale is not None and self.all_reduce_hook_scale not in (0.5, 2.0):
            raise CaseError('all_reduce_hook_scale', f'{self.all_reduce_hook_scale} must be 0.5 or 2.0 (exact)')
        if self.gradient_divide_factor is not None and (not 0.5 <= self.gradient_divide_factor <= 64):
            raise CaseError('gradient_divide_factor', f'{self.gradient_divide_factor} is outside [0.5, 64]')

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

class ReplicateGroup(str, enum.Enum):
    DEFAULT = 'default'
    PROCESS_GROUP = 'process_group'
    DEVICE_MESH = 'device_mesh'

@dataclass(frozen=True)
class ReplicateOptions:
    bucket_cap_mb: object = None
    bucket_cap_mb_list: object = ()
    gradient_as_bucket_view: object = False
    static_graph: object = False
    init_sync: object = True
    dim: object = 0
    group: object = ReplicateGroup.DEFAULT
    device_id: object = False
    ignored_modules: object = ()
    forward_sync_buffers: object = None
    batched_grad_copy: object = False
    skip_all_reduce_unused_params: object = False
    delay_all_reduce: object = False

    def __post_init__(self) -> None:
        caps = (*(() if self.bucket_cap_mb is None else (self.bucket_cap_mb,)), *self.bucket_cap_mb_list)
        if any((not 0 <= c <= 1024 for c in caps)):
            raise CaseError('bucket_cap_mb', f'bucket capacities {caps} must lie in [0, 1024] MiB')
        if self.dim not in (0, 1):
            raise CaseError('dim', f'dim={self.dim} must be 0 or 1')

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

class ContextFn(str, enum.Enum):
    NONE = 'none'
    SAVE_MATMULS = 'save_matmuls'
    SAVE_MATMULS_LIST = 'save_matmuls_list'

@dataclass(frozen=True)
class CheckpointOptions:
    preserve_rng_state: object = True
    context_fn: object = ContextFn.NONE
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
        if self.context_fn is not ContextFn.NONE:
            out.append(f'context_fn:{self.context_fn.value}')
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
            raise CaseError('find_unused', 'find_unused_parameters applies to DDP and replicate only')
        if self.tp_size < 1:
            raise CaseError('tp_size', f'tp_size={self.tp_size} must be at least 1')
        if bool(self.tp) != (self.tp_size > 1):
            raise CaseError('tp', f'tp pairs ({len(self.tp)}) and tp_size={self.tp_size} go together: both or neither')
        if self.tp and (self.mesh or self.wrapper is not Wrapper.NONE or self.replicates or self.meta_init):
            raise CaseError('tp', 'tensor parallelism combines with fully_shard (1D) and checkpoint only')
        if self.tp and '' not in self.sharded_paths:
            raise CaseError('tp', 'tensor parallelism needs fully_shard on the root (it reduces the gradients)')
        if self.mesh and len(self.mesh) != 2:
            raise CaseError('mesh', f'mesh={self.mesh} must be () or (replicate, shard)')
        if self.wrapper is not Wrapper.NONE and (self.shards or self.replicates):
            raise CaseError('wrapper', f'wrapper={self.wrapper.value} does not combine with fully_shard / replicate')
        if self.auto_wrap and (not self.wrapper.value.startswith('fsdp1')):
            raise CaseError('auto_wrap', 'auto_wrap applies to FSDP1 wrappers only')
        if self.wrapper is Wrapper.FSDP1_HYBRID_SHARD and (not self.mesh):
            raise CaseError('mesh', 'fsdp1_hybrid_shard needs a (replicate, shard) mesh')
        if self.meta_init and (self.wrapper is not Wrapper.NONE or self.replicates):
            raise CaseError('meta_init', 'meta_init applies to fully_shard / checkpoint compositions only')
        if self.knobs.is_set and (not self.shards):
            raise CaseError('knobs', 'FSDPModule methods need fully_shard units')
        if self.knobs.late_reshard_after_forward is not None and self.replicates:
            raise CaseError('knobs.late_reshard_after_forward', 'not drawn with replicate')
        if self.knobs.late_reshard_after_forward is not None and any((not isinstance(s.reshard_after_forward, bool) for s in self.shards)):
            raise CaseError('knobs.late_reshard_after_forward', 'not drawn with an int reshard_after_forward')
        if self.knobs.abort_and_reset and ('' not in self.sharded_paths or self.replicates):
            raise CaseError('knobs.abort_and_reset', 'needs fully_shard on the root and no replicate')
        if self.knobs.is_set and self.tp:
            raise CaseError('knobs', 'not drawn with tensor parallelism')
        if self.replicate_options.is_set and (not self.replicates):
            raise CaseError('replicate_options', 'replicate options need replicate calls')
        if self.checkpoint_options.is_set and (not self.checkpoints):
            raise CaseError('checkpoint_options', 'checkpoint options need checkpoint calls')

    def uniform_precision(self) -> MixedPrecision | None:
        specs = self.shards
        if not specs or self.replicates or self.wrapper is not Wrapper.NONE or self.tp:
            return None
        root = next((s for s in specs if s.path == ''), None)
        if root is None or root.mixed_precision is None or (not root.mixed_precision.cast_forward_inputs):
            return None
        policy = root.mixed_precision
        for spec in specs:
            mp = spec.mixed_precision
            if mp is None or (mp.param_dtype, mp.reduce_dtype) != (policy.param_dtype, policy.reduce_dtype):
                return None
            if spec is not root and mp.output_dtype not in (None, mp.param_dtype):
                return None
        return policy

    def reshard_after_forward(self, spec: ShardSpec) -> bool | int:
        late = self.knobs.late_reshard_after_forward
        return spec.reshard_after_forward if late is None else late

    @property
    def sharded_paths(self) -> list[str]:
        return [p for spec in self.shards for p in spec.paths]

    @property
    def shard_ignored(self) -> frozenset[str]:
        return frozenset((p for spec in self.shards for p in spec.ignored))

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

@dataclass(frozen=True)
class Unit:
    api: object
    index: object
    members: object

@dataclass(frozen=True)
class Layout:
    tree: object
    comp: object

    @cached_property
    def paths(self) -> dict[str, Node]:
        return self.tree.paths()

    @cached_property
    def units(self) -> tuple[Unit, ...]:
        shards = tuple((Unit('fully_shard', i, spec.paths) for i, spec in enumerate(self.comp.shards)))
        return shards + tuple((Unit('replicate', i, (p,)) for i, p in enumerate(self.comp.replicates)))

    @cached_property
    def member_paths(self) -> tuple[str, ...]:
        return tuple((m for u in self.units for m in u.members))

    def member_of(self, path: str, api: str | None=None) -> str | None:
        best = None
        members = self.member_paths if api is None else [m for u in self.units if u.api == api for m in u.members]
        for m in members:
            if contains(m, path) and (best is None or is_ancestor(best, m)):
                best = m
        ignored = self.comp.replicate_options.ignored_modules
        if best in self.comp.replicates and api != 'fully_shard' and any((is_ancestor(best, i) and contains(i, path) for i in ignored)):
            return None
        if best is not None and path in self._shard_ignored.get(best, ()):
            return None
        return best

    @cached_property
    def _shard_ignored(self) -> dict[str, tuple[str, ...]]:
        return {m: spec.ignored for spec in self.comp.shards if spec.ignored for m in spec.paths}

    def unit_of(self, path: str) -> Unit | None:
        member = self.member_of(path)
        if member is None:
            return None
        return next((u for u in self.units if member in u.members))

    def owned_by(self, unit: Unit, member: str | None=None) -> list[str]:
        out = []
        for path, node in self.paths.items():
            if owns_params(node) and self.member_of(path) in (unit.members if member is None else (member,)):
                out.append(path)
        return out

    def manages_under(self, member: str, path: str) -> bool:
        return any((contains(path, sub) and owns_params(n) and (self.member_of(sub) == member) for sub, n in self.paths.items()))

    def local(self) -> list[str]:
        ignored = self.comp.replicate_options.ignored_modules
        by_shards = self.comp.shard_ignored
        return [p for p, n in self.paths.items() if owns_params(n) and (any((contains(i, p) for i in ignored)) or p in by_shards) and (self.member_of(p) is None)]

    def ignored_by(self, member: str) -> list[str]:
        out = []
        for i in self.comp.replicate_options.ignored_modules:
            above = [r for r in self.comp.replicates if is_ancestor(r, i)]
            if above and max(above, key=lambda r: r.count('.') + (r != '')) == member:
                out.append(i)
        return out

    def replicated_params(self, member: str) -> list[tuple[str, str]]:
        unit = next((u for u in self.units if u.api == 'replicate' and u.members == (member,)))
        return [(p, name) for p in self.owned_by(unit) for name in param_names(self.paths[p])]

    def delay_plan(self, member: str) -> tuple[str, tuple[str, ...]] | None:
        unit = next((u for u in self.units if u.api == 'replicate' and u.members == (member,)))
        owned = set(self.owned_by(unit))
        order = [p for p in forward_order(self.tree.root) if p in owned and self._trainable(p)]
        if len(order) < 2:
            return None
        return (order[0], tuple(order[1:]))

    def _trainable(self, path: str) -> bool:
        node = self.paths[path]
        return not (isinstance(node, Leaf) and node.frozen)

    def gradient_scale(self, path: str, world_size: int) -> float:
        unit = self.unit_of(path)
        if unit is None or unit.api != 'fully_shard':
            return 1.0
        knobs = self.comp.knobs
        scale = 1.0 if knobs.all_reduce_hook_scale is None else knobs.all_reduce_hook_scale
        if knobs.gradient_divide_factor is not None:
            scale *= world_size // self.comp.tp_size / knobs.gradient_divide_factor
        return scale
MAX_STEPS = 16

class AccumSync(str, enum.Enum):
    ALWAYS = 'always'
    NO_GRAD_SYNC = 'no_grad_sync'
    NO_ALL_REDUCE = 'no_all_reduce'

class Optimizer(str, enum.Enum):
    SGD = 'sgd'
    ADAM = 'adam'
    ADAMW = 'adamw'

class Compile(str, enum.Enum):
    NONE = 'none'
    EAGER = 'eager'
    AOT_EAGER = 'aot_eager'

@dataclass(frozen=True)
class Skip:
    path: object
    step: object
    microbatch: object = 0

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
    accum_sync: object = AccumSync.ALWAYS
    set_to_none: object = True
    same_input: object = False
    param_groups: object = 1
    foreach: object = None
    skips: object = ()
    unfreeze: object = ()
    compile: object = Compile.NONE

    def __post_init__(self) -> None:
        if not 1 <= self.steps <= MAX_STEPS:
            raise CaseError('steps', f'steps={self.steps} is outside 1..{MAX_STEPS}')
        if not 1 <= self.batch_per_rank <= 64:
            raise CaseError('batch_per_rank', f'batch_per_rank={self.batch_per_rank} is outside 1..64')
        if not 0.0 < self.lr <= 1.0:
            raise CaseError('lr', f'lr={self.lr} is outside (0, 1]')
        if not 0.0 <= self.momentum < 1.0:
            raise CaseError('momentum', f'momentum={self.momentum} is outside [0, 1)')
        if self.eps <= 0.0:
            raise CaseError('eps', f'eps={self.eps} must be positive')
        if self.dtype not in (Dtype.FLOAT32, Dtype.FLOAT64):
            raise CaseError('dtype', f'dtype={self.dtype.value}: low precision comes from a MixedPrecision policy')
        if not 1 <= self.grad_accum <= 4:
            raise CaseError('grad_accum', f'grad_accum={self.grad_accum} is outside 1..4')
        if self.param_groups not in (1, 2):
            raise CaseError('param_groups', f'param_groups={self.param_groups} must be 1 or 2')
        for i, skip in enumerate(self.skips):
            if not 0 <= skip.step < self.steps:
                raise CaseError(f'skips[{i}].step', f'step={skip.step} is outside 0..{self.steps - 1} (steps={self.steps})')
            if not 0 <= skip.microbatch < self.grad_accum:
                raise CaseError(f'skips[{i}].microbatch', f'microbatch={skip.microbatch} is outside 0..{self.grad_accum - 1} (grad_accum={self.grad_accum})')
            if skip in self.skips[:i]:
                raise CaseError(f'skips[{i}]', f'{skip.path!r} at step {skip.step}, microbatch {skip.microbatch} twice')
        for i, later in enumerate(self.unfreeze):
            if not 1 <= later.step < self.steps:
                raise CaseError(f'unfreeze[{i}].step', f'step={later.step} is outside 1..{self.steps - 1}: a leaf is unfrozen after a first step')
            if any((u.path == later.path for u in self.unfreeze[:i])):
                raise CaseError(f'unfreeze[{i}].path', f'{later.path!r} is unfrozen twice')

    def skipped_at(self, step: int, microbatch: int) -> list[str]:
        return [s.path for s in self.skips if s.step == step and s.microbatch == microbatch]

def mixed_precision_comparable(training: Training) -> bool:
    return (training.grad_accum == 1 or training.accum_sync is AccumSync.ALWAYS) and (not training.skips) and (not training.unfreeze) and (training.compile is Compile.NONE)

def check_mesh(comp: Composition, world_size: int, where: str='composition') -> None:
    if comp.mesh and comp.mesh[0] * comp.mesh[1] != world_size:
        r, sh = comp.mesh
        raise CaseError(f'{where}.mesh', f'mesh=({r}, {sh}) needs world_size={r * sh}, not {world_size}')
    if world_size % comp.tp_size:
        raise CaseError(f'{where}.tp_size', f'tp_size={comp.tp_size} does not divide world_size={world_size}')
    shard_size = comp.mesh[1] if comp.mesh else world_size // comp.tp_size
    for i, spec in enumerate(comp.shards):
        raf = spec.reshard_after_forward
        if not isinstance(raf, bool) and (raf >= shard_size or shard_size % raf):
            raise CaseError(f'{where}.shards[{i}].reshard_after_forward', f'{raf} is not a divisor of the shard size {shard_size} (world_size={world_size}, mesh={comp.mesh}) other than 1 and itself')

def _trainable_used(node: Node, path: str, skipped: list[str], unfrozen: set[str]) -> bool:
    if path in skipped:
        return False
    if isinstance(node, Leaf):
        return node.kind in PARAM_LEAVES and (not node.frozen or path in unfrozen)
    children = ((f'{path}.{i}' if path else str(i), c) for i, c in enumerate(node.children))
    return node.scale or any((_trainable_used(c, p, skipped, unfrozen) for p, c in children))

def check_training(tree: ModuleTree, comps: tuple[Composition, ...], t: Training, where: str='training') -> None:
    paths = tree.paths()
    for i, skip in enumerate(t.skips):
        if skip.path not in paths or skip.path == '':
            raise CaseError(f'{where}.skips[{i}].path', f'{skip.path!r} names no module below the root')
    for i, later in enumerate(t.unfreeze):
        node = paths.get(later.path)
        if not (isinstance(node, Leaf) and node.frozen):
            raise CaseError(f'{where}.unfreeze[{i}].path', f'{later.path!r} names no frozen leaf')
        for comp in comps:
            if comp.wrapper is Wrapper.DDP or any((contains(r, later.path) and Layout(tree, comp).manages_under(r, later.path) for r in comp.replicates)):
                raise CaseError(f'{where}.unfreeze[{i}].path', f'{later.path!r} is managed by DDP / replicate')
            if comp.wrapper is not Wrapper.NONE and t.accum_sync is AccumSync.NO_GRAD_SYNC:
                raise CaseError(f'{where}.unfreeze[{i}].path', 'FSDP1 no_sync() with a leaf unfrozen later')
    for comp in comps:
        k = comp.knobs
        if k.reduce_scatter_unused and t.skips:
            raise CaseError(f'{where}.skips', 'set_reduce_scatter_unused_params is drawn without skipped modules')
        if k.is_set and t.compile is not Compile.NONE:
            raise CaseError(f'{where}.compile', 'FSDPModule knobs are not drawn with torch.compile')
        if (k.forward_prefetch or k.backward_prefetch or k.reshard_after_backward_last or k.explicit_unshard) and t.skips:
            raise CaseError(f'{where}.skips', 'prefetch, explicit unshard and reshard_after_backward are drawn without skips')
        _check_replicate_training(comp, t, where)
        if (comp.replicate_options.is_set or comp.checkpoint_options.is_set) and t.compile is not Compile.NONE:
            raise CaseError(f'{where}.compile', 'replicate / checkpoint options are drawn without torch.compile')
        if comp.tp and (t.skips or t.unfreeze or t.compile is not Compile.NONE):
            raise CaseError(f'{where}', 'tensor parallelism is trained without skips, unfreeze or compile')
        if t.compile is Compile.AOT_EAGER and (comp.checkpoints or comp.wrapper not in (Wrapper.NONE, Wrapper.DDP)):
            raise CaseError(f'{where}.compile', 'aot_eager with checkpoint or FSDP1 is not drawn yet')
    for i, skip in enumerate(t.skips):
        at = f'{where}.skips[{i}]'
        unfrozen = {u.path for u in t.unfreeze if u.step <= skip.step}
        if not _trainable_used(tree.root, '', t.skipped_at(skip.step, skip.microbatch), unfrozen):
            where_ = f'step {skip.step}, microbatch {skip.microbatch}'
            raise CaseError(at, f'{where_} leaves no trainable parameter in forward')
        if not has_params(paths[skip.path]):
            continue
        for comp in comps:
            _check_unused(tree, comp, t, skip, at)

def _check_replicate_training(comp: Composition, t: Training, where: str) -> None:
    opts = comp.replicate_options
    if not (opts.static_graph or opts.skip_all_reduce_unused_params or opts.delay_all_reduce) or not t.skips:
        return
    slots = [(s, m) for s in range(t.steps) for m in range(t.grad_accum)]
    for r in comp.replicates:
        seen = {frozenset((p for p in t.skipped_at(s, m) if contains(p, r) or contains(r, p))) for s, m in slots}
        if opts.delay_all_reduce and any(seen):
            raise CaseError(f'{where}.skips', f'delay_all_reduce: modules in or around replicate({r!r}) left out')
        if len(seen) > 1:
            raise CaseError(f'{where}.skips', f'static_graph / skip_all_reduce_unused_params: replicate({r!r}) sees other modules left out over time')

def _check_unused(tree: ModuleTree, comp: Composition, t: Training, skip: Skip, at: str) -> None:
    if not comp.find_unused and (not comp.replicate_options.static_graph) and (comp.wrapper is Wrapper.DDP or any((is_ancestor(r, skip.path) and Layout(tree, comp).manages_under(r, skip.path) for r in comp.replicates))):
        raise CaseError(at, f'{skip.path!r} holds parameters DDP manages: needs find_unused_parameters=True')
    if comp.wrapper not in (Wrapper.NONE, Wrapper.DDP):
        if t.optimizer is not Optimizer.SGD or t.momentum:
            raise CaseError(at, 'FSDP1 gives unused parameters zero gradients: only SGD without momentum')
        if t.accum_sync is AccumSync.NO_GRAD_SYNC and skip.microbatch == t.grad_accum - 1:
            raise CaseError(at, 'FSDP1 no_sync(): a unit unused on the microbatch that syncs is not supported')
MAX_WORLD_SIZE = 64

class Body:
    KIND: ClassVar[str]
    PROGRAM: ClassVar[str]
    registry: ClassVar[dict[str, type[Body]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.KIND in Body.registry:
            raise TypeError(f'two case bodies share KIND {cls.KIND!r}')
        Body.registry[cls.KIND] = cls

    def validate_for(self, world_size: int) -> None:
        pass

    @property
    def size(self) -> tuple[int, int]:
        return (1, 1)

@dataclass(frozen=True)
class ParityBody(Body):
    KIND: ClassVar[str] = 'parity'
    PROGRAM: ClassVar[str] = 'fuzz._rank.parity:run_parity'
    tree: object
    composition: object
    training: object = field(default_factory=Training)

    def __post_init__(self) -> None:
        if not has_params(self.tree.root):
            raise CaseError('tree', 'the tree has no parameters')
        t = self.training
        if t.accum_sync is AccumSync.NO_ALL_REDUCE and (not self.composition.mesh):
            raise CaseError('training.accum_sync', 'no_all_reduce needs an HSDP (replicate, shard) mesh')
        if t.accum_sync is not AccumSync.ALWAYS and self.composition.replicates:
            raise CaseError('training.accum_sync', 'replicate() has no gradient-sync switch; use always')
        check_training(self.tree, (self.composition,), t)

    @property
    def size(self) -> tuple[int, int]:
        return (self.tree.size, self.training.steps)

    def validate_for(self, world_size: int) -> None:
        check_mesh(self.composition, world_size)

@dataclass(frozen=True)
class MetamorphicBody(Body):
    KIND: ClassVar[str] = 'metamorphic'
    PROGRAM: ClassVar[str] = 'fuzz._rank.parity:run_metamorphic'
    tree: object
    composition: object
    variant: object
    training: object = field(default_factory=Training)

    def __post_init__(self) -> None:
        if not has_params(self.tree.root):
            raise CaseError('tree', 'the tree has no parameters')
        if self.training.accum_sync is not AccumSync.ALWAYS:
            raise CaseError('training.accum_sync', 'metamorphic cases use always')
        check_training(self.tree, (self.composition, self.variant), self.training)

    @property
    def size(self) -> tuple[int, int]:
        return (self.tree.size, self.training.steps)

    def validate_for(self, world_size: int) -> None:
        check_mesh(self.composition, world_size)
        check_mesh(self.variant, world_size, 'variant')

@dataclass(frozen=True)
class Case:
    property: object
    world_size: object
    seed: object
    body: object

    def __post_init__(self) -> None:
        if not 1 <= self.world_size <= MAX_WORLD_SIZE:
            raise CaseError('world_size', f'world_size={self.world_size} is outside 1..{MAX_WORLD_SIZE}')
        if not 0 <= self.seed < 2 ** 63:
            raise CaseError('seed', f'seed={self.seed} is outside 0..2**63-1')
        try:
            self.body.validate_for(self.world_size)
        except CaseError as e:
            raise CaseError(f'body.{e.path}', str(e).split(': ', 1)[1]) from None

    @builtins.property
    def size(self) -> tuple[int, int]:
        return self.body.size
SCHEMA_VERSION = 1

def to_jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and (not isinstance(value, type)):
        out = {}
        kind = getattr(type(value), 'KIND', None)
        if kind is not None:
            out['kind'] = kind
        for f in dataclasses.fields(value):
            out[f.name] = to_jsonable(getattr(value, f.name))
        return out
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return [to_jsonable(v) for v in value]
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    raise TypeError(f'cannot serialise {type(value).__name__}')

def case_to_json(case: Case) -> dict[str, Any]:
    return {'schema': SCHEMA_VERSION, **to_jsonable(case)}

def case_from_json(data: Any, path: str='case') -> Case:
    if not isinstance(data, dict):
        raise CaseError(path, f'expected a JSON object, got {type(data).__name__}')
    schema = data.get('schema')
    if isinstance(schema, bool) or not isinstance(schema, int) or schema != SCHEMA_VERSION:
        if isinstance(schema, int) and schema > SCHEMA_VERSION:
            raise CaseError(f'{path}.schema', f'schema {schema} is newer than this shardfuzz ({SCHEMA_VERSION}); upgrade shardfuzz')
        raise CaseError(f'{path}.schema', f'unsupported schema {schema!r}; expected {SCHEMA_VERSION}')
    body = {k: v for k, v in data.items() if k != 'schema'}
    assert isinstance(result, Case)
    return result

def fsdp_sharded(p: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor
    return isinstance(p, DTensor) and 'shard' in (p.device_mesh.mesh_dim_names or ('shard',))

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

def tree_blocks(model: nn.Module) -> dict[str, TreeBlock]:
    return {'.'.join((c for c in name.split('.') if c.isdigit())): m for name, m in model.named_modules() if isinstance(m, TreeBlock)}

def set_skipped(blocks: dict[str, TreeBlock], paths: list[str]) -> None:
    skipped = {p: set() for p in blocks}
    for path in paths:
        parent, _, name = path.rpartition('.')
        skipped[parent].add(name)
    for p, block in blocks.items():
        if block.skipped != skipped[p]:
            block.skipped = frozenset(skipped[p])

def replicate_kwargs(model: nn.Module, tree: ModuleTree | None, comp: Composition, path: str, ctx: RankContext) -> dict[str, Any]:
    opts = comp.replicate_options
    kwargs = {'find_unused_parameters': comp.find_unused}
    if opts.device_id:
        kwargs['device_id'] = ctx.device
    else:
        kwargs['device_ids'] = None if ctx.device.type == 'cpu' else [ctx.device]
    if not opts.is_set:
        return kwargs
    if tree is None:
        raise ValueError('replicate options need the tree the model was built from')
    if opts.bucket_cap_mb is not None:
        kwargs['bucket_cap_mb'] = opts.bucket_cap_mb
    if opts.bucket_cap_mb_list:
        kwargs['bucket_cap_mb_list'] = list(opts.bucket_cap_mb_list)
    for name in ('gradient_as_bucket_view', 'static_graph', 'batched_grad_copy', 'skip_all_reduce_unused_params'):
        if getattr(opts, name):
            kwargs[name] = True
    if not opts.init_sync:
        kwargs['init_sync'] = False
    if opts.dim:
        kwargs['dim'] = opts.dim
    if opts.forward_sync_buffers is not None:
        kwargs['forward_sync_buffers'] = opts.forward_sync_buffers
    if opts.group is ReplicateGroup.PROCESS_GROUP:
        kwargs['process_group'] = ctx.group('replicate')
    elif opts.group is ReplicateGroup.DEVICE_MESH:
        kwargs['device_mesh'] = ctx.mesh((ctx.world_size,), ('replicate',))
    layout = Layout(tree, comp)
    ignored = layout.ignored_by(path)
    if ignored:
        kwargs['ignored_modules'] = [model.get_submodule(p) for p in ignored]
    plan = layout.delay_plan(path) if opts.delay_all_reduce else None
    if plan is not None:
        hook, delayed = plan
        order = layout.replicated_params(path)
        kwargs['param_to_hook_all_reduce'] = model.get_submodule(hook).get_parameter(next((name for p, name in order if p == hook)))
        kwargs['delay_all_reduce_named_params'] = [(str(i), model.get_submodule(p).get_parameter(name)) for i, (p, name) in enumerate(order) if p in delayed]
    return kwargs

def delay_problems(model: nn.Module, comp: Composition) -> list[str]:
    from torch.distributed._composable import replicate
    problems = []
    for member in comp.replicates:
        ddp = getattr(replicate.state(model.get_submodule(member)), '_ddp', None)
        if ddp is None:
            continue
        reduced = {id(p) for p in ddp._build_params_for_reducer()[0]}
        held = [i for i, p in enumerate(ddp._delay_all_reduce_params) if id(p) in reduced]
        if held:
            problems.append(f"replicate({member!r}): {len(held)} of {len(ddp._delay_all_reduce_params)} delayed parameters are also in DDP's reducer (all-reduced twice)")
    return problems

def ignored_problems(model: nn.Module, tree: ModuleTree, comp: Composition) -> list[str]:
    from torch.distributed._composable import replicate
    from torch.distributed.tensor import DTensor
    layout = Layout(tree, comp)
    local = {id(p): f'{path}.{name}' if path else name for path in layout.local() for name, p in model.get_submodule(path).named_parameters(recurse=False)}
    problems = []
    for _, p in model.named_parameters():
        if id(p) in local and isinstance(p, DTensor):
            problems.append(f'ignored parameter {local[id(p)]} is a DTensor')
    for member in comp.replicates:
        state = replicate.state(model.get_submodule(member))
        ddp = getattr(state, '_ddp', None)
        held = [*getattr(state, '_param_list', [])]
        if ddp is not None:
            held += [*ddp._module_parameters, *ddp._delay_all_reduce_params]
        for p in held:
            if id(p) in local:
                problems.append(f'replicate({member!r}) manages ignored parameter {local[id(p)]}')
    return sorted(set(problems))

def _matmuls() -> list[Any]:
    aten = torch.ops.aten
    return [aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default]

def _save_matmuls_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    from torch.utils.checkpoint import CheckpointPolicy
    return CheckpointPolicy.MUST_SAVE if op in _matmuls() else CheckpointPolicy.PREFER_RECOMPUTE

def checkpoint_kwargs(opts: CheckpointOptions) -> dict[str, Any]:
    kwargs = {}
    if not opts.is_set:
        return kwargs
    if not opts.preserve_rng_state:
        kwargs['preserve_rng_state'] = False
    if opts.context_fn is not ContextFn.NONE:
        from torch.utils.checkpoint import create_selective_checkpoint_contexts
        policy = _save_matmuls_policy if opts.context_fn is ContextFn.SAVE_MATMULS else _matmuls()
        kwargs['context_fn'] = functools.partial(create_selective_checkpoint_contexts, policy)
    if opts.determinism_check is not None:
        kwargs['determinism_check'] = opts.determinism_check.value
    if opts.debug:
        kwargs['debug'] = True
    if opts.early_stop is not None:
        kwargs['early_stop'] = opts.early_stop
    return kwargs
TORCH_DTYPES = {Dtype.FLOAT32: torch.float32, Dtype.FLOAT64: torch.float64, Dtype.BFLOAT16: torch.bfloat16, Dtype.FLOAT16: torch.float16}
_WRAPPER_PREFIXES = ('_fsdp_wrapped_module.', 'module.', '_checkpoint_wrapped_module.')

def clean_name(name: str) -> str:
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, '')
    return name

def tp_mesh(comp: Composition, ctx: RankContext) -> Any:
    return ctx.mesh((ctx.world_size // comp.tp_size, comp.tp_size), ('shard', 'tp'))

def mesh_for(comp: Composition, ctx: RankContext) -> Any:
    if comp.tp:
        return tp_mesh(comp, ctx)['shard']
    if comp.mesh:
        return ctx.mesh(tuple(comp.mesh), ('replicate', 'shard'))
    return ctx.mesh((ctx.world_size,), ('shard',))

def _placement_fn(shard_dim: int, shard_size: int) -> Any:
    from torch.distributed.tensor import Shard

    def fn(param: nn.Parameter) -> Any:
        if param.ndim > shard_dim and param.shape[shard_dim] % shard_size == 0:
            return Shard(shard_dim)
        return None
    return fn

def mp_policy(mp: MixedPrecision) -> Any:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    def dt(d: Dtype | None) -> torch.dtype | None:
        return None if d is None else TORCH_DTYPES[d]
    return MixedPrecisionPolicy(param_dtype=dt(mp.param_dtype), reduce_dtype=dt(mp.reduce_dtype), output_dtype=dt(mp.output_dtype), cast_forward_inputs=mp.cast_forward_inputs)

def apply_fully_shard(model: nn.Module, spec: ShardSpec, mesh: Any) -> None:
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
    kwargs = {'mesh': mesh, 'reshard_after_forward': spec.reshard_after_forward}
    if spec.shard_dim:
        shard_size = mesh.size(mesh.ndim - 1)
        kwargs['shard_placement_fn'] = _placement_fn(spec.shard_dim, shard_size)
    if spec.mixed_precision is not None:
        kwargs['mp_policy'] = mp_policy(spec.mixed_precision)
    if spec.offload:
        kwargs['offload_policy'] = CPUOffloadPolicy()
    if spec.ignored:
        kwargs['ignored_params'] = {p for path in spec.ignored for p in model.get_submodule(path).parameters(recurse=False)}
    modules = [model.get_submodule(p) for p in spec.paths]
    fully_shard(modules if spec.group else modules[0], **kwargs)

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

    def set_sync(self, requires_gradient_sync: bool=True, requires_all_reduce: bool=True) -> None:
        for m in self.fsdp_roots:
            m.set_requires_gradient_sync(requires_gradient_sync)
            m.set_requires_all_reduce(requires_all_reduce)

    @contextmanager
    def full_parameters(self) -> Iterator[dict[str, torch.Tensor]]:
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
        out = {}
        for n, p in self.model.named_parameters():
            out[clean_name(n)] = (p.full_tensor() if isinstance(p, DTensor) else p).detach()
        yield out

def compose(model: nn.Module, comp: Composition, ctx: RankContext, tree: ModuleTree | None=None) -> Composed:
    from torch.distributed._composable import checkpoint, replicate
    ckpt_kwargs = checkpoint_kwargs(comp.checkpoint_options)
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
    mesh = mesh_for(comp, ctx)
    specs = {s.path: s for s in comp.shards}
    for api, path in comp.steps():
        if api == 'checkpoint':
            checkpoint(model.get_submodule(path), **ckpt_kwargs)
        elif api == 'fully_shard':
            apply_fully_shard(model, specs[path], mesh)
        else:
            replicate(model.get_submodule(path), **replicate_kwargs(model, tree, comp, path, ctx))
    sharded = comp.sharded_paths
    tops = [p for p in sharded if not any((is_ancestor(q, p) for q in sharded))]
    return Composed(model=model, fsdp_roots=[model.get_submodule(p) for p in tops])

def build_composed(tree: ModuleTree, comp: Composition, dtype: torch.dtype, ctx: RankContext, *, seed: int) -> tuple[nn.Module, Composed]:
    torch.manual_seed(seed)
    if not comp.meta_init:
        model = build_model(tree, ctx.device).to(dtype)
        return (model, _with_knobs(model, compose(model, comp, ctx, tree), comp, tree))
    from torch.distributed.tensor import DTensor, distribute_tensor
    values = build_model(tree, ctx.device).to(dtype).state_dict()
    model = build_model(tree, torch.device('meta')).to(dtype)
    composed = compose(model, comp, ctx, tree)
    offload = any((s.offload for s in comp.shards))
    model.to_empty(device='cpu' if offload else ctx.device)
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            src = values[clean_name(name)]
            if isinstance(t, DTensor) and offload:
                t.to_local().copy_(distribute_tensor(src, t.device_mesh, t.placements).to_local())
            elif isinstance(t, DTensor):
                t.copy_(distribute_tensor(src, t.device_mesh, t.placements))
            else:
                t.copy_(src)
        if offload:
            for module in model.modules():
                for key, buf in module._buffers.items():
                    if buf is not None:
                        module._buffers[key] = buf.to(ctx.device)
    return (model, _with_knobs(model, composed, comp, tree))

def _with_knobs(model: nn.Module, composed: Composed, comp: Composition, tree: ModuleTree) -> Composed:
    if comp.knobs.is_set:
        pass
    return composed

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
        kwargs['device_mesh'] = mesh_for(comp, ctx)
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
    if training.optimizer is Optimizer.SGD:
        return torch.optim.SGD(groups, lr=training.lr, momentum=training.momentum, foreach=foreach)
    if training.optimizer is Optimizer.ADAM:
        return torch.optim.Adam(groups, lr=training.lr, eps=training.eps, foreach=foreach)
    return torch.optim.AdamW(groups, lr=training.lr, eps=training.eps, foreach=foreach)

def full_parameters(model: nn.Module) -> dict[str, list[float]]:
    with Composed(model).full_parameters() as params:
        return {n: t.double().cpu().flatten().tolist() for n, t in params.items()}

def batches(case: Case, training: Training, width: int, ctx: RankContext, tp_size: int=1) -> list[list[tuple[Any, Any]]]:
    dtype = TORCH_DTYPES[training.dtype]
    gen = torch.Generator().manual_seed(case.seed)
    b = training.batch_per_rank
    lo = 0 if training.same_input else ctx.rank // tp_size * b
    out = []
    for _ in range(training.steps):
        step = []
        for _ in range(training.grad_accum):
            x = torch.randn(ctx.world_size * b, width, generator=gen, dtype=dtype)
            y = torch.randn(ctx.world_size * b, width, generator=gen, dtype=dtype)
            step.append((x[lo:lo + b].to(ctx.device), y[lo:lo + b].to(ctx.device)))
        out.append(step)
    return out

def _seed_for_run(case: Case, ctx: RankContext, tp_size: int=1) -> None:
    torch.manual_seed((case.seed * 7919 + ctx.rank // tp_size + 1) % 2 ** 63)

class _Contracts:

    def __init__(self, model: nn.Module, comp: Composition) -> None:
        self.model = model
        self.comp = comp
        self.leaf_dtypes: dict[str, str] = {}
        self.output_dtypes: dict[str, str] = {}
        self.handles: list[Any] = []
        for path in comp.sharded_paths:
            mod = model.get_submodule(path)
            self.handles.append(mod.register_forward_hook(self._on_output(path)))
        for name, mod in model.named_modules():
            if any((True for _ in mod.parameters(recurse=False))):
                self.handles.append(mod.register_forward_pre_hook(self._on_leaf(name)))

    def _on_output(self, path: str) -> Any:

        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if isinstance(output, torch.Tensor):
                self.output_dtypes.setdefault(path, str(output.dtype).removeprefix('torch.'))
        return hook

    def _on_leaf(self, name: str) -> Any:

        def hook(module: nn.Module, args: Any) -> None:
            p = next(module.parameters(recurse=False))
            self.leaf_dtypes.setdefault(name, str(p.dtype).removeprefix('torch.'))
        return hook

    def after_forward(self, skipped: list[str]) -> dict[str, Any]:
        for h in self.handles:
            h.remove()
        sharded = self.comp.sharded_paths + list(self.comp.replicates)
        state = {}
        for spec in self.comp.shards:
            flags = []
            if all((_under_any(path, skipped) for path in spec.paths)):
                state[spec.path] = flags
                continue
            if any((_under_any(path, skipped) for path in spec.paths)) and (not _completes_partial_groups()):
                state[spec.path] = flags
                continue
            for path in spec.paths:
                for sub, _ in iter_paths_of(self.model, path):
                    if sub != path and _under_other_unit(sub, path, sharded) or sub in spec.ignored:
                        continue
                    mod = self.model.get_submodule(sub)
                    flags += [fsdp_sharded(p) for p in mod.parameters(recurse=False)]
            state[spec.path] = flags
        return {'sharded_after_forward': state, 'leaf_dtypes': self.leaf_dtypes, 'output_dtypes': self.output_dtypes}

def _completes_partial_groups() -> bool:
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState
    return hasattr(FSDPState, '_force_complete_incomplete_states')

def iter_paths_of(model: nn.Module, path: str) -> list[tuple[str, nn.Module]]:
    root = model.get_submodule(path)
    return [(f'{path}.{n}' if path and n else n or path, m) for n, m in root.named_modules()]

def _under_other_unit(sub: str, unit: str, sharded: list[str]) -> bool:
    return any((is_ancestor(unit, other) and contains(other, sub) for other in sharded))

def _under_any(path: str, skipped: list[str]) -> bool:
    return any((contains(s, path) for s in skipped))

def replicate_contract(model: nn.Module, comp: Composition, skipped: list[str] | None=None) -> dict[str, list[str]]:
    from torch.distributed._composable import replicate
    out = {}
    for path in comp.replicates:
        if _under_any(path, skipped or []):
            continue
        state = replicate.state(model.get_submodule(path))
        out[path] = sorted(getattr(state, '_param_names', []))
    return out

def train(case: Case, tree: ModuleTree, training: Training, comp: Composition | None, ctx: RankContext, tp_size: int=1, grad_scales: dict[str, float] | None=None, precision: MixedPrecision | None=None, local: frozenset[str]=frozenset()) -> dict[str, Any]:
    dtype = TORCH_DTYPES[training.dtype]
    if comp is not None:
        model, composed = build_composed(tree, comp, dtype, ctx, seed=case.seed)
    else:
        torch.manual_seed(case.seed)
        model = build_model(tree, ctx.device).to(dtype)
        composed = Composed(model)
    contracts = _Contracts(model, comp) if comp is not None else None
    obs = {}
    blocks = tree_blocks(composed.model)
    later = _unfrozen_later(composed.model, training)
    opt = make_optimizer(composed.model.parameters(), training, [p for ps in later.values() for p in ps])
    forward = _compiled(composed.model, training) if comp is not None else composed.model
    _seed_for_run(case, ctx, tp_size)
    losses = []
    params_per_step = []
    grad_norms = []
    for s, step in enumerate(batches(case, training, tree.width, ctx, tp_size)):
        for path in [u.path for u in training.unfreeze if u.step == s]:
            for p in later[path]:
                p.requires_grad_(True)
        step_losses = []
        for i, (x, y) in enumerate(step):
            skipped = training.skipped_at(s, i)
            set_skipped(blocks, skipped)
            last = i == len(step) - 1
            sync = AccumSync.ALWAYS if last else training.accum_sync
            composed.set_sync(requires_gradient_sync=sync is not AccumSync.NO_GRAD_SYNC, requires_all_reduce=sync is AccumSync.ALWAYS)
            ctx_mgr = composed.no_sync() if sync is AccumSync.NO_GRAD_SYNC else _null()
            if composed.knobs is not None and composed.knobs.knobs.abort_and_reset and (s == 0) and (i == 0):
                composed.knobs.abort_and_reset(forward, x, skipped)
            if composed.knobs is not None:
                composed.knobs.before_microbatch(first=s == 0 and i == 0, last=last)
            if precision is not None:
                loss = _low_precision_microbatch(model, x, y, precision, training, ctx)
                step_losses.append(loss.item())
                continue
            with ctx_mgr:
                out = forward(x)
                if contracts is not None and comp is not None:
                    obs['contracts'] = contracts.after_forward(skipped)
                    obs['contracts']['output_dtype'] = str(out.dtype).removeprefix('torch.')
                    obs['contracts']['replicate_params'] = replicate_contract(model, comp, skipped)
                    if Layout(tree, comp).local():
                        obs['contracts']['ignored'] = ignored_problems(model, tree, comp)
                    if comp.replicate_options.delay_all_reduce:
                        obs['contracts']['delayed'] = delay_problems(model, comp)
                    contracts = None
                loss = F.mse_loss(out.to(y.dtype), y)
                loss.backward()
            step_losses.append(loss.item())
        if comp is None and precision is None:
            _average_gradients(model, ctx, grad_scales or {}, local)
        if composed.wrapper.value.startswith('fsdp1') and composed.wrapper.value != 'fsdp1_no_shard':
            grad_norms.append(float('nan'))
        else:
            grad_norms.append(_grad_norm(composed))
        opt.step()
        opt.zero_grad(set_to_none=training.set_to_none)
        losses.append(step_losses)
        with composed.full_parameters() as full:
            if ctx.rank == 0:
                params_per_step.append({n: t.double().cpu().flatten().tolist() for n, t in full.items()})
    obs['losses'] = losses
    obs['grad_norms'] = grad_norms
    obs['local_params'] = _local_replicated(composed.model, _local_of(tree, comp))
    obs['knob_problems'] = [] if composed.knobs is None else composed.knobs.problems
    if ctx.rank == 0:
        obs['params'] = params_per_step
    return obs

def _unfrozen_later(model: nn.Module, training: Training) -> dict[str, list[nn.Parameter]]:
    out = {u.path: [] for u in training.unfreeze}
    for name, p in model.named_parameters():
        owner = '.'.join((c for c in clean_name(name).split('.')[:-1] if c.isdigit()))
        if owner in out:
            out[owner].append(p)
    return out

def _compiled(model: nn.Module, training: Training) -> Any:
    if training.compile is Compile.NONE:
        return model
    torch._dynamo.reset()
    return torch.compile(model, backend=training.compile.value)

class _null:

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None

def _average_gradients(model: nn.Module, ctx: RankContext, scales: dict[str, float], local: frozenset[str]=frozenset()) -> None:
    for name, p in model.named_parameters():
        if p.grad is not None and name.rpartition('.')[0] not in local:
            dist.all_reduce(p.grad)
            p.grad /= ctx.world_size
            scale = scales.get(name.rpartition('.')[0], 1.0)
            if scale != 1.0:
                p.grad *= scale

def _low_precision_microbatch(model: nn.Module, x: torch.Tensor, y: torch.Tensor, mp: MixedPrecision, training: Training, ctx: RankContext) -> torch.Tensor:
    base = TORCH_DTYPES[training.dtype]
    compute = TORCH_DTYPES[mp.param_dtype] if mp.param_dtype is not None else base
    reduce = TORCH_DTYPES[mp.reduce_dtype] if mp.reduce_dtype is not None else compute
    shadow = copy.deepcopy(model).to(compute)
    out = shadow(x.to(compute))
    if mp.output_dtype is not None:
        out = out.to(TORCH_DTYPES[mp.output_dtype])
    loss = F.mse_loss(out.to(y.dtype), y)
    loss.backward()
    for p, q in zip(model.parameters(), shadow.parameters()):
        if q.grad is None:
            continue
        g = q.grad.to(reduce)
        before, after = _divide_split(reduce, ctx.world_size)
        if before != 1:
            g = g / before
        dist.all_reduce(g)
        g = (g / after).to(p.dtype)
        p.grad = g if p.grad is None else p.grad + g
    return loss

def _divide_split(reduce: torch.dtype, world_size: int) -> tuple[int, float]:
    if reduce in (torch.float32, torch.bfloat16) or world_size == 1:
        return (1, float(world_size))
    before = 1
    while world_size % before == 0 and world_size / before > before:
        before *= 2
    return (before, world_size / before)

def grad_scales(tree: ModuleTree, comp: Composition, world_size: int) -> dict[str, float]:
    layout = Layout(tree, comp)
    scales = {path: layout.gradient_scale(path, world_size) for path in layout.paths}
    return {path: scale for path, scale in scales.items() if scale != 1.0}

def _grad_norm(composed: Composed) -> float:
    from torch.distributed.tensor import DTensor
    total = torch.zeros((), dtype=torch.float64)
    for p in composed.model.parameters():
        if p.grad is not None:
            g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
            total += g.double().pow(2).sum().cpu()
    return float(total.sqrt())

def _local_of(tree: ModuleTree, comp: Composition | None) -> frozenset[str]:
    return frozenset() if comp is None else frozenset(Layout(tree, comp).local())

def _local_replicated(model: nn.Module, local: frozenset[str]=frozenset()) -> dict[str, list[float]]:
    from torch.distributed.tensor import DTensor
    return {n: p.detach().double().cpu().flatten().tolist() for n, p in model.named_parameters() if not isinstance(p, DTensor) and (not n.startswith('_fsdp_wrapped_module')) and ('_fsdp' not in n) and (clean_name(n).rpartition('.')[0] not in local)}

def run_parity(case: Case, body: ParityBody, ctx: RankContext) -> dict[str, Any]:
    tp = body.composition.tp_size
    comp = body.composition
    composed = train(case, body.tree, body.training, comp, ctx, tp)
    keys = ('losses', 'params', 'grad_norms')
    if any((s.mixed_precision is not None for s in comp.shards)):
        precision = comp.uniform_precision()
        if precision is None or not mixed_precision_comparable(body.training):
            return composed
        reference = train(case, body.tree, body.training, None, ctx, tp, precision=precision)
        return {**composed, 'ref': {k: reference[k] for k in keys if k in reference}}
    scales = grad_scales(body.tree, comp, ctx.world_size)
    reference = train(case, body.tree, body.training, None, ctx, tp, scales, local=_local_of(body.tree, comp))
    return {**composed, 'ref': {k: reference[k] for k in keys if k in reference}}

def run_metamorphic(case: Case, body: MetamorphicBody, ctx: RankContext) -> dict[str, Any]:
    first = train(case, body.tree, body.training, body.composition, ctx)
    second = train(case, body.tree, body.training, body.variant, ctx)
    keys = ('losses', 'params', 'grad_norms', 'knob_problems')
    return {**first, 'ref': {k: second[k] for k in keys if k in second}}

def attempt(rank, world_size):
    import torch
    import torch.distributed as dist
    case = Case(property='metamorphic', world_size=4, seed=5651, body=MetamorphicBody(tree=ModuleTree(width=1, root=Block(children=(Leaf(kind=LeafKind.CONV1D),), residual=True, buffer=True)), composition=Composition(replicates=('',), checkpoint_first=False, mesh=(1, 4)), variant=Composition(wrapper=Wrapper.FSDP1_FULL_SHARD, auto_wrap=True), training=Training(lr=0.05, momentum=0.9, steps=3, batch_per_rank=3, set_to_none=False, same_input=True, compile=Compile.EAGER)))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import re
    import traceback
    try:
        run_metamorphic(case, case.body, ctx)
    except BaseException as e:
        frames = re.findall('File "([^"]+)", line \\d+, in (\\S+)', traceback.format_exc())
        path, fn = [(p, f) for p, f in frames if '/torch/' in p and (not f.endswith('comp>'))][-1]
        found = f'{type(e).__module__}.{type(e).__qualname__}@torch/{path.rpartition("/torch/")[2]}:{fn}'
        if found in ['torch._dynamo.exc.InternalTorchDynamoError@torch/nn/modules/conv.py:_conv_forward']:
            return f'REPRODUCED exception:metamorphic:torch._dynamo.exc.InternalTorchDynamoError@torch/nn/modules/conv.py:_conv_forward: rank {rank} raised {found}: {e}'
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
