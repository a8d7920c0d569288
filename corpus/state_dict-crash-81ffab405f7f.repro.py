#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=6e7911c031dba1c2 sources=c2f9d3144d82dce8 seconds=361.7
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
import importlib
from typing import Any
from dataclasses import dataclass, field
import torch
import enum
import typing
from dataclasses import dataclass
from typing import Union
from dataclasses import dataclass, field, fields
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
import inspect
from dataclasses import dataclass, field, replace
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

def is_plain(comp: Composition) -> bool:
    return not comp.shards and (not comp.replicates) and (comp.wrapper is Wrapper.NONE)

def is_fsdp1(comp: Composition) -> bool:
    return comp.wrapper.value.startswith('fsdp1')

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

def _check_side(comp: Composition, tree: ModuleTree, where: str) -> None:
    if is_plain(comp):
        if comp.mesh:
            raise CaseError(f'{where}.mesh', 'a plain model (no fully_shard) has no mesh')
        for i, path in enumerate(comp.checkpoints):
            if path not in tree.paths():
                raise CaseError(f'{where}.checkpoints[{i}]', f'{path!r} names no module of the tree')
        return

def _check_common(tree: ModuleTree, source: Composition, target: Composition, training: Training, steps_after: int, meta: bool) -> None:
    if not has_params(tree.root):
        raise CaseError('tree', 'the tree has no parameters')
    _check_side(source, tree, 'source')
    _check_side(target, tree, 'target')
    if (is_fsdp1(source) or is_fsdp1(target)) and steps_after < 1:
        raise CaseError('steps_after', 'FSDP1 optimizer state is judged by resuming: steps_after must be >= 1')
    if not 0 <= steps_after <= MAX_STEPS:
        raise CaseError('steps_after', f'steps_after={steps_after} is outside 0..{MAX_STEPS}')
    if training.grad_accum != 1:
        raise CaseError('training.grad_accum', 'state-dict cases train one microbatch per step')
    if meta and (target.replicates or target.wrapper is not Wrapper.NONE):
        raise CaseError('target_meta_init', 'a meta-device target takes fully_shard or nothing, not DDP/replicate/FSDP1')
    for s in (*source.shards, *target.shards):
        if s.mixed_precision is not None or s.offload:
            raise CaseError('source.shards', 'mixed precision and CPU offload are covered by the training properties')

def _check_drop(drop: tuple[int, ...]) -> None:
    if any((i < 0 for i in drop)) or len(set(drop)) != len(drop):
        raise CaseError('drop', f'{list(drop)} must be distinct non-negative positions')

def _check_frozen_in_optimizer(tree: ModuleTree, frozen_in_optimizer: bool) -> None:
    if frozen_in_optimizer and (not any((getattr(n, 'frozen', False) for n in tree.paths().values()))):
        raise CaseError('frozen_in_optimizer', 'the tree has no frozen parameter to hand to the optimizer')

def _check_schedule(body: StateDictBody | DcpBody) -> None:
    problem = schedule_problem(body.tree, body.source, body.target, body.training, body.steps_after, body.requires_grad, body.frozen_in_optimizer)
    if problem:
        raise CaseError(*problem)

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

def takes_schedule(comp: Composition) -> bool:
    return (is_plain(comp) or bool(comp.shards)) and (not comp.replicates) and (comp.wrapper is Wrapper.NONE) and (not comp.tp)

def schedule_problem(tree: ModuleTree, source: Composition, target: Composition, training: Training, steps_after: int, changes: tuple[RequiresGrad, ...], frozen_in_optimizer: bool) -> tuple[str, str] | None:
    if not changes:
        return None
    for where, comp in (('source', source), ('target', target)):
        if not takes_schedule(comp):
            return (f'{where}', 'a requires_grad schedule is drawn on plain and fully_shard models only')
    paths = tree.paths()
    total = training.steps + steps_after
    trainable = {p: not n.frozen for p, n in paths.items() if isinstance(n, Leaf) and has_params(n)}
    scales = any((isinstance(n, Block) and n.scale for n in paths.values()))
    for i, c in enumerate(changes):
        if c.path not in trainable:
            return (f'requires_grad[{i}].path', f'{c.path!r} names no leaf with parameters')
        if not 0 <= c.step < total:
            return (f'requires_grad[{i}].step', f'step={c.step} is outside 0..{total - 1}')
        if any(((d.path, d.step) == (c.path, c.step) for d in changes[:i])):
            return (f'requires_grad[{i}]', f'{c.path!r} changes twice before step {c.step}')
    for step in range(total):
        for i, c in enumerate(changes):
            if c.step != step:
                continue
            if trainable[c.path] == c.trainable:
                return (f'requires_grad[{i}].trainable', f'{c.path!r} has requires_grad={c.trainable} already')
            if c.trainable and (not frozen_in_optimizer) and getattr(paths[c.path], 'frozen', False):
                return (f'requires_grad[{i}].path', f'{c.path!r} is frozen in the tree and not held by the optimizer')
            if not c.trainable and (not training.set_to_none):
                return ('training.set_to_none', 'freezing a trained parameter needs zero_grad(set_to_none=True)')
            trainable[c.path] = c.trainable
        if not scales and (not any(trainable.values())):
            return ('requires_grad', f'step {step} trains no parameter')
    return None

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

    def validate_for(self, world_size: int) -> None:
        for where, comp in (('source', self.source), ('target', self.target)):
            if not is_plain(comp):
                check_mesh(comp, world_size, where)

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
    thread_count: object = 1
    per_thread_copy_ahead: object = 10000000

    def __post_init__(self) -> None:
        if not 1 <= self.thread_count <= 4:
            raise CaseError('writer.thread_count', f'thread_count={self.thread_count} is outside 1..4')
        if self.per_thread_copy_ahead < 0:
            raise CaseError('writer.per_thread_copy_ahead', 'is a number of bytes: must be >= 0')

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
    checkpoint_dir: object = ''
    deadlock: object = False
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
        _check_common(self.tree, self.source, self.target, self.training, self.steps_after, self.target_meta_init)
        _check_drop(self.drop)
        _check_frozen_in_optimizer(self.tree, self.frozen_in_optimizer)
        _check_schedule(self)
        self._check_options()
        self._check_async_options()
        if not self.use_collectives:
            self._check_rank_local()
        if self.torch_save_reader:
            self._check_torch_save_reader()
        entries = self.entries
        if not entries or len(set(entries)) != len(entries):
            raise CaseError('entries', f'{[e.value for e in entries]} must be non-empty and name each entry once')
        if DcpItem.APP in entries and (DcpItem.MODEL in entries or DcpItem.OPTIMIZER in entries):
            raise CaseError('entries', 'app holds the model and the optimizer: use it instead of model / optimizer')
        for i, e in enumerate(self.skip):
            if e not in entries:
                raise CaseError(f'skip[{i}]', f'{e.value!r} is not among the entries saved')
        if len(set(self.skip)) != len(self.skip) or len(self.skip) >= len(entries):
            raise CaseError('skip', 'must name each entry once and leave at least one entry to load')
        if self.module_stateful:
            if DcpItem.MODEL not in entries:
                raise CaseError('module_stateful', 'applies to the model entry, which is not saved')
            if self.save_full_state_dict or self.load_full_state_dict:
                raise CaseError('module_stateful', "a module's own state_dict has no full_state_dict option")
            if Wrapper.DDP in (self.source.wrapper, self.target.wrapper):
                raise CaseError('module_stateful', "DDP's own state_dict keys differ from the plain model's")
        if self.patched:
            if DcpItem.MODEL not in entries and DcpItem.OPTIMIZER not in entries:
                raise CaseError('patched', 'applies to the model and optimizer entries, neither of which is saved')
            if self.module_stateful:
                raise CaseError('patched', 'the module is its own Stateful either with its own or a patched state_dict')
        if self.drop and (DcpItem.MODEL not in entries or DcpItem.MODEL in self.skip or self.module_stateful or self.patched):
            raise CaseError('drop', 'leaving model keys out needs the model entry loaded as a state dict')
        if self.target_meta_init and (not any((e in entries and e not in self.skip for e in (DcpItem.MODEL, DcpItem.APP)))):
            raise CaseError('target_meta_init', 'a meta-device target must load its model')
        if self.drop and self.target_meta_init:
            raise CaseError('drop', 'a meta-device target has no values for the keys left out of the load')
        if (self.mode is DcpMode.ROUND_TRIP) == bool(self.checkpoint_dir):
            raise CaseError('checkpoint_dir', 'is required by save-only / load-only and refused by round trips')
        if self.deadlock and DcpItem.COUNTER not in entries:
            raise CaseError('deadlock', 'the deadlock is issued by the counter entry, which is not saved')
        if is_fsdp1(self.source) or is_fsdp1(self.target):
            self._check_fsdp1()
        self._check_saves()
        if self.no_dist:
            self._check_no_dist()

    @property
    def classic_fsdp1(self) -> bool:
        return (is_fsdp1(self.source) or is_fsdp1(self.target)) and (not self.patched) and (DcpItem.APP not in self.entries)

    def _check_fsdp1(self) -> None:
        if self.module_stateful:
            raise CaseError('module_stateful', "an FSDP1 model's own state_dict is the classic recipe's")
        if not self.classic_fsdp1:
            return
        if not (is_fsdp1(self.source) and is_fsdp1(self.target)):
            raise CaseError('target.wrapper', 'the classic FSDP1 recipe goes from an FSDP1 model to an FSDP1 model: use app or patched')
        if self.save_full_state_dict or self.load_full_state_dict:
            raise CaseError('save_full_state_dict', 'the classic FSDP1 recipe through DCP takes SHARDED_STATE_DICT')
        if self.drop:
            raise CaseError('drop', "FSDP1's own load is strict here: no keys are left out")

    def _check_saves(self) -> None:
        round_trip = self.mode is DcpMode.ROUND_TRIP
        if self.overwrite is not Overwrite.NONE:
            if not self.storage_objects:
                raise CaseError('overwrite', 'is a FileSystemWriter option: needs storage_objects')
            if not round_trip or self.async_saves or self.deadlock:
                raise CaseError('overwrite', "applies to a round trip's single save")
        if not 0 <= self.async_saves <= 3:
            raise CaseError('async_saves', f'async_saves={self.async_saves} is outside 0..3')
        if self.async_saves:
            if not self.async_save:
                raise CaseError('async_saves', 'counts async saves: needs async_save')
            if not round_trip or self.deadlock:
                raise CaseError('async_saves', 'applies to round trips')
            if self.async_saves > self.training.steps:
                raise CaseError('async_saves', f'{self.async_saves} saves a step apart need training.steps >= that')
            if self.steps_after < 1:
                raise CaseError('async_saves', 'the source trains on while the last save is in flight: steps_after >= 1')
        if self.cache_staged:
            if self.async_saves < 2:
                raise CaseError('cache_staged', 'the staging cache is reused by several async saves: async_saves >= 2')
            if not self.storage_objects:
                raise CaseError('cache_staged', 'is a FileSystemWriter option: needs storage_objects')

    def _check_options(self) -> None:
        if self.writer != WriterOptions() and (not self.storage_objects):
            raise CaseError('writer', "is FileSystemWriter's: needs storage_objects")
        if self.save_planner is not None and self.save_planner.dedup_save_to_lowest_rank and self.no_dist:
            raise CaseError('save_planner.dedup_save_to_lowest_rank', 'dedups items across the ranks of one save: not with no_dist')
        if self.own_group and (self.no_dist or self.mode is not DcpMode.ROUND_TRIP):
            raise CaseError('own_group', 'a process group of its own for a collective round trip')
        fsdp1 = is_fsdp1(self.source) or is_fsdp1(self.target)
        for name in ('absent', 'convert'):
            if not getattr(self, name):
                continue
            if self.mode is not DcpMode.ROUND_TRIP or self.no_dist or self.deadlock:
                raise CaseError(name, 'applies to a collective round trip')
            if fsdp1:
                raise CaseError(name, 'is drawn for fully_shard / replicate / DDP / plain models, no FSDP1 side')

    def _check_async_options(self) -> None:
        for name in ('stager', 'process_checkpointer'):
            if getattr(self, name) in (None, False):
                continue
            if not self.async_save:
                raise CaseError(name, 'is an async_save option: needs async_save')
            if self.cache_staged:
                raise CaseError(name, "not with cache_staged (the writer's own staging)")
        if self.process_checkpointer and (self.no_dist or self.deadlock):
            raise CaseError('process_checkpointer', 'runs the saves of every rank in a group of processes: not no_dist')
        if self.process_checkpointer and self.save_planner is not None and self.save_planner.dedup_save_to_lowest_rank:
            raise CaseError('process_checkpointer', 'the dedup check records the plan in the rank: not with dedup')

    def _check_rank_local(self) -> None:
        if self.mode is not DcpMode.ROUND_TRIP or self.no_dist or self.deadlock:
            raise CaseError('use_collectives', 'False is drawn for collective round trips')
        if is_fsdp1(self.source) or is_fsdp1(self.target):
            raise CaseError('use_collectives', 'False is drawn for fully_shard / replicate / DDP / plain models')
        for name in ('overwrite', 'absent', 'convert'):
            if getattr(self, name) not in (False, Overwrite.NONE):
                raise CaseError(name, 'reads or refuses through the global metadata: not with use_collectives=False')
        if self.save_planner is not None and self.save_planner.dedup_save_to_lowest_rank:
            raise CaseError('save_planner.dedup_save_to_lowest_rank', 'dedups across ranks: needs use_collectives')
        if self.save_full_state_dict and self.save_cpu_offload:
            raise CaseError('save_cpu_offload', 'a full state dict offloaded is on rank 0 only: other ranks save nothing')
        full_everywhere = self.save_full_state_dict or tensor_kind(self.source) == 'plain'
        if not full_everywhere and (self.source != self.target or self.load_full_state_dict):
            raise CaseError('target', 'a sharded save without collectives loads into the same layout only (each rank reads its own)')

    def _check_torch_save_reader(self) -> None:
        if set(self.entries) - {DcpItem.MODEL, DcpItem.EXTRA} or DcpItem.MODEL not in self.entries:
            raise CaseError('entries', 'BroadcastingTorchSaveReader loads tensors only: the model and extra')
        if not self.save_full_state_dict:
            raise CaseError('save_full_state_dict', 'the torch.save file holds the full state dict')
        if is_fsdp1(self.source) or is_fsdp1(self.target):
            raise CaseError('torch_save_reader', 'is drawn for fully_shard / replicate / DDP / plain models')
        plain = self.load_full_state_dict and (not self.load_cpu_offload) or (not self.load_full_state_dict and tensor_kind(self.target) == 'plain')
        if not plain:
            raise CaseError('load_full_state_dict', 'the reader broadcasts into plain tensors on every rank')
        changed = [name for name, on in (('async_save', self.async_save), ('storage_objects', self.storage_objects), ('no_dist', self.no_dist), ('convert', self.convert), ('absent', self.absent), ('own_group', self.own_group), ('deadlock', self.deadlock), ('save_planner', self.save_planner is not None), ('load_planner', self.load_planner is not None), ('use_collectives', not self.use_collectives), ('mode', self.mode is not DcpMode.ROUND_TRIP)) if on]
        if changed:
            raise CaseError(changed[0], 'the torch.save round trip takes no DCP save or load option')

    def _check_no_dist(self) -> None:
        if not (is_plain(self.source) and is_plain(self.target)):
            raise CaseError('no_dist', 'saves without collectives: a plain model on both sides, the same on every rank')
        if DcpItem.COUNTER in self.entries:
            raise CaseError('no_dist', 'the counter all-reduces: no_dist saves and loads run without collectives')
        if self.save_full_state_dict or self.load_full_state_dict or self.save_cpu_offload or self.load_cpu_offload:
            raise CaseError('no_dist', "a plain model's own state dict: no full_state_dict or cpu_offload")
        if self.async_saves or self.overwrite is not Overwrite.NONE or self.mode is not DcpMode.ROUND_TRIP:
            raise CaseError('no_dist', 'takes one save and a load in a round trip, each rank its own directory')

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

    def validate_for(self, world_size: int) -> None:
        for where, comp in (('source', self.source), ('target', self.target)):
            if not is_plain(comp):
                check_mesh(comp, world_size, where)
        if self.orders and len(self.orders) != world_size:
            raise CaseError('orders', f'has {len(self.orders)} orders for world_size={world_size}; give one per rank')
        n = len(self.entries)
        for r, order in enumerate(self.orders):
            if sorted(order) != list(range(n)):
                raise CaseError(f'orders[{r}]', f'{list(order)} is not a permutation of 0..{n - 1}')
        if len(set(self.orders)) > 1 and len(self.collective_entries()) > 1:
            raise CaseError('orders', 'per-rank orders allow at most one entry whose state_dict runs collectives (see collective_entries)')

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

def grad_scales(tree: ModuleTree, comp: Composition, world_size: int) -> dict[str, float]:
    scales = {path: layout.gradient_scale(path, world_size) for path in layout.paths}
    return {path: scale for path, scale in scales.items() if scale != 1.0}

def run_parity(case: Case, body: ParityBody, ctx: RankContext) -> dict[str, Any]:
    comp = body.composition
    keys = ('losses', 'params', 'grad_norms')
    if any((s.mixed_precision is not None for s in comp.shards)):
        precision = comp.uniform_precision()
        if precision is None or not mixed_precision_comparable(body.training):
            return composed
        return {**composed, 'ref': {k: reference[k] for k in keys if k in reference}}
    scales = grad_scales(body.tree, comp, ctx.world_size)
    return {**composed, 'ref': {k: reference[k] for k in keys if k in reference}}

def run_metamorphic(case: Case, body: MetamorphicBody, ctx: RankContext) -> dict[str, Any]:
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

def change_requires_grad(side: Side, step: int) -> None:
    changes = [c for c in side.schedule if c.step == step]
    if not changes:
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
    momentum = 0.5 if training.optimizer is Optimizer.SGD and training.momentum else 0.0
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
    return [step[0] for step in batches(case, replace(training, steps=steps), tree.width, ctx)]

def train_steps(side: Side, data: list[Any], ctx: RankContext) -> list[float]:
    assert side.opt is not None
    losses = []
    for x, y in data:
        change_requires_grad(side, side.step)
        side.step += 1
        loss = F.mse_loss(side.model(x).to(y.dtype), y)
        loss.backward()
        if side.plain:
            for p in side.model.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad /= ctx.world_size
        side.opt.step()
        side.opt.zero_grad(set_to_none=side.training.set_to_none)
        losses.append(loss.item())
    return losses

def _flat(t: Any) -> list[float]:
    from torch.distributed.tensor import DTensor
    if isinstance(t, DTensor):
        t = t.full_tensor()
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
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    return repr(value)

def observe_groups(side: Side) -> list[dict[str, Any]]:
    if side.opt is None:
        return []
    names = side.names()
    out = []
    for group in side.opt.param_groups:
        item = {k: _jsonable(v) for k, v in sorted(group.items()) if k != 'params'}
        item['params'] = [names.get(id(p), '?') for p in group['params']]
        out.append(item)
    return out

def observe_optimizer(side: Side) -> dict[str, dict[str, list[float]]]:
    if side.opt is None:
        return {}
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
    gen = torch.Generator().manual_seed(case.seed + 1)
    x = torch.randn(PROBE_ROWS, tree.width, generator=gen, dtype=TORCH_DTYPES[side.training.dtype]).to(ctx.device)
    seed_segment(case, ctx, 99)
    with torch.no_grad():
        out = _flat(side.model(x))
    reshard(side.model)
    return out

def reshard(model: nn.Module) -> None:
    from torch.distributed.fsdp import FSDPModule
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()

def observe(side: Side, case: Case, tree: ModuleTree, ctx: RankContext, *, model: bool=True) -> dict[str, Any]:
    obs = {'groups': observe_groups(side)}
    if model:
        params = observe_model(side)
        optim = observe_optimizer(side)
        out = probe(side, case, tree, ctx)
        if side.fsdp1:
            obs['optimizer_local'] = optim
        if ctx.rank == 0:
            obs.update(model=params, probe=out)
            if not side.fsdp1:
                obs['optimizer'] = optim
    return obs

def model_keys(side: Side) -> list[str]:
    return sorted((clean_name(k) for k in side.model.state_dict()))

def dropped_keys(side: Side, drop: tuple[int, ...]) -> list[str]:
    if not drop:
        return []
    keys = model_keys(side)
    return sorted({keys[i % len(keys)] for i in drop}) if keys else []

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
    if not src.fsdp1:
        taken = observe_state_dict_optimizer(nested_osd)
        if ctx.rank == 0:
            obs['taken_optimizer'] = taken
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
    losses_src, final_src = source_done if source_done is not None else resume_source(case, src, data, ctx)
    obs['losses_source'] = losses_src
    seed_segment(case, ctx, 1)
    obs['losses_target'] = train_steps(tgt, data, ctx)
    final_tgt = observe_model(tgt)
    if ctx.rank == 0:
        obs['final_source'], obs['final_target'] = (final_src, final_tgt)
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
            print(f'REPRODUCED crash:state_dict:signal: rank {os.environ["RANK"]} died: {found}', flush=True)
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
