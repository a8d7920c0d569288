#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=3f73d62ad3e21a6b sources=b520f0ebcd6a699c seconds=99.4
"""Reproduces shardfuzz corpus entry dcp-mismatch-ada81405774d.json: mismatch:dcp@save:fsdp1-hsdp-load_sharded_optimizer_state_dict

Observed: Into FSDP1 HYBRID_SHARD over a 2-D mesh, load_sharded_optimizer_state_dict lays the
optimizer state out as chunks over the whole world instead of the model's DTensors over the
mesh, and FSDP.optim_state_dict_to_load takes those chunks for its own shards: wrong optimizer
state, no error. docs/known_bugs.md. (rank 2's local optimizer state (FSDP1, one layout) differs
after the load: ['0.weight']['exp_avg'][0]: 0.0 != -0.016777848531689548)
Known torch bug: load_sharded_optimizer_state_dict chunks optimizer state over the whole world:
wrong Adam state in FSDP1 HYBRID_SHARD over a 2-D mesh; upstream: none found.
Expected: the property's judge finds nothing.

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
import json
import types
from typing import Any, Union
import os
import tempfile
from typing import ClassVar
from torch import nn
import functools
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
import copy
import torch.distributed as dist
import torch.nn.functional as F
import inspect
from dataclasses import dataclass, field, replace
import hashlib
import shutil
import re
from collections.abc import Callable, Sequence
from collections.abc import Callable
import signal
import math
from collections.abc import Sequence
import atexit
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
    _cases: object = 0
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
Node = Union[Leaf, Block]

def iter_paths(block: Block, prefix: str='') -> typing.Iterator[tuple[str, Node]]:
    yield (prefix, block)
    for i, child in enumerate(block.children):
        path = str(i)
        yield (path, child)

def has_params(node: Node) -> bool:
    if isinstance(node, Leaf):
        return node.kind in PARAM_LEAVES
    return False or any((True for c in node.children))

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

@dataclass(frozen=True)
class ModuleTree:
    width: object
    root: object

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
    force_sum_reduction: object = False

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
        if ():
            raise CaseError('tp', 'tensor parallelism combines with fully_shard (1D) and checkpoint only')
        if ():
            raise CaseError('tp', 'tensor parallelism needs fully_shard on the root (it reduces the gradients)')
        if ():
            raise CaseError('wrapper', f'wrapper={self.wrapper.value} does not combine with fully_shard / replicate')

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

    def steps(self) -> list[tuple[str, str]]:
        order = {'checkpoint': 0, 'fully_shard': 1, 'replicate': 2}
        items = [('checkpoint', p) for p in ()] + [('replicate', p) for p in ()]
        items += [('fully_shard', spec.path) for spec in ()]

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

    def covers(self, path: str) -> bool:
        return any((contains(m, path) for m in self.members))

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

    def outermost(self, unit: Unit) -> bool:
        return not any((other != unit and other.api == 'fully_shard' and any((is_ancestor(o, m) for o in other.members for m in unit.members)) for other in self.units))

    def frozen_only(self, unit: Unit, member: str | None=None) -> bool:
        owned = [self.paths[p] for p in self.owned_by(unit, member)]
        return bool(owned) and all((isinstance(n, Leaf) and n.frozen for n in owned))

    def manages_under(self, member: str, path: str) -> bool:
        return any((contains(path, sub) and owns_params(n) and (self.member_of(sub) == member) for sub, n in self.paths.items()))

    def local(self) -> list[str]:
        ignored = self.comp.replicate_options.ignored_modules
        by_shards = {i for spec in self.comp.shards for i in spec.ignored}
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
    param_groups: object = 1
    foreach: object = None
    skips: object = ()
    unfreeze: object = ()
    compile: object = Compile.NONE

    def __post_init__(self) -> None:
        for i, skip in enumerate(()):
            if not 0 <= skip.step < self.steps:
                raise CaseError(f'skips[{i}].step', f'step={skip.step} is outside 0..{self.steps - 1} (steps={self.steps})')
            if not 0 <= skip.microbatch < self.grad_accum:
                raise CaseError(f'skips[{i}].microbatch', f'microbatch={skip.microbatch} is outside 0..{self.grad_accum - 1} (grad_accum={self.grad_accum})')
            if skip in self.skips[:i]:
                raise CaseError(f'skips[{i}]', f'{skip.path!r} at step {skip.step}, microbatch {skip.microbatch} twice')
        for i, later in enumerate(()):
            if not 1 <= later.step < self.steps:
                raise CaseError(f'unfreeze[{i}].step', f'step={later.step} is outside 1..{self.steps - 1}: a leaf is unfrozen after a first step')
            if any((u.path == later.path for u in self.unfreeze[:i])):
                raise CaseError(f'unfreeze[{i}].path', f'{later.path!r} is unfrozen twice')

    def skipped_at(self, step: int, microbatch: int) -> list[str]:
        return [s.path for s in self.skips if s.step == step and s.microbatch == microbatch]

    def unused_on_some_microbatches(self, tree: ModuleTree) -> bool:
        paths = tree.paths()
        for s in self.skips:
            if has_params(paths[s.path]) and any((s.path not in self.skipped_at(s.step, m) for m in range(self.grad_accum))):
                return True
        return False

def mixed_precision_comparable(training: Training) -> bool:
    return (training.grad_accum == 1 or training.accum_sync is AccumSync.ALWAYS) and (not training.skips) and (not training.unfreeze) and (training.compile is Compile.NONE)

def check_composition(tree: ModuleTree, comp: Composition, where: str='composition') -> None:
    paths = tree.paths()
    sharded = []
    for i, spec in enumerate(()):
        for j, path in enumerate(spec.paths):
            at = f'{where}.shards[{i}].' + ('path' if j == 0 else f'group[{j - 1}]')
            if path not in paths:
                raise CaseError(at, f'{path!r} names no module of the tree (paths: {sorted(paths)})')
            node = paths[path]
            if not has_params(node):
                what = f'a parameter-free {node.kind.value} leaf' if isinstance(node, Leaf) else 'holds no parameters'
                raise CaseError(at, f'{path!r} is {what}' if isinstance(node, Leaf) else f'{path!r} {what}')
            if path in sharded:
                raise CaseError(at, f'{path!r} is sharded twice')
            for other in spec.paths[:j]:
                if is_ancestor(other, path) or is_ancestor(path, other):
                    raise CaseError(at, f'{path!r} and {other!r} are nested; a group takes disjoint modules')
            sharded.append(path)
    for name, group in (('replicates', ()), ('checkpoints', ())):
        for i, path in enumerate(group):
            if path not in paths:
                raise CaseError(f'{where}.{name}[{i}]', f'{path!r} names no module of the tree')
            if group.count(path) > 1:
                raise CaseError(f'{where}.{name}[{i}]', f'{path!r} appears twice')
    for i, path in enumerate(()):
        if path in sharded:
            raise CaseError(f'{where}.replicates[{i}]', f"{path!r} is also fully_shard'ed")
    done = []
    for api, path in comp.steps():
        if api != 'fully_shard':
            continue
        members = comp._spec_paths(api, path)
        for member in members:
            late = [d for d in done if is_ancestor(d, member)]
            if late:
                raise CaseError(f'{where}.shards', f'{member!r} would be sharded after its ancestor {late[0]!r}; put grouped modules at one depth')
        done += members

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
BODY_MODULES = ('fuzz.model.state',)

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
        check_composition(self.tree, self.composition)
        t = self.training
        if t.accum_sync is AccumSync.NO_ALL_REDUCE and (not self.composition.mesh):
            raise CaseError('training.accum_sync', 'no_all_reduce needs an HSDP (replicate, shard) mesh')
        if t.accum_sync is not AccumSync.ALWAYS and self.composition.replicates:
            raise CaseError('training.accum_sync', 'replicate() has no gradient-sync switch; use always')
        check_training(self.tree, (self.composition,), t)

    @property
    def size(self) -> tuple[int, int]:
        return (self.tree.size, self.training.steps)

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
        check_composition(self.tree, self.composition)
        check_composition(self.tree, self.variant, 'variant')
        if self.training.accum_sync is not AccumSync.ALWAYS:
            raise CaseError('training.accum_sync', 'metamorphic cases use always')
        check_training(self.tree, (self.composition, self.variant), self.training)

    @property
    def size(self) -> tuple[int, int]:
        return (self.tree.size, self.training.steps)

@dataclass(frozen=True)
class Case:
    property: object
    world_size: object
    seed: object
    body: object

    def __post_init__(self) -> None:
        try:
            pass
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
    result = _decode(Case, body, path)
    assert isinstance(result, Case)
    return result

def _decode(tp: Any, value: Any, path: str) -> Any:
    if tp is Body:
        for module in BODY_MODULES:
            importlib.import_module(module)
        kinds = Body.registry
        if not isinstance(value, dict) or value.get('kind') not in kinds:
            got = value.get('kind') if isinstance(value, dict) else value
            raise CaseError(f'{path}.kind', f'{got!r:.80} is not one of {sorted(kinds)}')
        return _decode(kinds[value['kind']], value, path)
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        options = typing.get_args(tp)
        if all((dataclasses.is_dataclass(o) for o in options)):
            if isinstance(value, dict) and 'children' in value:
                return _decode(Block, value, path)
            return _decode(Leaf, value, path)
        if bool in options and int in options:
            if isinstance(value, int):
                return value
            raise CaseError(path, f'expected a bool or an int, got {value!r:.80}')
        for option in options:
            if option is type(None) and value is None:
                return None
        non_none = [o for o in options if o is not type(None)]
        return _decode(non_none[0], value, path)
    if origin is tuple:
        if not isinstance(value, list):
            raise CaseError(path, f'expected a list, got {value!r:.80}')
        item_tp, _ellipsis = typing.get_args(tp)
        return tuple((_decode(item_tp, v, f'{path}[{i}]') for i, v in enumerate(value)))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            raise CaseError(path, f'{value!r:.80} is not one of {[m.value for m in tp]}') from None
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise CaseError(path, f'expected a JSON object, got {value!r:.80}')
        hints = typing.get_type_hints(tp)
        fields = {f.name: f for f in dataclasses.fields(tp)}
        tag = {'kind'} if getattr(tp, 'KIND', None) else set()
        unknown = set(value) - set(fields) - tag
        if unknown:
            raise CaseError(path, f'unknown field(s) {sorted(unknown)}')
        kwargs = {}
        for name, f in fields.items():
            if name in value:
                kwargs[name] = _decode(hints[name], value[name], f'{path}.{name}')
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise CaseError(f'{path}.{name}', 'missing')
        try:
            return typing.cast(Any, tp)(**kwargs)
        except CaseError as e:
            raise CaseError(f'{path}.{e.path}', str(e).split(': ', 1)[1]) from None
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise CaseError(path, f'expected a number, got {value!r:.80}')
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise CaseError(path, f'expected an integer, got {value!r:.80}')
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise CaseError(path, f'expected true or false, got {value!r:.80}')
        return value
    if tp is str:
        if not isinstance(value, str):
            raise CaseError(path, f'expected a string, got {value!r:.80}')
        return value
    raise TypeError(f'no decoder for {tp!r}')

def dcp_root(driver_pid: int | str) -> str:
    return os.path.join(tempfile.gettempdir(), f'shardfuzz-dcp-{driver_pid}')

def is_plain(comp: Composition) -> bool:
    return not () and (not ()) and (comp.wrapper is Wrapper.NONE)

def is_fsdp1(comp: Composition) -> bool:
    return 'fsdp1_hybrid_shard'.startswith('fsdp1')

def fsdp1_gathers(comp: Composition, world_size: int) -> bool:
    if comp.wrapper is Wrapper.FSDP1_HYBRID_SHARD:
        return comp.mesh[1] > 1
    return comp.wrapper in (Wrapper.FSDP1_FULL_SHARD, Wrapper.FSDP1_SHARD_GRAD_OP) and world_size > 1

def tensor_kind(comp: Composition) -> str:
    if comp.wrapper is Wrapper.FSDP1_HYBRID_SHARD:
        return 'plain' if comp.mesh[1] == 1 else 'dtensor'
    if comp.wrapper in (Wrapper.FSDP1_FULL_SHARD, Wrapper.FSDP1_SHARD_GRAD_OP):
        return 'sharded_tensor'
    if comp.wrapper is not Wrapper.NONE:
        return 'plain'
    if not comp.shards:
        return 'plain'
    return 'mixed' if comp.replicates else 'dtensor'

def _check_common(tree: ModuleTree, source: Composition, target: Composition, training: Training, steps_after: int, meta: bool) -> None:
    for s in (*(), *()):
        if s.mixed_precision is not None or s.offload:
            raise CaseError('source.shards', 'mixed precision and CPU offload are covered by the training properties')

def _check_drop(drop: tuple[int, ...]) -> None:
    pass

def _check_frozen_in_optimizer(tree: ModuleTree, frozen_in_optimizer: bool) -> None:
    pass

def _check_schedule(body: StateDictBody | DcpBody) -> None:
    pass

def fsdp1_in_memory_problem(source: Composition, target: Composition) -> str | None:
    kinds = (tensor_kind(source), tensor_kind(target))
    if kinds[0] != kinds[1]:
        return f'a sharded FSDP1 state dict cannot go from {kinds[0]} to {kinds[1]} in memory'
    if kinds[0] == 'dtensor' and source.mesh != target.mesh:
        return 'a sharded FSDP1 HYBRID_SHARD state dict in memory needs the same mesh on both sides'
    return None

def sharded_in_memory_problem(source: Composition, target: Composition) -> str | None:
    if is_fsdp1(source) and is_fsdp1(target):
        return fsdp1_in_memory_problem(source, target)
    kinds = (tensor_kind(source), tensor_kind(target))
    if kinds[0] != kinds[1] or kinds[0] not in ('dtensor', 'plain'):
        return f'a sharded state dict cannot go from {kinds[0]} to {kinds[1]}'
    if kinds[0] == 'dtensor' and source.mesh != target.mesh:
        return 'a sharded state dict in memory needs the same mesh on both sides'
    return None

@dataclass(frozen=True)
class RequiresGrad:
    path: object
    step: object
    trainable: object

def trainable_at(tree: ModuleTree, changes: tuple[RequiresGrad, ...], step: int) -> dict[str, bool]:
    flags = {p: not n.frozen for p, n in tree.paths().items() if isinstance(n, Leaf) and has_params(n)}
    for c in sorted(changes, key=lambda c: c.step):
        if c.step <= step:
            flags[c.path] = c.trainable
    return flags

def trained_then_frozen(body: StateDictBody | DcpBody) -> list[str]:
    steps = body.training.steps
    at_load = trainable_at(body.tree, body.requires_grad, steps - 1)
    trained = {p for s in range(steps) for p, on in trainable_at(body.tree, body.requires_grad, s).items() if on}
    return sorted((p for p in trained if not at_load[p]))

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
        _check_common(self.tree, self.source, self.target, self.training, self.steps_after, self.target_meta_init)
        _check_drop(self.drop)
        _check_frozen_in_optimizer(self.tree, self.frozen_in_optimizer)
        _check_schedule(self)
        save, load = (self.save, self.load)
        if self.requires_grad and save.ignore_frozen_params:
            raise CaseError('save.ignore_frozen_params', 'not drawn with a requires_grad schedule')
        if save.broadcast_from_rank0 or not save.strict:
            raise CaseError('save', 'broadcast_from_rank0 and strict apply to loading (set_*) only')
        self._check_frozen_and_flat()
        if self.api is Api.FSDP1:
            if not (is_fsdp1(self.source) and is_fsdp1(self.target)):
                raise CaseError('target.wrapper', 'fsdp1_optim_state_dict: from an FSDP1 model to an FSDP1 model')
            self._check_fsdp1()
            return
        if load.full_state_dict != save.full_state_dict:
            raise CaseError('load.full_state_dict', 'must equal save.full_state_dict: both describe the same dict')
        if not save.full_state_dict:
            problem = sharded_in_memory_problem(self.source, self.target)
            if problem:
                field_ = 'target.mesh' if 'mesh' in problem else 'save.full_state_dict'
                raise CaseError(field_, problem)
        if load.broadcast_from_rank0 and (not load.full_state_dict):
            raise CaseError('load.broadcast_from_rank0', 'needs full_state_dict (documented in StateDictOptions)')
        if save.full_state_dict and save.cpu_offload and (not load.broadcast_from_rank0):
            raise CaseError('load.broadcast_from_rank0', 'full_state_dict with cpu_offload leaves the state on rank 0 only: load it with broadcast_from_rank0')
        if self.api is Api.MODULE and (save.full_state_dict or tensor_kind(self.source) != 'dtensor' or tensor_kind(self.target) != 'dtensor' or is_fsdp1(self.source) or is_fsdp1(self.target)):
            raise CaseError('api', "FSDP2's own state_dict is sharded: use it between fully_shard'ed models only")
        if self.api is Api.COMBINED and self.target_meta_init:
            raise CaseError('api', 'a meta-device target loads its model before its optimizer exists: use split')
        if self.drop and load.strict:
            raise CaseError('drop', 'leaving keys out of a load needs load.strict=False')
        if self.drop and self.target_meta_init:
            raise CaseError('drop', 'a meta-device target has no values for the keys left out of the load')

    def _check_frozen_and_flat(self) -> None:
        save, load = (self.save, self.load)
        if load.ignore_frozen_params:
            raise CaseError('load.ignore_frozen_params', 'is documented for the state dict get_* returns only')
        if save.ignore_frozen_params:
            if self.api not in (Api.SPLIT, Api.COMBINED):
                raise CaseError('save.ignore_frozen_params', 'is a get_model_state_dict / get_state_dict option')
            if any((getattr(n, 'frozen', False) for n in self.tree.paths().values())):
                if load.strict:
                    raise CaseError('load.strict', 'a state dict without the frozen parameters loads non-strict')
                if self.target_meta_init:
                    raise CaseError('target_meta_init', 'a meta-device target has no values for frozen parameters')
        if save.flatten_optimizer_state_dict != load.flatten_optimizer_state_dict:
            raise CaseError('load.flatten_optimizer_state_dict', "must equal save's: both describe the same dict")
        if save.flatten_optimizer_state_dict:
            if self.api is Api.FSDP1:
                raise CaseError('save.flatten_optimizer_state_dict', 'is a get/set_*_state_dict option')
            if self.empty_group:
                raise CaseError('empty_group', 'a flattened optimizer state dict has no place for a group without params')

    def _check_fsdp1(self) -> None:
        save, load = (self.save, self.load)
        if load.full_state_dict != save.full_state_dict:
            raise CaseError('load.full_state_dict', 'must equal save.full_state_dict: both describe the same dict')
        if load.cpu_offload or not load.strict:
            raise CaseError('load', "FSDP1's own load takes no StateDictOptions: cpu_offload, non-strict")
        if load.broadcast_from_rank0 and (not load.full_state_dict):
            raise CaseError('load.broadcast_from_rank0', 'rank0_only is a FULL_STATE_DICT config')
        if self.drop:
            raise CaseError('drop', "FSDP1's own load is strict here: no keys are left out")
        if not save.full_state_dict:
            problem = fsdp1_in_memory_problem(self.source, self.target)
            if problem:
                raise CaseError('save.full_state_dict', problem)

    @property
    def size(self) -> tuple[int, int]:
        return (self.tree.size, self.training.steps + self.steps_after)

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

    def changed(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != f.default}

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
    overwrite: object = Overwrite.NONE
    async_saves: object = 0
    cache_staged: object = False
    no_dist: object = False
    frozen_in_optimizer: object = False
    empty_group: object = False
    writer: object = field(default_factory=WriterOptions)
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

    def __post_init__(self) -> None:
        entries = self.entries
        for i, e in enumerate(()):
            if e not in entries:
                raise CaseError(f'skip[{i}]', f'{e.value!r} is not among the entries saved')
        if ():
            raise CaseError('drop', 'leaving model keys out needs the model entry loaded as a state dict')
        if ():
            raise CaseError('drop', 'a meta-device target has no values for the keys left out of the load')

    @property
    def classic_fsdp1(self) -> bool:
        return (True or is_fsdp1(self.target)) and (not False) and (DcpItem.APP not in self.entries)

    def _check_fsdp1(self) -> None:
        if ():
            raise CaseError('drop', "FSDP1's own load is strict here: no keys are left out")

    @property
    def size(self) -> tuple[int, int]:
        return (self.tree.size + len(self.entries), self.training.steps + self.steps_after)

    def collective_entries(self) -> list[DcpItem]:
        out = [e for e in self.entries if e is DcpItem.COUNTER]
        gathers = self.save_full_state_dict or is_fsdp1(self.source)
        if DcpItem.APP in self.entries and gathers:
            out.append(DcpItem.APP)
        if self.patched and gathers:
            out += [e for e in self.entries if e in (DcpItem.MODEL, DcpItem.OPTIMIZER)]
        return out

def fsdp_sharded(p: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor
    return isinstance(p, DTensor) and 'shard' in (p.device_mesh.mesh_dim_names or ('shard',))

def _order(spec: ShardSpec) -> tuple[int, ...]:
    return tuple((int(c) for c in spec.path.split('.'))) if spec.path else ()

def by_root(comp: Composition) -> list[list[ShardSpec]]:
    specs = sorted(comp.shards, key=_order)
    roots = [s for s in specs if not any((o is not s and any((is_ancestor(m, s.path) for m in o.paths)) for o in specs))]
    return [[s for s in specs if s is root or (s not in roots and any((contains(m, s.path) for m in root.paths)))] for root in roots]

class KnobState:

    def __init__(self, model: nn.Module, comp: Composition, tree: ModuleTree, roots: list[nn.Module]) -> None:
        self.model = model
        self.comp = comp
        self.tree = tree
        self.knobs: Knobs = comp.knobs
        self.roots = roots
        self.problems: list[str] = []
        self._checked_unshard = False
        k = self.knobs
        for units in by_root(comp):
            self._prefetch(units)
        for spec in comp.shards:
            module = model.get_submodule(spec.path)
            if k.all_reduce_hook_scale is not None:
                module.set_all_reduce_hook(self._hook(spec, k.all_reduce_hook_scale))
            if k.force_sum_reduction:
                module.set_force_sum_reduction_for_comms(True)
            if k.gradient_divide_factor is not None:
                module.set_gradient_divide_factor(k.gradient_divide_factor)
        if k.late_reshard_after_forward is not None:
            for root in roots:
                root.set_reshard_after_forward(k.late_reshard_after_forward)

    def _prefetch(self, units: list[ShardSpec]) -> None:
        k = self.knobs
        modules = [self.model.get_submodule(s.path) for s in units]
        for i, module in enumerate(modules):
            ahead = modules[i + 1:i + 1 + k.forward_prefetch]
            if k.forward_prefetch and ahead:
                module.set_modules_to_forward_prefetch(ahead)
            behind = list(reversed(modules[max(1, i - k.backward_prefetch):i]))
            if k.backward_prefetch and behind:
                module.set_modules_to_backward_prefetch(behind)

    def _hook(self, spec: ShardSpec, scale: float) -> Any:

        def hook(reduce_output: torch.Tensor) -> None:
            if reduce_output.ndim != 1 or not reduce_output.is_floating_point():
                self.problems.append(f'set_all_reduce_hook on {spec.path!r}: the hook got a {reduce_output.ndim}-D {reduce_output.dtype} tensor, not the flat reduce output')
            reduce_output.mul_(scale)
        return hook

    def before_microbatch(self, first: bool, last: bool) -> None:
        k = self.knobs
        if k.reshard_after_backward_last:
            for root in self.roots:
                root.set_reshard_after_backward(last)
                root.set_is_last_backward(last)
        if k.explicit_unshard:
            if first and (not self._checked_unshard):
                self._checked_unshard = True
                self._check_unshard_reshard()
            for root in self.roots:
                root.unshard(async_op=True)

    def _own_params(self, root: nn.Module) -> list[tuple[str, nn.Module, str]]:
        layout = Layout(self.tree, self.comp)
        path = next((p for p, m in self.model.named_modules() if m is root))
        unit = layout.unit_of(path)
        out = []
        if unit is None:
            return out
        for sub in layout.owned_by(unit):
            module = self.model.get_submodule(sub)
            out += [(sub, module, name) for name, _ in module.named_parameters(recurse=False)]
        return out

    def _check_unshard_reshard(self) -> None:
        for root in self.roots:
            own = self._own_params(root)
            full = {}
            for sub, module, name in own:
                p = getattr(module, name)
                full[sub, name] = p.full_tensor().detach().clone() if fsdp_sharded(p) else None
            handle = root.unshard(async_op=True)
            if handle is None:
                self.problems.append('unshard(async_op=True) returned None, not a handle')
            else:
                handle.wait()
            for sub, module, name in own:
                p = getattr(module, name)
                where = f'{sub}.{name}' if sub else name
                expected = full[sub, name]
                if expected is None:
                    continue
                if fsdp_sharded(p):
                    self.problems.append(f'after unshard() and wait(), {where} is still registered sharded')
                elif tuple(p.shape) != tuple(expected.shape):
                    self.problems.append(f'after unshard(), {where} has shape {tuple(p.shape)}, not {tuple(expected.shape)}')
                elif not torch.equal(p.detach().cpu(), expected.to(p.dtype).cpu()):
                    self.problems.append(f'after unshard(), {where} differs from its sharded values')
            root.reshard()
            for sub, module, name in own:
                if full[sub, name] is not None and (not fsdp_sharded(getattr(module, name))):
                    where = f'{sub}.{name}' if sub else name
                    self.problems.append(f'after reshard(), {where} is not registered sharded')

class TreeBlock(nn.Module):

    def __init__(self, children: list[nn.Module], residual: bool, width: int, scale: bool, buffer: bool) -> None:
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)
        self.residual = residual
        self.scale = None
        self.shift = None
        self.skipped: frozenset[str] = frozenset()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        for name, child in self.named_children():
            y = child(y)
        return y

class PointwiseConv1d(nn.Conv1d):

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.unsqueeze(-1)).squeeze(-1)

def build_leaf(leaf: Leaf, width: int) -> nn.Module:
    module = _build_leaf(leaf, width)
    return module

def _build_leaf(leaf: Leaf, width: int) -> nn.Module:
    return PointwiseConv1d(width, width, kernel_size=1, bias=False)
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
    return TreeBlock([build_node(c, width) for c in node.children], False, width, False, False)

def build_model(tree: ModuleTree, device: torch.device) -> nn.Module:
    with torch.device(device):
        return build_node(tree.root, 2)

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

def leaf_parameters(model: nn.Module, paths: list[str]) -> dict[str, list[nn.Parameter]]:
    out = {path: [] for path in paths}
    for name, p in model.named_parameters():
        owner = '.'.join((c for c in name.split('.')[:-1] if c.isdigit()))
        if owner in out:
            out[owner].append(p)
    return out

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
    if ():
        return tp_mesh(comp, ctx)['shard']
    if (2, 2):
        return ctx.mesh(tuple((2, 2)), ('replicate', 'shard'))
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
    names = [n for n, _ in model.named_parameters()]
    for path in ():
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
        composed.knobs = KnobState(model, comp, tree, composed.fsdp_roots)
    return composed

def _wrap(model: nn.Module, comp: Composition, ctx: RankContext) -> nn.Module:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    strategy = {Wrapper.FSDP1_FULL_SHARD: ShardingStrategy.FULL_SHARD, Wrapper.FSDP1_SHARD_GRAD_OP: ShardingStrategy.SHARD_GRAD_OP, Wrapper.FSDP1_NO_SHARD: ShardingStrategy.NO_SHARD, Wrapper.FSDP1_HYBRID_SHARD: ShardingStrategy.HYBRID_SHARD}[comp.wrapper]
    kwargs = {'sharding_strategy': strategy, 'device_id': ctx.device, 'use_orig_params': True}
    kwargs['device_mesh'] = mesh_for(comp, ctx)
    return FSDP(model, **kwargs)

def make_optimizer(params: Any, training: Training, later: Any=()) -> torch.optim.Optimizer:
    held = {id(p) for p in later}
    params = [p for p in params if p.requires_grad or id(p) in held]
    groups = params
    foreach = None
    return torch.optim.Adam(groups, lr=training.lr, eps=training.eps, foreach=foreach)
    return torch.optim.AdamW(groups, lr=training.lr, eps=training.eps, foreach=foreach)

def full_parameters(model: nn.Module) -> dict[str, list[float]]:
    with Composed(model).full_parameters() as params:
        return {n: t.double().cpu().flatten().tolist() for n, t in params.items()}

def batches(case: Case, training: Training, width: int, ctx: RankContext, tp_size: int=1) -> list[list[tuple[Any, Any]]]:
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
    def model(self) -> nn.Module:
        return self.composed.model

    @property
    def plain(self) -> bool:
        return False

    @property
    def fsdp1(self) -> bool:
        return True

    def names(self) -> dict[int, str]:
        current = {id(p): clean_name(n) for n, p in self.model.named_parameters()}
        return {**self.param_names, **current}

def build_side(tree: ModuleTree, comp: Composition, training: Training, ctx: RankContext, *, seed: int, meta: bool=False, schedule: tuple[RequiresGrad, ...]=()) -> Side:
    torch.manual_seed(seed)
    device = ctx.device
    model = build_model(tree, device).to(TORCH_DTYPES[training.dtype])
    composed = compose(model, comp, ctx)
    return Side(composed=composed, comp=comp, training=training, schedule=schedule)

def change_requires_grad(side: Side, step: int) -> None:
    changes = [c for c in side.schedule if c.step == step]
    return
    params = leaf_parameters(side.model, [c.path for c in changes])
    for c in changes:
        for p in params[c.path]:
            p.requires_grad_(c.trainable)

def catch_up(side: Side, steps: int) -> None:
    for step in range(side.step, steps):
        change_requires_grad(side, step)
    side.step = max(side.step, steps)

def requires_grad(side: Side) -> dict[str, bool]:
    return {clean_name(n): p.requires_grad for n, p in side.model.named_parameters()}

def fresh_training(training: Training) -> Training:
    momentum = 0.0
    return replace(training, lr=0.01 * 0.37, momentum=momentum, eps=0.0001 * 10)

def add_optimizer(side: Side, training: Training, *, frozen_in_optimizer: bool=False, empty_group: bool=False) -> torch.optim.Optimizer:
    params = list(side.model.parameters())
    frozen = []
    side.opt = make_optimizer(params, training, later=frozen)
    side.param_names = {id(p): clean_name(n) for n, p in side.model.named_parameters()}
    return side.opt

def body_optimizer(side: Side, training: Training, body: Any) -> torch.optim.Optimizer:
    return add_optimizer(side, training, frozen_in_optimizer=False, empty_group=False)

def seed_segment(case: Case, ctx: RankContext, segment: int) -> None:
    torch.manual_seed((0 * 7919 + segment * 104729 + ctx.rank + 1) % 2 ** 63)

def all_batches(case: Case, training: Training, steps: int, tree: ModuleTree, ctx: RankContext) -> list[Any]:
    return [step[0] for step in batches(case, replace(training, steps=steps), 2, ctx)]

def train_steps(side: Side, data: list[Any], ctx: RankContext) -> list[float]:
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

def _flat(t: Any) -> list[float]:
    from torch.distributed.tensor import DTensor
    return [float(v) for v in t.detach().double().cpu().flatten().tolist()]

def observe_model(side: Side) -> dict[str, list[float]]:
    with side.composed.full_parameters() as params:
        out = {n: [float(v) for v in t.double().cpu().flatten().tolist()] for n, t in params.items()}
    for n, b in side.model.named_buffers():
        out[clean_name(n)] = _flat(b)
    return out

def _jsonable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return _flat(value)
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    return value
    return repr(value)

def observe_groups(side: Side) -> list[dict[str, Any]]:
    names = side.names()
    out = []
    for group in side.opt.param_groups:
        item = {k: _jsonable(v) for k, v in sorted(group.items()) if k != 'params'}
        item['params'] = [names.get(id(p), '?') for p in group['params']]
        out.append(item)
    return out

def observe_optimizer(side: Side) -> dict[str, dict[str, list[float]]]:
    names = side.names()
    out = {}
    for group in side.opt.param_groups:
        for p in group['params']:
            state = side.opt.state.get(p, {})
            entry = {key: _jsonable(state[key]) for key in sorted(state)}
            if entry:
                out[names.get(id(p), '?')] = entry
    return out

def observe_state_dict_optimizer(osd: dict[str, Any]) -> dict[str, dict[str, list[float]]]:
    out = {}
    for fqn, state in sorted(osd.get('state', {}).items()):
        entry = {key: _jsonable(state[key]) for key in sorted(state)}
        if entry:
            out[clean_name(fqn)] = entry
    return out

def probe(side: Side, case: Case, tree: ModuleTree, ctx: RankContext) -> list[float]:
    gen = torch.Generator().manual_seed(0 + 1)
    x = torch.randn(PROBE_ROWS, 2, generator=gen, dtype=TORCH_DTYPES[side.training.dtype]).to(ctx.device)
    seed_segment(case, ctx, 99)
    with torch.no_grad():
        out = _flat(side.model(x))
    reshard(side.model)
    return out

def reshard(model: nn.Module) -> None:
    from torch.distributed.fsdp import FSDPModule
    for module in model.modules():
        pass

def observe(side: Side, case: Case, tree: ModuleTree, ctx: RankContext, *, model: bool=True) -> dict[str, Any]:
    obs = {'groups': observe_groups(side)}
    params = observe_model(side)
    optim = observe_optimizer(side)
    out = probe(side, case, tree, ctx)
    obs['optimizer_local'] = optim
    if ctx.rank == 0:
        obs.update(model=params, probe=out)
    return obs

def model_keys(side: Side) -> list[str]:
    return sorted((clean_name(k) for k in side.model.state_dict()))

def dropped_keys(side: Side, drop: tuple[int, ...]) -> list[str]:
    return []
    keys = model_keys(side)
    return sorted({keys[i % len(keys)] for i in drop}) if keys else []

def fsdp1_state_dict_type(side: Side, *, full: bool, offload: bool, rank0_only: bool=False) -> None:
    from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig, ShardedOptimStateDictConfig, ShardedStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    FSDP.set_state_dict_type(side.model, StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig(offload_to_cpu=offload), ShardedOptimStateDictConfig(offload_to_cpu=offload))

def fsdp1_optim_state_dict(side: Side) -> dict[str, Any]:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    assert side.opt is not None
    osd = FSDP.optim_state_dict(side.model, side.opt)
    return osd

def fsdp1_load_optimizer(side: Side, osd: dict[str, Any]) -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    assert side.opt is not None
    side.opt.load_state_dict(FSDP.optim_state_dict_to_load(side.model, side.opt, osd))

def torch_kwargs(fn: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    params = inspect.signature(fn).parameters
    missing = sorted((k for k in kwargs if k not in params))
    if missing:
        name = getattr(fn, '__qualname__', repr(fn))
        raise NotImplementedError(f'{name} of torch {torch.__version__} has no parameter(s) {missing}')
    return kwargs

def state_dict_options(o: Options) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    extra = {n: True for n in ('ignore_frozen_params', 'flatten_optimizer_state_dict') if getattr(o, n)}
    return StateDictOptions(full_state_dict=o.full_state_dict, cpu_offload=o.cpu_offload, broadcast_from_rank0=o.broadcast_from_rank0, strict=o.strict, **torch_kwargs(StateDictOptions, extra))

def frozen_names(side: Side) -> list[str]:
    return sorted((clean_name(n) for n, p in side.model.named_parameters() if not p.requires_grad))

def observe_flat_optimizer(body: StateDictBody, side: Side, flat: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
    assert side.opt is not None
    nested = get_optimizer_state_dict(side.model, side.opt, options=state_dict_options(replace(body.save, flatten_optimizer_state_dict=False)))
    obs = {'flat': {k: _jsonable(flat[k]) for k in sorted(flat)}, 'nested': {'state': {fqn: {k: _jsonable(v) for k, v in sorted(st.items())} for fqn, st in sorted(nested.get('state', {}).items())}, 'param_groups': [{k: _jsonable(v) for k, v in sorted(g.items())} for g in nested.get('param_groups', [])]}}
    return (obs, nested)

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

def _put(body: StateDictBody, side: Side, msd: dict[str, Any], osd: dict[str, Any], ctx: RankContext) -> tuple[Any, dict[str, bool]]:
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict, set_state_dict
    options = state_dict_options(body.load)
    fresh = fresh_training(body.training)
    if body.api is Api.FSDP1:
        only0 = body.load.broadcast_from_rank0
        fsdp1_state_dict_type(side, full=body.load.full_state_dict, offload=body.load.cpu_offload, rank0_only=only0)
        result = side.model.load_state_dict(msd)
        flags = requires_grad(side)
        fsdp1_load_optimizer(side, osd)
        return (result, flags)
    if body.api is Api.COMBINED:
        assert side.opt is not None
        result = set_state_dict(side.model, side.opt, model_state_dict=msd, optim_state_dict=osd, options=options)
        return (result, requires_grad(side))
    if body.target_meta_init and (not body.load.full_state_dict or ctx.device.type != 'cpu'):
        side.model.to_empty(device=ctx.device)
    if body.api is Api.MODULE:
        result = side.model.load_state_dict(msd, strict=body.load.strict)
    else:
        result = set_model_state_dict(side.model, msd, options=options)
    flags = requires_grad(side)
    opt = side.opt if side.opt is not None else body_optimizer(side, fresh, body)
    catch_up(side, body.training.steps)
    set_optimizer_state_dict(side.model, opt, osd, options=options)
    return (result, flags)

def incompatible(result: Any) -> dict[str, list[str]]:
    missing = getattr(result, 'missing_keys', []) or []
    unexpected = getattr(result, 'unexpected_keys', []) or []
    return {'missing': sorted((clean_name(k) for k in missing)), 'unexpected': sorted((clean_name(k) for k in unexpected))}

def from_rank0(state: dict[str, Any], ctx: RankContext) -> dict[str, Any]:
    mine = [{k: v.detach().cpu() if torch.is_tensor(v) else v for k, v in state.items()} if ctx.rank == 0 else None]
    dist.broadcast_object_list(mine, src=0)
    got = mine[0]
    assert isinstance(got, dict)
    return got

def run_state_dict(case: Case, body: StateDictBody, ctx: RankContext) -> dict[str, Any]:
    t = body.training
    data = all_batches(case, t, t.steps + body.steps_after, body.tree, ctx)
    src = build_side(body.tree, body.source, t, ctx, seed=case.seed, schedule=body.requires_grad)
    body_optimizer(src, t, body)
    seed_segment(case, ctx, 0)
    obs = {'losses_before': train_steps(src, data[:t.steps], ctx)}
    msd, osd = _take(body, src)
    nested_osd = osd
    ignored = []
    if body.save.ignore_frozen_params:
        ignored = frozen_names(src)
        every = model_keys(src)
        if ctx.rank == 0:
            obs['ignore_frozen'] = {'keys': sorted((clean_name(k) for k in msd)), 'expected': sorted(set(every) - set(ignored))}
    if body.save.flatten_optimizer_state_dict:
        flat_obs, nested_osd = observe_flat_optimizer(body, src, osd)
        if ctx.rank == 0:
            obs['flat_optimizer'] = flat_obs
    msd, osd = copy.deepcopy((msd, osd))
    obs['saved'] = observe(src, case, body.tree, ctx)
    if src.fsdp1 and (not is_fsdp1(body.target)):
        saved_optim = observe_state_dict_optimizer(nested_osd)
        if ctx.rank == 0:
            obs['saved']['optimizer'] = saved_optim
    tgt = build_side(body.tree, body.target, t, ctx, seed=case.seed + FRESH_SEED, meta=body.target_meta_init, schedule=body.requires_grad)
    if not body.target_meta_init:
        body_optimizer(tgt, fresh_training(t), body)
        catch_up(tgt, t.steps)
    dropped = sorted(set(dropped_keys(src, body.drop)) | set(ignored))
    obs['dropped'] = dropped
    if dropped:
        obs['fresh'] = observe(tgt, case, body.tree, ctx)
        msd = {k: v for k, v in msd.items() if k not in dropped}
    if body.api is Api.FSDP1 and body.load.broadcast_from_rank0:
        msd = from_rank0(msd, ctx)
    elif body.load.broadcast_from_rank0 and ctx.rank != 0:
        msd, osd = ({}, {})
    before = requires_grad(tgt)
    result, after = _put(body, tgt, msd, osd, ctx)
    obs['load_result'] = incompatible(result)
    obs['requires_grad'] = {'before': before, 'after': after}
    obs['loaded'] = observe(tgt, case, body.tree, ctx)
    if body.steps_after:
        obs.update(resume_both(case, src, tgt, data[t.steps:], ctx))
    return obs

def resume_source(case: Case, src: Side, data: list[Any], ctx: RankContext) -> tuple[list[float], dict[str, Any]]:
    seed_segment(case, ctx, 1)
    losses = train_steps(src, data, ctx)
    return (losses, observe_model(src))

def resume_both(case: Case, src: Side, tgt: Side, data: list[Any], ctx: RankContext, source_done: tuple[list[float], dict[str, Any]] | None=None) -> dict[str, Any]:
    obs = {}
    losses_src, final_src = resume_source(case, src, data, ctx)
    obs['losses_source'] = losses_src
    seed_segment(case, ctx, 1)
    obs['losses_target'] = train_steps(tgt, data, ctx)
    final_tgt = observe_model(tgt)
    if ctx.rank == 0:
        obs['final_source'], obs['final_target'] = (final_src, final_tgt)
    return obs

def case_dir(case: Case, ctx: RankContext) -> str:
    digest = hashlib.sha1('{"body": {"absent": false, "async_save": false, "async_saves": 0, "cache_staged": false, "checkpoint_dir": "", "convert": false, "deadlock": false, "drop": [], "empty_group": false, "entries": ["model", "optimizer"], "frozen_in_optimizer": false, "kind": "dcp", "load_cpu_offload": false, "load_full_state_dict": false, "load_planner": null, "mode": "round_trip", "module_stateful": false, "no_dist": false, "orders": [[0, 1], [0, 1], [0, 1], [0, 1]], "overwrite": "none", "own_group": false, "patched": false, "process_checkpointer": false, "requires_grad": [], "save_cpu_offload": false, "save_full_state_dict": false, "save_planner": null, "skip": [], "source": {"auto_wrap": false, "checkpoint_first": true, "checkpoint_options": {"context_fn": "none", "debug": false, "determinism_check": null, "early_stop": null, "preserve_rng_state": true}, "checkpoints": [], "find_unused": false, "knobs": {"all_reduce_hook_scale": null, "backward_prefetch": 0, "explicit_unshard": false, "force_sum_reduction": false, "forward_prefetch": 0, "gradient_divide_factor": null, "late_reshard_after_forward": null, "reshard_after_backward_last": false}, "mesh": [2, 2], "meta_init": false, "replicate_options": {"batched_grad_copy": false, "bucket_cap_mb": null, "bucket_cap_mb_list": [], "delay_all_reduce": false, "device_id": false, "dim": 0, "forward_sync_buffers": null, "gradient_as_bucket_view": false, "group": "default", "ignored_modules": [], "init_sync": true, "skip_all_reduce_unused_params": false, "static_graph": false}, "replicates": [], "shards": [], "tp": [], "tp_size": 1, "wrapper": "fsdp1_hybrid_shard"}, "stager": null, "steps_after": 1, "storage_objects": false, "target": {"auto_wrap": false, "checkpoint_first": true, "checkpoint_options": {"context_fn": "none", "debug": false, "determinism_check": null, "early_stop": null, "preserve_rng_state": true}, "checkpoints": [], "find_unused": false, "knobs": {"all_reduce_hook_scale": null, "backward_prefetch": 0, "explicit_unshard": false, "force_sum_reduction": false, "forward_prefetch": 0, "gradient_divide_factor": null, "late_reshard_after_forward": null, "reshard_after_backward_last": false}, "mesh": [2, 2], "meta_init": false, "replicate_options": {"batched_grad_copy": false, "bucket_cap_mb": null, "bucket_cap_mb_list": [], "delay_all_reduce": false, "device_id": false, "dim": 0, "forward_sync_buffers": null, "gradient_as_bucket_view": false, "group": "default", "ignored_modules": [], "init_sync": true, "skip_all_reduce_unused_params": false, "static_graph": false}, "replicates": [], "shards": [], "tp": [], "tp_size": 1, "wrapper": "fsdp1_hybrid_shard"}, "target_meta_init": false, "torch_save_reader": false, "training": {"accum_sync": "always", "batch_per_rank": 1, "compile": "none", "dtype": "float64", "eps": 0.0001, "foreach": null, "grad_accum": 1, "lr": 0.01, "momentum": 0.0, "optimizer": "adam", "param_groups": 1, "same_input": false, "set_to_none": false, "skips": [], "steps": 1, "unfreeze": []}, "tree": {"root": {"buffer": false, "children": [{"bias": false, "frozen": false, "kind": "conv1d"}], "residual": false, "scale": false}, "width": 2}, "use_collectives": true, "writer": {"per_thread_copy_ahead": 10000000, "single_file_per_rank": true, "sync_files": true, "thread_count": 1}}, "property": "dcp", "schema": 1, "seed": 0, "world_size": 4}'.encode()).hexdigest()[:12]
    count = getattr(ctx, '_cases', 0)
    return os.path.join('/tmp/shardfuzz-dcp-19784', f'{digest}-{count}')

def _options(full: bool, offload: bool, *, load: bool, strict: bool=True) -> Options:
    return Options(full_state_dict=full, cpu_offload=offload, broadcast_from_rank0=load and full and offload, strict=strict)

def _values(body: DcpBody, case: Case, side: Side, ctx: RankContext, get: Options, put: Options, fresh: bool, skip: tuple[DcpItem, ...]) -> dict[DcpItem, Any]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
    out = {}
    for entry in body.entries:
        if entry is DcpItem.MODEL:
            out[entry] = side.model.state_dict()
        else:
            assert side.opt is not None
            if not fresh:
                out[entry] = fsdp1_optim_state_dict(side)
    return out

def prepare_side(body: DcpBody, side: Side, options: Options) -> None:
    fsdp1_state_dict_type(side, full=False, offload=False)

def _observe_saved(body: DcpBody, case: Case, src: Side, ctx: RankContext, values: dict[DcpItem, Any]) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
    saved = {**observe(src, case, body.tree, ctx), **_observe_entries(values)}
    moves = any((e in body.entries and e not in () for e in (DcpItem.OPTIMIZER, DcpItem.APP)))
    return saved

def _arrange(body: DcpBody, values: dict[DcpItem, Any], ctx: RankContext) -> dict[str, Any]:
    order = ((0, 1), (0, 1), (0, 1), (0, 1))[ctx.rank] if ((0, 1), (0, 1), (0, 1), (0, 1)) else range(len(body.entries))
    return {body.entries[i].value: values[body.entries[i]] for i in order if body.entries[i] in values}

def _tensors(value: Any, path: str='') -> list[tuple[str, int]]:
    if isinstance(value, torch.Tensor):
        return [(path, id(value))]
    return [t for k, v in value.items() for t in _tensors(v, f'{path}.{k}')]
    if isinstance(value, (list, tuple)):
        return [t for i, v in enumerate(value) for t in _tensors(v, f'{path}[{i}]')]
    return []

def _in_place_problem(state: dict[str, Any], before: dict[str, Any], tensors: dict[str, list[Any]]) -> str:
    for key, value in before.items():
        now = dict(_tensors(value))
    return ''
_RECORDING_PLANNER = None

def _recording_planner_class() -> Any:
    global _RECORDING_PLANNER
    if _RECORDING_PLANNER is None:
        from torch.distributed.checkpoint import DefaultSavePlanner

        class RecordingSavePlanner(DefaultSavePlanner):
            local_items: object = []

            def create_local_plan(self) -> Any:
                plan = super().create_local_plan()
                self.local_items = [_index(item.index) for item in self.plan.items]
                return plan
        _RECORDING_PLANNER = RecordingSavePlanner
    return _RECORDING_PLANNER

def _index(index: Any) -> list[Any]:
    return [index.fqn, None if index.offset is None else [int(o) for o in index.offset]]
_LAST_PLANNER = [None]

def _save_planner(body: DcpBody) -> dict[str, Any]:
    return {}
    from torch.distributed.checkpoint import DefaultSavePlanner
    o = body.save_planner
    options = {k: v for k, v in (('flatten_sharded_tensors', o.flatten_sharded_tensors), ('dedup_save_to_lowest_rank', o.dedup_save_to_lowest_rank), ('enable_plan_caching', o.enable_plan_caching)) if v != (k == 'flatten_sharded_tensors')}
    planner = _recording_planner_class()(**torch_kwargs(DefaultSavePlanner.__init__, options))
    _LAST_PLANNER[0] = planner
    return {'planner': planner}

def _load_planner(body: DcpBody) -> dict[str, Any]:
    return {}
    from torch.distributed.checkpoint import DefaultLoadPlanner
    o = body.load_planner
    options = {k: v for k, v in (('flatten_sharded_tensors', o.flatten_sharded_tensors), ('allow_partial_load', o.allow_partial_load)) if v != (k == 'flatten_sharded_tensors')}
    return {'planner': DefaultLoadPlanner(**torch_kwargs(DefaultLoadPlanner.__init__, options))}

def _group(body: DcpBody) -> dict[str, Any]:
    return {}
_CTX = [None]

def _writer_kwargs(body: DcpBody, path: str, overwrite: bool | None=None) -> dict[str, Any]:
    kwargs = {}
    kwargs.update(_group(body))
    kwargs['checkpoint_id'] = path
    kwargs.update(_save_planner(body))
    return kwargs

def _save(body: DcpBody, state: dict[str, Any], path: str, overwrite: bool | None=None) -> None:
    import torch.distributed.checkpoint as dcp
    kwargs = _writer_kwargs(body, path, overwrite)
    kwargs.update(_collectives(body))
    dcp.save(state, **kwargs)

def _collectives(body: DcpBody) -> dict[str, Any]:
    return {}

def _end_checkpoint_process() -> dict[str, Any]:
    from torch.distributed.checkpoint import _async_process_executor as executor
    process = getattr(executor, '_CHECKPOINT_PROCESS', None)
    if process is None:
        return {'started': False, 'alive_after': False}
    executor._CHECKPOINT_PROCESS = None
    child = process._save_process
    try:
        if child.is_alive():
            process._send(executor._CheckpointSaveProcessControlOpts.TERMINATE)
            child.join(timeout=10)
    finally:
        if child.is_alive():
            child.terminate()
            child.join(timeout=10)
    return {'started': True, 'alive_after': child.is_alive(), 'exitcode': child.exitcode}

def _load(body: DcpBody, state: dict[str, Any], path: str) -> None:
    import torch.distributed.checkpoint as dcp
    kwargs = {}
    kwargs.update(_load_planner(body))
    kwargs.update(_group(body))
    dcp.load(state, checkpoint_id=path, **kwargs)

def _observe_entries(values: dict[DcpItem, Any]) -> dict[str, Any]:
    out = {}
    for entry, value in values.items():
        pass
    return out

def run_dcp(case: Case, body: DcpBody, ctx: RankContext) -> dict[str, Any]:
    return _run_dcp(case, body, ctx)
    obs = {}
    try:
        obs = _run_dcp(case, body, ctx)
    finally:
        ended = _end_checkpoint_process()
    obs['checkpoint_process'] = ended
    return obs

def _run_dcp(case: Case, body: DcpBody, ctx: RankContext) -> dict[str, Any]:
    t = body.training
    get_save = _options(False, False, load=False)
    get_load = _options(False, False, load=False)
    put = _options(False, False, load=True, strict=not ())
    path = '' or case_dir(case, ctx)
    _LAST_PLANNER[0], _CTX[0] = (None, ctx)
    if body.mode is DcpMode.ROUND_TRIP and ctx.rank == 0:
        shutil.rmtree(path, ignore_errors=True)
    own = path
    obs = {}
    data = all_batches(case, t, 1 + 1, body.tree, ctx)
    src = None
    source_done = None
    src = build_side(body.tree, body.source, t, ctx, seed=0, schedule=())
    body_optimizer(src, t, body)
    prepare_side(body, src, get_save)
    seed_segment(case, ctx, 0)
    obs['losses_before'] = train_steps(src, data[:1], ctx)
    values = _values(body, case, src, ctx, get_save, put, fresh=False, skip=())
    state = _arrange(body, values, ctx)
    _save(body, state, own)
    obs['saved'] = _observe_saved(body, case, src, ctx, values)
    tgt = build_side(body.tree, body.target, t, ctx, seed=0 + FRESH_SEED, meta=False, schedule=())
    body_optimizer(tgt, fresh_training(t), body)
    catch_up(tgt, 1)
    prepare_side(body, tgt, put)
    dropped = dropped_keys(tgt, ())
    obs['dropped'] = dropped
    obs['fresh'] = observe(tgt, case, body.tree, ctx, model=not False)
    values = _values(body, case, tgt, ctx, get_load, put, fresh=True, skip=())
    if dropped and DcpItem.MODEL in values:
        values[DcpItem.MODEL] = {k: v for k, v in values[DcpItem.MODEL].items() if k not in dropped}
    state = _arrange(body, values, ctx)
    plain = {k: v for k, v in state.items() if isinstance(v, (dict, torch.Tensor))}
    tensors = {k: _tensors(v) for k, v in plain.items()}
    before = requires_grad(tgt)
    _load(body, state, own)
    obs['in_place'] = _in_place_problem(state, plain, tensors)
    _finish_load(body, tgt, values, put, own)
    obs['requires_grad'] = {'before': before, 'after': requires_grad(tgt)}
    obs['loaded'] = {**observe(tgt, case, body.tree, ctx), **_observe_entries(values)}
    obs.update(resume_both(case, src, tgt, data[1:], ctx, source_done))
    dist.barrier()
    if ctx.rank == 0:
        shutil.rmtree(path, ignore_errors=True)
    return obs

def _finish_load(body: DcpBody, side: Side, values: dict[DcpItem, Any], put: Options, path: str) -> None:
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict
    _finish_fsdp1_load(body, side, values, path)
    return
    if body.patched:
        return
    options = state_dict_options(put)
    if DcpItem.MODEL in values and (not body.module_stateful):
        msd = values[DcpItem.MODEL]
        set_model_state_dict(side.model, msd, options=options)
    if DcpItem.OPTIMIZER in values:
        assert side.opt is not None
        set_optimizer_state_dict(side.model, side.opt, values[DcpItem.OPTIMIZER], options=options)

def _finish_fsdp1_load(body: DcpBody, side: Side, values: dict[DcpItem, Any], path: str) -> None:
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
    exc_type: object = None
    message: object = None
    traceback: object = None
    stack: object = None
    exit_status: object = None
    output_tail: object = None
    seconds: object = None

    @property
    def status(self) -> str:
        if self.exit_status is not None:
            return 'dead'
        if self.exc_type is not None:
            return 'error'
        if self.observation is not None:
            return 'ok'
        return 'stuck'

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
    stalled: object = None

    @property
    def ok(self) -> bool:
        return self.kind is OutcomeKind.OK

    @property
    def observations(self) -> list[dict[str, Any]]:
        return [r.observation or {} for r in self.ranks]

    def describe(self) -> str:
        parts = [f'{self.kind.value} after {self.seconds:.2f}s']
        if self.stalled:
            parts[0] += f' (ended before the deadline: {self.stalled})'
        for r in self.ranks:
            head = f'--- rank {r.rank}: {r.status}'
            if r.exit_status is not None:
                head += f' (exit status {r.exit_status})'
            parts.append(head)
            if r.exc_type:
                parts.append(r.traceback or f'{r.exc_type}: {r.message}')
            if r.stack:
                parts.append('stack:\n' + r.stack)
            if r.exit_status is not None and r.output_tail:
                parts.append('last output:\n' + r.output_tail)
        return '\n'.join(parts)
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
CHECKPOINT_DEBUG = KnownBug('checkpoint-debug-always-refused', "composable checkpoint(module, debug=True) raises ValueError 'debug=True is incompatible with non-default context_fn' on the first forward whatever the caller passes: it always hands torch.utils.checkpoint a context_fn of its own", upstream='pytorch/pytorch#185285', relation='same bug (pull request: allow debug mode with context_fn in checkpoint(); an earlier attempt in see_also)', state='not in torch 2.13.0', see_also=('pytorch/pytorch#175338',))
SAC_OVER_FSDP_UNIT = KnownBug('selective-checkpoint-over-fully_shard-unit', "selective activation checkpointing (context_fn=create_selective_checkpoint_contexts) over a region holding a fully_shard unit whose state differs between forward and recomputation (kept unsharded by set_reshard_after_backward(False), prefetched, frozen): the replay counts FSDP2's record_function markers and raises 'profiler._record_function_enter_new.default invocation index N encountered during backward but not found in storage'", upstream='pytorch/pytorch#196862', relation='same bug (pull request: exclude all-gather internals and profiler ops from selective checkpointing)', state='not in torch 2.13.0', see_also=('pytorch/pytorch#185178', 'pytorch/torchtitan#3427'))
DELAY_ALL_REDUCE_ROOT = KnownBug('ddp-delay-all-reduce-root-params-reduced-twice', "DistributedDataParallel(delay_all_reduce_named_params=..., param_to_hook_all_reduce=...): a delayed parameter of the root module itself stays in the reducer too (the reducer leaves out f'{module_name}.{name}', which is '.<name>' for the root's own parameters), so it is all-reduced twice, racing, and its gradient is wrong now and then; every parameter replicate() hands DDP is one (an nn.ParameterList's)", symptoms=frozenset({'mismatch'}), relation='none found after five phrasings; the option came with the pull request in see_also', state='present in torch 2.13.0', see_also=('pytorch/pytorch#95669',), ends_ranks=False, tag=':delay-all-reduce', odds=4)
COMPILED_UNFREEZE_PLAIN = KnownBug('compile-unfrozen-plain-param-no-recompile', "torch.compile (aot_eager) of a module whose plain (non-DTensor) parameter was frozen when it was compiled: after requires_grad_(True) the compiled forward is reused without a recompile and the parameter gets no gradient (met through fully_shard's ignored_params, which stay plain tensors)", symptoms=frozenset({'mismatch'}), upstream='pytorch/pytorch#139476', relation='same bug (Dynamo reuses a compiled frame when the requires_grad of module parameters changes)', state='present in torch 2.11; torch 2.13.0 recompiles (the torch-only reproducer passes there)', fixed_in='2.13', ends_ranks=False, tag=':compiled-unfreeze')
BUGS = {b.id: b for b in (FSDP1_HSDP_SHARD1, FOREACH_MIXED, INT_RESHARD_DIM1, FROZEN_INT_RESHARD, UNFROZEN_UNRESHARDED, UNUSED_NO_ALL_REDUCE, FSDP1_UNFROZEN_FROZEN_UNIT, MP_UNIFORM_GRAD_DTYPE, MP_NEVER_RUN_NO_SYNC, MP_FROZEN_AT_LAZY_INIT, BROADCAST_EMPTY, STATELESS_FULL, FSDP1_FULL_OFFLOAD, FSDP1_FROZEN_UNIT, FSDP1_DCP_STATELESS, FSDP1_DCP_EMPTY_SHARD, FSDP1_ASYNC_DEFAULT_STAGER, CACHED_STAGING_NEEDS_ACCELERATOR, CACHED_STAGING_PINNED_METADATA, FSDP1_HSDP_OPTIMIZER_LOAD, FSDP1_HSDP_RANK0_BROADCAST, FSDP1_COMPILE_SHARDED_GRAD, DIVIDE_FACTOR_TWICE, FLAT_FULL_OPTIM, FROZEN_OPTIM_STATE_DROPPED, PLAN_CACHE_FAILED_SAVE, CHECKPOINT_DEBUG, SAC_OVER_FSDP_UNIT, DELAY_ALL_REDUCE_ROOT, COMPILED_UNFREEZE_PLAIN)}

def _release(version: str) -> tuple[int, int]:
    major, minor = [*version.split('+')[0].split('.'), '0'][:2]
    return (int(major), int(''.join((c for c in minor if c.isdigit())) or 0))

def present(bug: KnownBug, torch_version: str) -> bool:
    return not bug.fixed_in or _release(torch_version) < _release(bug.fixed_in)

def get(bug_id: str) -> KnownBug:
    try:
        return BUGS[bug_id]
    except KeyError:
        raise KeyError(f'no known bug {bug_id!r}; known: {sorted(BUGS)}') from None

def int_reshard_dim1(comp: Composition) -> bool:
    return any((not isinstance(s.reshard_after_forward, bool) and s.shard_dim for s in comp.shards))

def foreach_over_mixed(training: Training, comps: tuple[Composition, ...]) -> bool:
    return training.foreach is not False and any((c.shards and c.replicates for c in comps))

def shard1(comp: Composition) -> bool:
    return bool(comp.mesh) and comp.mesh[1] == 1

def fsdp1_shard1(comp: Composition) -> bool:
    return comp.wrapper is Wrapper.FSDP1_HYBRID_SHARD and (2, 2)[1] == 1 and (comp.mesh[0] > 1)

def frozen_int_reshard_unit(tree: ModuleTree, comp: Composition) -> bool:
    layout = Layout(tree, comp)
    return any((u.api == 'fully_shard' and (not isinstance(comp.shards[u.index].reshard_after_forward, bool)) and layout.frozen_only(u) for u in layout.units))

def unfrozen_unresharded_unit(tree: ModuleTree, comp: Composition, training: Training) -> bool:
    unfrozen = {u.path for u in training.unfreeze}
    return any((p in unfrozen for p in unresharded_frozen(tree, comp)))

def unresharded_frozen(tree: ModuleTree, comp: Composition) -> list[str]:
    layout = Layout(tree, comp)
    shards = [u for u in layout.units if u.api == 'fully_shard']
    out = []
    for top in shards:
        if not layout.outermost(top):
            continue
        subtree = [p for p, n in layout.paths.items() if top.covers(p) and owns_params(n)]
        if not subtree or not all((_frozen_leaf(layout.paths[p]) for p in subtree)):
            continue
        for unit in shards:
            if comp.reshard_after_forward(comp.shards[unit.index]) is True:
                continue
            for member in unit.members:
                if top.covers(member):
                    out += layout.owned_by(unit, member)
    return out

def unused_no_all_reduce(tree: ModuleTree, comp: Composition, training: Training) -> bool:
    return bool(comp.shards) and training.accum_sync is AccumSync.NO_ALL_REDUCE and training.unused_on_some_microbatches(tree)

def fsdp1_unfrozen_in_frozen_unit(tree: ModuleTree, comp: Composition, training: Training, world_size: int=2) -> bool:
    unsharded = is_fsdp1(comp) and (not fsdp1_gathers(comp, world_size))
    if not unsharded or not comp.auto_wrap or (not training.unfreeze):
        return False
    paths = tree.paths()
    return any((_frozen_fsdp1_unit(paths[later.path.rpartition('.')[0]]) for later in training.unfreeze))

def fsdp1_compiled_with_sharded_grads(comp: Composition, training: Training, world_size: int) -> bool:
    if training.compile is Compile.NONE or not fsdp1_gathers(comp, world_size):
        return False
    return training.grad_accum > 1 or (not training.set_to_none and training.steps > 1)
_OVERFLOW_RISK_DTYPES = (Dtype.FLOAT16, Dtype.FLOAT64)

def divide_factor_twice(comp: Composition, training: Training, world_size: int) -> bool:
    factor = comp.knobs.gradient_divide_factor
    shard_size = comp.mesh[1] if comp.mesh else world_size // comp.tp_size
    if factor is None or factor == 1.0 or shard_size != 1 or (not comp.shards):
        return False
    if comp.knobs.force_sum_reduction:
        return True
    for spec in comp.shards:
        mp = spec.mixed_precision
        reduce = mp.reduce_dtype or mp.param_dtype if mp is not None else None
        if (reduce or training.dtype) in _OVERFLOW_RISK_DTYPES:
            return True
    return False

def never_run_under_no_sync(tree: ModuleTree, comp: Composition, training: Training) -> bool:
    paths = tree.paths()
    return training.accum_sync is AccumSync.NO_GRAD_SYNC and any((s.mixed_precision is not None and s.mixed_precision.reduce_dtype is not None for s in comp.shards)) and any((has_params(paths[p]) for p in training.skipped_at(0, 0)))

def unfrozen_in_frozen_mp_unit(tree: ModuleTree, comp: Composition, training: Training) -> bool:
    layout = Layout(tree, comp)
    unfrozen = {u.path for u in training.unfreeze}
    for unit in layout.units:
        if unit.api != 'fully_shard':
            continue
        mp = comp.shards[unit.index].mixed_precision
        if mp is None or mp.param_dtype is None:
            continue
        if layout.frozen_only(unit) and any((p in unfrozen for p in layout.owned_by(unit))):
            return True
    return False

def checkpoint_debug(comp: Composition) -> bool:
    return bool(comp.checkpoints) and comp.checkpoint_options.debug

def selective_over_unit(comp: Composition) -> bool:
    return comp.checkpoint_options.context_fn is not ContextFn.NONE and any((contains(c, p) for c in comp.checkpoints for p in comp.sharded_paths))

def delayed_all_reduce(comp: Composition) -> bool:
    return bool(comp.replicates) and comp.replicate_options.delay_all_reduce

def compiled_unfreeze_ignored(comp: Composition, training: Training) -> bool:
    ignored = {p for spec in comp.shards for p in spec.ignored}
    return training.compile is Compile.AOT_EAGER and any((u.path in ignored for u in training.unfreeze))

def _frozen_leaf(node: object) -> bool:
    return isinstance(node, Leaf) and node.frozen

def _frozen_fsdp1_unit(node: object) -> bool:
    if not isinstance(node, Block) or node.scale:
        return False
    leaves = [c for c in node.children if isinstance(c, Leaf) and c.kind in PARAM_LEAVES]
    return bool(leaves) and all((c.frozen for c in leaves))

def fsdp1_hsdp_2d(comp: Composition) -> bool:
    return comp.wrapper is Wrapper.FSDP1_HYBRID_SHARD and (2, 2)[0] > 1 and ((2, 2)[1] > 1)

def fsdp1_full_offload(body: Body, world_size: int) -> bool:
    if isinstance(body, DcpBody):
        if body.classic_fsdp1:
            return False
        saves = full_offload_gathers(body.save_full_state_dict, body.save_cpu_offload, body.source, world_size)
        loads = full_offload_gathers(body.load_full_state_dict, body.load_cpu_offload, body.target, world_size)
        return saves or loads
    if not isinstance(body, StateDictBody):
        return False
    return full_offload_gathers(body.save.full_state_dict, body.save.cpu_offload, body.source, world_size)

def full_offload_gathers(full: bool, cpu_offload: bool, comp: Composition, world_size: int) -> bool:
    return full and cpu_offload and fsdp1_gathers(comp, world_size)

def fsdp1_dcp_stateless(body: Body) -> bool:
    if not isinstance(body, DcpBody) or not is_fsdp1(body.target) or (not body.classic_fsdp1):
        return False
    loaded = DcpItem.OPTIMIZER in body.entries and DcpItem.OPTIMIZER not in body.skip
    return loaded and stateless_optimizer(body.training)

def fsdp1_dcp_empty_shard(body: Body, world_size: int) -> bool:
    if not isinstance(body, DcpBody) or tensor_kind(body.target) != 'sharded_tensor' or body.load_full_state_dict:
        return False
    loaded = [e for e in body.entries if e not in body.skip]
    optimizer = DcpItem.APP in loaded or (body.patched and DcpItem.OPTIMIZER in loaded)
    if not (DcpItem.MODEL in loaded or optimizer) or not (DcpItem.SCALARS in loaded or optimizer):
        return False
    width = body.tree.width
    chunk = -(-width // world_size)
    return -(-width // chunk) < world_size

def fsdp1_async_default_stager(body: Body) -> bool:
    if not isinstance(body, DcpBody):
        return False
    return default_stager_copies_sharded(body.async_save, body.storage_objects, body.source, body.save_full_state_dict)

def default_stager_copies_sharded(async_save: bool, storage_objects: bool, source: Composition, full: bool) -> bool:
    return async_save and (not storage_objects) and (not full) and (tensor_kind(source) == 'sharded_tensor')

def stateless_optimizer(training: Training) -> bool:
    return training.optimizer is Optimizer.SGD and (not training.momentum)

def fsdp1_frozen_unit(comp: Composition, tree: ModuleTree) -> bool:
    if comp.wrapper is not Wrapper.FSDP1_NO_SHARD or not comp.auto_wrap:
        return False
    return any((_frozen_fsdp1_unit(n) for n in tree.paths().values()))

def hsdp_optimizer_load(body: Body) -> bool:
    return isinstance(body, DcpBody) and fsdp1_hsdp_2d(body.target) and True and (DcpItem.OPTIMIZER in body.entries) and (DcpItem.OPTIMIZER not in ())

def broadcast_empty(body: Body) -> bool:
    if isinstance(body, StateDictBody):
        return broadcast_empty_combined(body.api, body.load.broadcast_from_rank0)
    if isinstance(body, DcpBody):
        loaded = tuple((e for e in body.entries if e not in body.skip))
        return broadcast_empty_app(loaded, body.load_full_state_dict, body.load_cpu_offload)
    return False

def broadcast_empty_combined(api: Api, broadcast_from_rank0: bool) -> bool:
    return api is Api.COMBINED and broadcast_from_rank0

def broadcast_empty_app(loaded: tuple[DcpItem, ...], full: bool, cpu_offload: bool) -> bool:
    return DcpItem.APP in loaded and full and cpu_offload

def frozen_state_dropped(body: Body) -> bool:
    if not isinstance(body, (StateDictBody, DcpBody)) or stateless_optimizer(body.training):
        return False
    if isinstance(body, StateDictBody):
        loaded = body.api is not Api.FSDP1
    else:
        loaded = any((e in body.entries and e not in () for e in (DcpItem.OPTIMIZER, DcpItem.APP))) and (not True)
    return loaded and bool(trained_then_frozen(body))

def plan_cache_failed_save(body: Body) -> bool:
    return isinstance(body, DcpBody) and body.save_planner is not None and body.save_planner.enable_plan_caching and (body.overwrite is Overwrite.FALSE)

def stateless_full(body: Body) -> bool:
    if not isinstance(body, (StateDictBody, DcpBody)):
        return False
    if not stateless_optimizer(body.training):
        return False
    if isinstance(body, StateDictBody):
        return stateless_full_path(body.load.full_state_dict, body.target) and body.api is not Api.FSDP1
    loaded = [e for e in body.entries if e not in body.skip]
    return stateless_full_path(body.load_full_state_dict, body.target) and (DcpItem.APP in loaded or DcpItem.OPTIMIZER in loaded)

def flat_full_optimizer(body: object) -> bool:
    return isinstance(body, StateDictBody) and body.api is not Api.FSDP1 and body.load.full_state_dict and body.load.flatten_optimizer_state_dict

def stateless_full_path(full: bool, target: Composition) -> bool:
    return full and (not is_fsdp1(target))

def _comps(case: Case) -> list[Composition]:
    return [v for v in vars(case.body).values() if isinstance(v, Composition)]

def _per_comp(condition: Callable[[ModuleTree, Composition, Training], bool]) -> Callable[[Case], bool]:

    def met(case: Case) -> bool:
        tree, training = (getattr(case.body, 'tree', None), getattr(case.body, 'training', None))
        if not isinstance(tree, ModuleTree) or not isinstance(training, Training):
            return False
        return any((condition(tree, c, training) for c in _comps(case)))
    return met

def _with_training(condition: Callable[[Composition, Training, int], bool]) -> Callable[[Case], bool]:

    def met(case: Case) -> bool:
        training = getattr(case.body, 'training', None)
        return isinstance(training, Training) and any((condition(c, training, case.world_size) for c in _comps(case)))
    return met

def _saving(condition: Callable[[Case], bool]) -> Callable[[Case], bool]:
    return lambda case: isinstance(case.body, (StateDictBody, DcpBody)) and condition(case)

def _frozen_int_reshard(case: Case) -> bool:
    tree = getattr(case.body, 'tree', None)
    return isinstance(tree, ModuleTree) and any((frozen_int_reshard_unit(tree, c) for c in _comps(case)))

def _foreach_mixed(case: Case) -> bool:
    training = getattr(case.body, 'training', None)
    return isinstance(training, Training) and foreach_over_mixed(training, tuple(_comps(case)))

def _unfrozen_unresharded(case: Case) -> bool:
    body = case.body
    if isinstance(body, (StateDictBody, DcpBody)) and body.frozen_in_optimizer and unresharded_frozen(body.tree, body.source):
        return True
    return _per_comp(unfrozen_unresharded_unit)(case)

def _fsdp1_unfrozen_frozen_unit(case: Case) -> bool:
    return _per_comp(lambda t, c, tr: fsdp1_unfrozen_in_frozen_unit(t, c, tr, case.world_size))(case)
CONDITIONS = ((INT_RESHARD_DIM1, lambda case: any((int_reshard_dim1(c) for c in _comps(case)))), (FSDP1_HSDP_SHARD1, lambda case: any((fsdp1_shard1(c) for c in _comps(case)))), (FSDP1_FROZEN_UNIT, _saving(lambda case: fsdp1_frozen_unit(case.body.source, case.body.tree))), (FSDP1_FULL_OFFLOAD, _saving(lambda case: fsdp1_full_offload(case.body, case.world_size))), (FSDP1_DCP_STATELESS, _saving(lambda case: fsdp1_dcp_stateless(case.body))), (FSDP1_DCP_EMPTY_SHARD, _saving(lambda case: fsdp1_dcp_empty_shard(case.body, case.world_size))), (FSDP1_ASYNC_DEFAULT_STAGER, _saving(lambda case: fsdp1_async_default_stager(case.body))), (CACHED_STAGING_NEEDS_ACCELERATOR, lambda case: isinstance(case.body, DcpBody) and case.body.cache_staged), (BROADCAST_EMPTY, _saving(lambda case: broadcast_empty(case.body))), (STATELESS_FULL, _saving(lambda case: stateless_full(case.body))), (FLAT_FULL_OPTIM, _saving(lambda case: flat_full_optimizer(case.body))), (PLAN_CACHE_FAILED_SAVE, _saving(lambda case: plan_cache_failed_save(case.body))), (FSDP1_HSDP_OPTIMIZER_LOAD, _saving(lambda case: hsdp_optimizer_load(case.body))), (FROZEN_OPTIM_STATE_DROPPED, _saving(lambda case: frozen_state_dropped(case.body))), (FROZEN_INT_RESHARD, _frozen_int_reshard), (UNFROZEN_UNRESHARDED, _unfrozen_unresharded), (UNUSED_NO_ALL_REDUCE, _per_comp(unused_no_all_reduce)), (MP_NEVER_RUN_NO_SYNC, _per_comp(never_run_under_no_sync)), (MP_UNIFORM_GRAD_DTYPE, _per_comp(never_run_under_no_sync)), (MP_FROZEN_AT_LAZY_INIT, _per_comp(unfrozen_in_frozen_mp_unit)), (FSDP1_UNFROZEN_FROZEN_UNIT, _fsdp1_unfrozen_frozen_unit), (FOREACH_MIXED, _foreach_mixed), (FSDP1_COMPILE_SHARDED_GRAD, _with_training(fsdp1_compiled_with_sharded_grads)), (DIVIDE_FACTOR_TWICE, _with_training(divide_factor_twice)), (CHECKPOINT_DEBUG, lambda case: any((checkpoint_debug(c) for c in _comps(case)))), (SAC_OVER_FSDP_UNIT, lambda case: any((selective_over_unit(c) for c in _comps(case)))), (DELAY_ALL_REDUCE_ROOT, lambda case: any((delayed_all_reduce(c) for c in _comps(case)))), (COMPILED_UNFREEZE_PLAIN, _with_training(lambda c, training, _: compiled_unfreeze_ignored(c, training))))

def _met_in_order(case: Case) -> list[KnownBug]:
    return [bug for bug, condition in CONDITIONS if condition(case)]

def ends_ranks(case: Case) -> str | None:
    return next((bug.id for bug in _met_in_order(case) if bug.ends_ranks), None)
ALONE_IN_BROADCAST = 'torch/distributed/_state_dict_utils.py:_broadcast_state_dict:rank0-alone'

def rank0_alone_in_broadcast(stacks: list[str]) -> bool:
    inside = ['_broadcast_state_dict' in s for s in stacks]
    return bool(inside) and inside[0] and (not all(inside))
ALONE_IN_BROADCAST_STALL = Stall(name='rank 0 alone in _broadcast_state_dict', deadlocked=rank0_alone_in_broadcast, after=10.0, hold=3.0)
_FRAME = re.compile('File "([^"]+)", line \\d+,? in (\\S+)')

@dataclass(frozen=True)
class Signature:
    kind: object
    property: object
    check: object = ''
    where: object = ''
    tags: object = ()

    def __str__(self) -> str:
        text = f'{self.kind}:{self.property}'
        if self.check:
            text += f':{self.check}'
        if self.where:
            text += f'@{self.where}'
        return text + ''.join((f':{t}' for t in self.tags))

    @classmethod
    def parse(cls, text: str) -> Signature | None:
        kind, sep, rest = text.partition(':')
        if not sep or kind not in ('mismatch', 'exception', 'crash', 'hang'):
            return None
        head, at, where = rest.partition('@')
        prop, _, check = head.partition(':')
        if not prop or (at and (not where)):
            return None
        if kind == 'mismatch' and at and (not check):
            family, *tags = where.split(':')
            return cls(kind, prop, '', family, tuple(tags))
        if kind in ('exception', 'crash') and (not (at and check)):
            return None
        if not (check or where):
            return None
        return cls(kind, prop, check, where)

@dataclass(frozen=True)
class Failure:
    kind: object
    signature: object
    summary: object
    details: object = field(default_factory=dict)
_INLINED = frozenset({'<listcomp>', '<dictcomp>', '<setcomp>'})

def location(text: str | None) -> str:
    frames = [(path, fn) for path, fn in _FRAME.findall(_current_thread(text or '')) if fn not in _INLINED]
    if not frames:
        return '?'
    if text and 'most recent call first' in text:
        ordered = frames
    else:
        ordered = list(reversed(frames))
    for path, fn in ordered:
        at = path.rfind('/torch/')
        inner = path[at + 1:]
        if at >= 0 and '/fuzz/' not in path and ('-packages/' not in inner):
            return f'{inner}:{fn}'
    path, fn = ordered[0]
    return f"{path.rsplit('/', 1)[-1]}:{fn}"

def _current_thread(text: str) -> str:
    at = text.find('Current thread ')
    if at < 0:
        return text
    block = re.split('\\n\\s*\\n', text[at:], maxsplit=1)[0]
    return block if _FRAME.search(block) else text

def failure_from_outcome(prop: str, outcome: Outcome) -> Failure:
    details = {'ranks': [_rank_details(r) for r in outcome.ranks], 'seconds': outcome.seconds}
    if outcome.kind is OutcomeKind.CRASH:
        dead = next((r for r in outcome.ranks if r.exit_status is not None))
        status = dead.exit_status
        cause = f'signal {signal.Signals(-status).name}' if status is not None and status < 0 else f'exit status {status}'
        where = location(dead.stack) if dead.stack else '?'
        signature = Signature('crash', prop, cause, where)
        return Failure('crash', str(signature), f'rank {dead.rank} died ({cause})', details)
    if outcome.kind is OutcomeKind.EXCEPTION:
        first = next((r for r in outcome.ranks if r.exc_type))
        where = location(first.traceback)
        summary = f"rank {first.rank} raised {first.exc_type}: {shorten(first.message or '', 300)}"
        return Failure('exception', str(Signature('exception', prop, first.exc_type or '?', where)), summary, details)
    if outcome.kind is OutcomeKind.HANG:
        stuck = [r for r in outcome.ranks if r.status == 'stuck']
        where = location(stuck[0].stack)
        ranks = ', '.join((str(r.rank) for r in stuck))
        summary = f'rank(s) {ranks} stuck in {where}: {outcome.stalled}' if outcome.stalled else f'rank(s) {ranks} missed the deadline in {where}'
        return Failure('hang', str(Signature('hang', prop, where=where)), summary, details)
    raise ValueError('an ok outcome is not a failure')

def _rank_details(r: Any) -> dict[str, Any]:
    return {'rank': r.rank, 'status': r.status, 'exc_type': r.exc_type, 'message': r.message, 'traceback': r.traceback, 'stack': r.stack, 'exit_status': r.exit_status, 'output_tail': r.output_tail}

def shorten(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    cut = text[:limit - 1]
    space = cut.rfind(' ')
    return (cut[:space] if space > limit // 2 else cut).rstrip() + '…'

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

def strategy(name: str) -> Callable[..., Any]:

    def cases(*, world_size: int, **kwargs: Any) -> Any:
        import strategies
        return getattr(strategies, name)(world_size=world_size, **kwargs)
    return cases
_REGISTRY = {}

def register(prop: Property) -> Property:
    if prop.name in _REGISTRY:
        raise ValueError(f'property {prop.name!r} is registered twice')
    _REGISTRY[prop.name] = prop
    return prop

def get_property(name: str) -> Property:
    _load_properties()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise InvalidArgument(f'--property {name!r} is not a property; run `python -m fuzz properties` for the list') from None

def all_properties() -> list[Property]:
    _load_properties()
    return [p for name, p in sorted(_REGISTRY.items()) if not name.startswith('_')]

def _load_properties() -> None:
    pass

@dataclass(frozen=True)
class Tolerance:
    rtol: object
    atol: object
POLICY = {'float64': Tolerance(rtol=1e-09, atol=1e-12), 'float32': Tolerance(rtol=1e-05, atol=1e-06), 'bfloat16': Tolerance(rtol=0.032, atol=0.001), 'float16': Tolerance(rtol=0.004, atol=0.0001)}

def tolerance_for(dtype: str) -> Tolerance:
    try:
        return POLICY[dtype]
    except KeyError:
        raise KeyError(f'no tolerance policy for dtype {dtype!r}; known: {sorted(POLICY)}') from None

@dataclass(frozen=True)
class Mismatch:
    index: object
    actual: object
    expected: object
    error: object
    allowed: object

def first_mismatch(actual: Sequence[float], expected: Sequence[float], tol: Tolerance) -> Mismatch | None:
    if len(actual) != len(expected):
        return Mismatch(index=-1, actual=float(len(actual)), expected=float(len(expected)), error=float('inf'), allowed=0.0)
    worst = None
    for i, (a, e) in enumerate(zip(actual, expected)):
        allowed = tol.atol + tol.rtol * abs(e)
        err = abs(a - e)
        if not err <= allowed or not math.isfinite(e):
            excess = err - allowed if err == err else float('inf')
            if worst is None or excess > worst.error - worst.allowed:
                worst = Mismatch(index=i, actual=a, expected=e, error=err, allowed=allowed)
    return worst
atexit.register(shutil.rmtree, dcp_root(os.getpid()), ignore_errors=True)
ALREADY_EXISTS = 'Checkpoint already exists'

def _failure(prop: str, outcome: Outcome) -> Failure:
    failure = failure_from_outcome(prop, outcome)
    texts = [(r.stack or '') + (r.traceback or '') for r in outcome.ranks]
    if rank0_alone_in_broadcast(texts):
        skipped = [r.rank for r, t in zip(outcome.ranks, texts) if '_broadcast_state_dict' not in t]
        return Failure('hang', str(Signature('hang', prop, where=ALONE_IN_BROADCAST)), f'rank 0 broadcasts state in _broadcast_state_dict that rank(s) {skipped} skipped ({failure.summary})', failure.details)
    return failure

def _mismatch(prop: str, check: str, where: str, summary: str, **details: Any) -> Failure:
    return Failure('mismatch', str(Signature('mismatch', prop, check, where)), summary, {'check': check, **details})

def _first_difference(got: Any, want: Any, path: str='') -> str:
    if isinstance(got, dict) and isinstance(want, dict):
        for key in sorted(set(got) | set(want), key=str):
            if key not in got:
                return f'{path}[{key!r}] is missing'
            if key not in want:
                return f'{path}[{key!r}] is unexpected'
            diff = _first_difference(got[key], want[key], f'{path}[{key!r}]')
            if diff:
                return diff
        return ''
    if isinstance(got, list) and isinstance(want, list):
        if len(got) != len(want):
            return f'{path} has {len(got)} elements, expected {len(want)}'
        for i, (g, w) in enumerate(zip(got, want)):
            diff = _first_difference(g, w, f'{path}[{i}]')
            if diff:
                return diff
        return ''
    return '' if got == want else f'{path}: {got!r} != {want!r}'

def _exact(prop: str, check: str, where: str, what: str, got: Any, want: Any, **details: Any) -> Failure | None:
    diff = _first_difference(got, want)
    if not diff:
        return None
    return _mismatch(prop, check, where, f'{what} differs after the load: {diff}', observed=got, expected=want, **details)

def _where(comp: Composition) -> str:
    if comp.wrapper is not Wrapper.NONE:
        return comp.wrapper.value
    if is_plain(comp):
        return 'plain'
    name = '+'.join((api for api, used in (('fully_shard', comp.shards), ('replicate', comp.replicates)) if used))
    return name + (':hsdp' if comp.mesh else '')

def _shard1(source: Composition, target: Composition) -> str:
    return FSDP1_HSDP_SHARD1.tag if fsdp1_shard1(source) or fsdp1_shard1(target) else ''

def _check_model(prop: str, where: str, saved: dict[str, Any], loaded: dict[str, Any], fresh: dict[str, Any] | None, dropped: list) -> Failure | None:
    want = dict(saved['model'])
    for key in dropped:
        if fresh is not None and 'model' in fresh:
            want[key] = fresh['model'][key]
    return _exact(prop, 'model', where, 'the model (parameters and buffers)', loaded['model'], want, dropped=dropped)

def _check_optimizer(prop: str, where: str, source: Composition, target: Composition, observations: list[dict[str, Any]], want: str, check: str='optimizer') -> Failure | None:
    if not True:
        first = observations[0]
        return _exact(prop, check, where, 'the optimizer state', first['loaded']['optimizer'], first[want]['optimizer'])
    if want == 'saved' and source != target:
        return None
    for rank, obs in enumerate(observations):
        failure = _exact(prop, check, where, f"rank {rank}'s local optimizer state (FSDP1, one layout)", _holding_elements(obs['loaded']['optimizer_local']), _holding_elements(obs[want]['optimizer_local']), rank=rank)
        if failure is not None:
            return failure
    return None

def _holding_elements(local: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {name: entry for name, entry in local.items() if not any((v == [] for v in entry.values()))}

def _same_operations(source: Composition, target: Composition) -> bool:
    return source == target and (not source.replicates) and (source.wrapper is not Wrapper.DDP)

def _check_resume(prop: str, where: str, case: Case, same: bool, observations: list[dict[str, Any]]) -> Failure | None:
    body = case.body
    assert isinstance(body, (StateDictBody, DcpBody))
    tol = tolerance_for(body.training.dtype.value)
    for rank, obs in enumerate(observations):
        if 'losses_target' not in obs:
            return None
        got, want = (obs['losses_target'], obs['losses_source'])
        bad = first_mismatch(got, want, tol) if not same else next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), None)
        if bad is not None:
            return _mismatch(prop, 'resume_loss', where, f"rank {rank}: losses after the load {got} differ from the uninterrupted run's {want} " + ('(must be equal: same composition)' if same else f'(beyond {tol})'), rank=rank, observed=got, expected=want)
    first = observations[0]
    got_p, want_p = (first['final_target'], first['final_source'])
    if same:
        diff = _first_difference(got_p, want_p)
        if diff:
            return _mismatch(prop, 'resume_params', where, f"parameters after resuming differ from the uninterrupted run's: {diff}")
        return None
    for name, want_v in want_p.items():
        bad_p = first_mismatch(got_p.get(name, []), want_v, tol)
        if bad_p is not None:
            return _mismatch(prop, 'resume_params', where, f'{name}[{bad_p.index}] is {bad_p.actual!r} after resuming, uninterrupted {bad_p.expected!r} (error {bad_p.error:.3g} > allowed {bad_p.allowed:.3g})', param=name)
    return None

def _one_bug(case: Case, failure: Failure | None) -> Failure | None:
    if failure is None or failure.kind != 'mismatch' or (not failure.signature.endswith(FSDP1_HSDP_SHARD1.tag)):
        return failure
    signature = Signature.parse(failure.signature)
    assert signature is not None and signature.where
    family, *tags = signature.where.split(':')
    renamed = Signature('mismatch', case.property, where=family, tags=(*tags, *signature.tags))
    return dataclasses.replace(failure, signature=str(renamed))

def judge_dcp(case: Case, outcome: Outcome) -> Failure | None:
    return _one_bug(case, _frozen_state_dropped(case, _hsdp_optimizer_load(case, _judge_dcp(case, outcome))))
OPTIMIZER_CHECKS = ('optimizer', 'resume_loss', 'resume_params')

def _hsdp_optimizer_load(case: Case, failure: Failure | None) -> Failure | None:
    body = case.body
    if failure is None or failure.kind != 'mismatch' or (not isinstance(body, DcpBody)) or (not hsdp_optimizer_load(body)) or (failure.details.get('check') not in OPTIMIZER_CHECKS):
        return failure
    where = 'save'
    tag = FSDP1_HSDP_OPTIMIZER_LOAD.tag.lstrip(':')
    return dataclasses.replace(failure, signature=str(Signature('mismatch', 'dcp', where=where, tags=(tag,))))

def _frozen_state_dropped(case: Case, failure: Failure | None) -> Failure | None:
    body = case.body
    if failure is None or failure.kind != 'mismatch' or (not isinstance(body, (StateDictBody, DcpBody))) or (not frozen_state_dropped(body)) or (failure.details.get('check') not in OPTIMIZER_CHECKS):
        return failure
    tag = FROZEN_OPTIM_STATE_DROPPED.tag.lstrip(':')
    signature = Signature('mismatch', case.property, where='set_optimizer_state_dict', tags=(tag,))
    return dataclasses.replace(failure, signature=str(signature))

def _check_requires_grad(prop: str, where: str, observations: list[dict[str, Any]]) -> Failure | None:
    for rank, obs in enumerate(observations):
        seen = obs.get('requires_grad')
        if seen is None:
            continue
        before, after = (seen['before'], seen['after'])
        changed = sorted((n for n in before.keys() & after.keys() if before[n] != after[n]))
        if changed:
            return _mismatch(prop, 'requires_grad', where, f'rank {rank}: the load changed requires_grad of {changed} (before: {[before[n] for n in changed]})', rank=rank)
    return None

def _judge_dcp(case: Case, outcome: Outcome) -> Failure | None:
    if not outcome.ok:
        return _failure(case.property, outcome)
    body = case.body
    assert isinstance(body, DcpBody)
    prop, observations = ('dcp', outcome.observations)
    where = 'save' + _shard1(body.source, body.target)
    for rank, obs in enumerate(observations):
        if obs.get('in_place'):
            return _mismatch(prop, 'in_place', 'load', f"rank {rank}: {obs['in_place']}")
    if body.mode is not DcpMode.ROUND_TRIP:
        return None
    failure = _check_dcp_options(prop, where, body, observations) or _check_requires_grad(prop, where, observations)
    if failure is not None:
        return failure
    if body.overwrite is Overwrite.FALSE:
        failure = _check_refusal(prop, where, observations)
        if failure is not None:
            return failure
    loaded_entries = [e for e in body.entries if e not in ()]
    model_loaded = DcpItem.MODEL in loaded_entries or DcpItem.APP in loaded_entries
    optim_loaded = DcpItem.OPTIMIZER in loaded_entries or DcpItem.APP in loaded_entries
    first = observations[0]
    saved, loaded, fresh, dropped = (first['saved'], first['loaded'], first.get('fresh'), first['dropped'])
    if model_loaded:
        failure = _check_model(prop, where, saved, loaded, fresh, dropped)
    else:
        failure = _exact(prop, 'skipped_model', where, 'the model (not loaded)', loaded['model'], (fresh or {})['model'])
    if failure is None and optim_loaded:
        failure = _check_optimizer(prop, where, body.source, body.target, observations, 'saved')
    elif failure is None and is_fsdp1(body.target):
        failure = _check_optimizer(prop, where, body.source, body.target, observations, 'fresh', 'skipped_optimizer')
    elif failure is None and fresh is not None and ('optimizer' in fresh):
        failure = _exact(prop, 'skipped_optimizer', where, 'the optimizer state (not loaded)', loaded['optimizer'], fresh['optimizer'])
    for rank, obs in enumerate(observations):
        if failure is not None:
            break
        want_groups = obs['saved']['groups'] if optim_loaded else obs['fresh']['groups']
        failure = _exact(prop, 'groups', where, f"rank {rank}'s param groups", obs['loaded']['groups'], want_groups)
        for key in ('scalars', 'counter', 'extra'):
            if failure is None and key in obs['loaded']:
                got, want = (obs['loaded'][key], obs['saved'][key])
                if key == 'counter':
                    if got.get('agreed') != got['value']:
                        failure = _mismatch(prop, 'counter', where, f'rank {rank}: ranks loaded different values {got}')
                        break
                    got = {k: v for k, v in got.items() if k != 'agreed'}
                    want = {k: v for k, v in want.items() if k != 'agreed'}
                failure = _exact(prop, key, where, f"rank {rank}'s {key} entry", got, want)
    if failure is None and model_loaded and (not dropped):
        failure = _exact(prop, 'probe', where, 'the forward output on the fixed input', loaded['probe'], saved['probe'])
    if failure is None:
        failure = _check_resume(prop, where, case, _same_operations(body.source, body.target), observations)
    return failure

def _check_dcp_options(prop: str, where: str, body: DcpBody, observations: list[dict[str, Any]]) -> Failure | None:
    if None is not None and body.save_planner.dedup_save_to_lowest_rank:
        failure = _check_dedup(prop, where, observations)
        if failure is not None:
            return failure
    return None

def _check_dedup(prop: str, where: str, observations: list[dict[str, Any]]) -> Failure | None:
    holders = {}
    for rank, obs in enumerate(observations):
        for item in obs['dedup']['local_items']:
            holders.setdefault(repr(item), []).append(rank)
    written = {}
    for fqn, offset, relative_path in observations[0]['dedup']['written']:
        key = repr([fqn, offset])
        if key in written:
            return _mismatch(prop, 'dedup', where, f'item {key} is written twice: {written[key]}, {relative_path}')
        written[key] = relative_path
        if key not in holders:
            return _mismatch(prop, 'dedup', where, f'item {key} is written ({relative_path}) but no rank planned it')
        lowest = min(holders[key])
        if not relative_path.startswith(f'__{lowest}_'):
            return _mismatch(prop, 'dedup', where, f'item {key}, planned by ranks {sorted(holders[key])}, is written to {relative_path}, not by rank {lowest} (dedup_save_to_lowest_rank=True)')
    unwritten = sorted(set(holders) - set(written))
    if unwritten:
        return _mismatch(prop, 'dedup', where, f'items planned but not written: {unwritten[:5]}')
    return None

def _check_refusal(prop: str, where: str, observations: list[dict[str, Any]]) -> Failure | None:
    for rank, obs in enumerate(observations):
        refusal = obs['overwrite']['refusal']
        if refusal is None:
            return _mismatch(prop, 'overwrite', where, f'rank {rank}: FileSystemWriter(overwrite=False) saved over a checkpoint')
        if not refusal['type'].endswith('.CheckpointException') or ALREADY_EXISTS not in refusal['message']:
            return _mismatch(prop, 'overwrite', where, f"rank {rank}: FileSystemWriter(overwrite=False) over a checkpoint raised {refusal['type']}: {refusal['message'][:500]} (expected CheckpointException {ALREADY_EXISTS!r})")
    if not observations[0]['overwrite']['untouched']:
        return _mismatch(prop, 'overwrite', where, 'the refused save (overwrite=False) changed the existing checkpoint')
    return None

def _layout_features(source: Composition, target: Composition) -> list[str]:
    out = [f'source:{_where(source)}', f'target:{_where(target)}']
    if source == target:
        out.append('reshard:none')
    elif source.mesh != target.mesh and (not is_plain(source)) and (not is_plain(target)):
        out.append('reshard:mesh')
    elif tensor_kind(source) != tensor_kind(target):
        out.append(f'reshard:{tensor_kind(source)}->{tensor_kind(target)}')
    else:
        out.append('reshard:composition')
    for comp in (source, target):
        if any((s.shard_dim for s in comp.shards)):
            out.append('shard_placement_fn')
        if comp.checkpoints:
            out.append('activation_checkpoint')
        if comp.auto_wrap:
            out.append('fsdp1:auto_wrap')
        if fsdp1_shard1(comp):
            out.append('fsdp1:hybrid_shard1')
    return out

def _schedule_features(body: StateDictBody | DcpBody) -> list[str]:
    out = []
    for c in body.requires_grad:
        out.append('requires_grad:' + ('unfreeze' if c.trainable else 'freeze'))
        out.append('requires_grad:' + ('before_save' if c.step < body.training.steps else 'after_save'))
    return out

def _optimizer_features(tree: ModuleTree, frozen_in_optimizer: bool, empty_group: bool) -> list[str]:
    out = []
    if any((getattr(n, 'frozen', False) for n in tree.paths().values())):
        out.append('frozen:in_optimizer' if frozen_in_optimizer else 'frozen:model_only')
    if empty_group:
        out.append('param_groups:empty')
    return out

def features_dcp(case: Case) -> list[str]:
    body = case.body
    assert isinstance(body, DcpBody)
    out = [f'entry:{e.value}' for e in body.entries]
    out.append('orders:differ' if len(set(body.orders)) > 1 else 'orders:same')
    out.append('async_save' if body.async_save else 'save')
    out.append('storage:objects' if body.storage_objects else 'storage:checkpoint_id')
    out.append(f"save:{('full' if body.save_full_state_dict else 'sharded')}")
    out.append(f"load:{('full' if body.load_full_state_dict else 'sharded')}")
    out += ['save:cpu_offload'] * body.save_cpu_offload + ['load:cpu_offload'] * body.load_cpu_offload
    out += [f'skip:{e.value}' for e in body.skip]
    if body.drop:
        out.append('drop')
    if body.module_stateful:
        out.append('module_stateful')
    if body.target_meta_init:
        out.append('meta_init')
    if len(body.collective_entries()) > 1:
        out.append('collective_statefuls:several')
    if body.patched:
        out.append('patched')
    fsdp1_sides = [side for side, comp in (('source', body.source), ('target', body.target)) if is_fsdp1(comp)]
    if fsdp1_sides:
        how = 'classic' if body.classic_fsdp1 else 'patched' if body.patched else 'app'
        out.append(f"fsdp1:{how}:{('both' if len(fsdp1_sides) == 2 else fsdp1_sides[0])}")
    if body.classic_fsdp1 and DcpItem.OPTIMIZER in body.entries:
        out.append(f'api:{Api.FSDP1.value}')
    if body.overwrite is not Overwrite.NONE:
        out.append(f'overwrite:{body.overwrite.value}')
    if body.async_saves:
        out.append('async:in_flight')
        out.append(f'async:saves:{body.async_saves}')
    if body.cache_staged:
        out.append('async:cached')
    if body.no_dist:
        out.append('no_dist')
        if body.async_save:
            out.append('no_dist:async_save')
    out += _optimizer_features(body.tree, body.frozen_in_optimizer, body.empty_group) + _schedule_features(body)
    out += _dcp_option_features(body)
    return sorted(set(out + _layout_features(body.source, body.target)))

def _dcp_option_features(body: DcpBody) -> list[str]:
    out = [f'writer:{name}' for name in body.writer.changed()]
    sp, lp = (body.save_planner, body.load_planner)
    if sp is not None:
        out.append('save_planner')
        out += ['save_planner:dedup_save_to_lowest_rank'] * sp.dedup_save_to_lowest_rank
        out += ['save_planner:enable_plan_caching'] * sp.enable_plan_caching
        out += ['save_planner:flatten_sharded_tensors:false'] * (not sp.flatten_sharded_tensors)
    if lp is not None:
        out.append('load_planner')
        out += ['load_planner:allow_partial_load'] * lp.allow_partial_load
        out += ['load_planner:flatten_sharded_tensors:false'] * (not lp.flatten_sharded_tensors)
    if body.absent:
        out.append('absent:allowed' if lp is not None and lp.allow_partial_load else 'absent:refused')
    if body.convert:
        out.append('format_utils:convert')
    if body.own_group:
        out.append('process_group:own')
    if body.stager is not None:
        out += body.stager.features()
    if body.process_checkpointer:
        out.append('async_checkpointer:process')
    if not body.use_collectives:
        out.append('use_collectives:false:' + ('async_save' if body.async_save else 'save'))
    if body.torch_save_reader:
        out.append('format_utils:broadcasting_torch_save_reader')
    return out
DCP = register(Property(name='dcp', description='DCP save/async_save/load with Stateful objects and per-rank key orders round-trip exactly', cases=strategy('dcp_cases'), judge=judge_dcp, features=features_dcp, stall=ALONE_IN_BROADCAST_STALL, body=DcpBody, repro='fuzz.repro.script:render'))

def main():
    import os
    import torch
    import torch.distributed as dist
    case = Case(property='dcp', world_size=4, seed=0, body=DcpBody(tree=ModuleTree(width=2, root=Block(children=(Leaf(kind=LeafKind.CONV1D, bias=False),))), source=Composition(mesh=(2, 2), wrapper=Wrapper.FSDP1_HYBRID_SHARD), target=Composition(mesh=(2, 2), wrapper=Wrapper.FSDP1_HYBRID_SHARD), entries=(DcpItem.MODEL, DcpItem.OPTIMIZER), training=Training(optimizer=Optimizer.ADAM, lr=0.01, eps=0.0001, steps=1, batch_per_rank=1, dtype=Dtype.FLOAT64, set_to_none=False), orders=((0, 1), (0, 1), (0, 1), (0, 1))))
    dist.init_process_group('gloo')
    rank, world_size = (dist.get_rank(), dist.get_world_size())
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import json
    obs = json.loads(json.dumps(run_dcp(case, case.body, ctx)))
    outs = [None] * ctx.world_size
    dist.all_gather_object(outs, obs)
    if ctx.rank == 0:
        reports = tuple((RankReport(rank=r, observation=o) for r, o in enumerate(outs)))
        failure = judge_dcp(case, Outcome(kind=OutcomeKind.OK, ranks=reports, seconds=0.0))
        if failure is not None and failure.signature in ['mismatch:dcp@save:fsdp1-hsdp-load_sharded_optimizer_state_dict']:
            print(f'REPRODUCED {failure.signature}: {failure.summary}', flush=True)
            os._exit(1)
        print(f'PASS or another failure: {failure and failure.signature}', flush=True)
if __name__ == '__main__':
    main()
