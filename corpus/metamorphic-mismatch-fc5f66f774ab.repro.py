#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=c810a4073b4aafa8 sources=0eec14d08bf36b49 seconds=20.4
"""Reproduces shardfuzz corpus entry metamorphic-mismatch-fc5f66f774ab.json: mismatch:metamorphic@fsdp1:unfrozen-frozen-unit

FSDP1 NO_SHARD auto-wrapping a block whose parameters are all frozen, one of them unfrozen
later: after the first backward the unit leaves its parameters registered as plain tensor views,
so requires_grad_(True) on the Parameter the optimizer holds never reaches forward and the leaf
is never trained (first found on 2 H200s, NCCL, torch 2.11; the same on CPU, torch 2.13).
docs/known_bugs.md. (rank 0 gradient norm at step 1 is 0.8571569304369612, expected
0.011955796740949154)

Known torch bug: FSDP1 NO_SHARD, a unit all frozen at wrapping: a leaf unfrozen later never
trains; upstream: https://github.com/pytorch/pytorch/issues/85831.

Run it with

    torchrun --nproc-per-node 2 THIS_FILE.py [--timeout SECONDS]

(or `python THIS_FILE.py`, which starts torchrun itself; gloo on CPU by default, `--backend nccl` for
one GPU per rank). Exit status: 1 if the failure reproduces (the same signature, or for a known
bug the same bug), 0 if not, 2 for bad input.

Every rank runs the case below (CASE) with the code shardfuzz's ranks run, reduced to what this
failure needs (SOURCES, imported from memory): only torch needs to be installed. Rank 0 judges
the case with the property's own judge and prints the verdict.
"""

import importlib.abc
import importlib.util
import linecache
import sys

CASE = """{
 "body": {
  "composition": {
   "auto_wrap": false,
   "checkpoint_first": false,
   "checkpoint_options": {
    "context_fn": "none",
    "debug": false,
    "determinism_check": null,
    "early_stop": null,
    "preserve_rng_state": true
   },
   "checkpoints": [],
   "find_unused": false,
   "knobs": {
    "all_reduce_hook_scale": null,
    "backward_prefetch": 0,
    "explicit_unshard": false,
    "force_sum_reduction": false,
    "forward_prefetch": 0,
    "gradient_divide_factor": null,
    "late_reshard_after_forward": null,
    "reshard_after_backward_last": false
   },
   "mesh": [],
   "meta_init": false,
   "replicate_options": {
    "batched_grad_copy": false,
    "bucket_cap_mb": null,
    "bucket_cap_mb_list": [],
    "delay_all_reduce": false,
    "device_id": false,
    "dim": 0,
    "forward_sync_buffers": null,
    "gradient_as_bucket_view": false,
    "group": "default",
    "ignored_modules": [],
    "init_sync": true,
    "skip_all_reduce_unused_params": false,
    "static_graph": false
   },
   "replicates": [],
   "shards": [
    {
     "group": [],
     "mixed_precision": null,
     "offload": false,
     "path": "",
     "reshard_after_forward": false,
     "shard_dim": 0
    }
   ],
   "tp": [],
   "tp_size": 1,
   "wrapper": "none"
  },
  "kind": "metamorphic",
  "training": {
   "accum_sync": "always",
   "batch_per_rank": 1,
   "compile": "none",
   "dtype": "float32",
   "eps": 0.0001,
   "foreach": null,
   "grad_accum": 1,
   "lr": 0.01,
   "momentum": 0.0,
   "optimizer": "sgd",
   "param_groups": 1,
   "same_input": false,
   "set_to_none": false,
   "skips": [],
   "steps": 2,
   "unfreeze": [
    {
     "path": "0",
     "step": 1
    }
   ]
  },
  "tree": {
   "root": {
    "buffer": false,
    "children": [
     {
      "bias": false,
      "frozen": true,
      "kind": "conv1d"
     },
     {
      "buffer": false,
      "children": [
       {
        "bias": false,
        "frozen": false,
        "kind": "conv1d"
       }
      ],
      "residual": false,
      "scale": false
     }
    ],
    "residual": false,
    "scale": false
   },
   "width": 1
  },
  "variant": {
   "auto_wrap": true,
   "checkpoint_first": true,
   "checkpoint_options": {
    "context_fn": "none",
    "debug": false,
    "determinism_check": null,
    "early_stop": null,
    "preserve_rng_state": true
   },
   "checkpoints": [],
   "find_unused": false,
   "knobs": {
    "all_reduce_hook_scale": null,
    "backward_prefetch": 0,
    "explicit_unshard": false,
    "force_sum_reduction": false,
    "forward_prefetch": 0,
    "gradient_divide_factor": null,
    "late_reshard_after_forward": null,
    "reshard_after_backward_last": false
   },
   "mesh": [],
   "meta_init": false,
   "replicate_options": {
    "batched_grad_copy": false,
    "bucket_cap_mb": null,
    "bucket_cap_mb_list": [],
    "delay_all_reduce": false,
    "device_id": false,
    "dim": 0,
    "forward_sync_buffers": null,
    "gradient_as_bucket_view": false,
    "group": "default",
    "ignored_modules": [],
    "init_sync": true,
    "skip_all_reduce_unused_params": false,
    "static_graph": false
   },
   "replicates": [],
   "shards": [],
   "tp": [],
   "tp_size": 1,
   "wrapper": "fsdp1_no_shard"
  }
 },
 "property": "metamorphic",
 "schema": 1,
 "seed": 0,
 "world_size": 2
}
"""

EXPECTED = {'judge': 'fuzz.properties.parity',
 'known': True,
 'property': 'metamorphic',
 'signature': 'mismatch:metamorphic@fsdp1:unfrozen-frozen-unit',
 'signatures': ['mismatch:metamorphic@fsdp1:unfrozen-frozen-unit'],
 'world_size': 2}

#: Where tracebacks say the carried modules are.
PREFIX = "shardfuzz/"

class CarriedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports shardfuzz's modules from SOURCES, and refuses any other of shardfuzz."""

    def find_spec(self, name, path=None, target=None):
        if name != "fuzz" and not name.startswith("fuzz."):
            return None
        file = MODULES.get(name)
        if file is None:
            raise ModuleNotFoundError(f"{name} is not carried by this script", name=name)
        return importlib.util.spec_from_loader(name, self, origin=file, is_package=file.endswith("/__init__.py"))

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        file = module.__spec__.origin
        source = SOURCES[file[len(PREFIX) :]]
        module.__file__ = file
        linecache.cache[file] = (len(source), None, source.splitlines(True), file)
        exec(compile(source, file, "exec", dont_inherit=True), module.__dict__)


def main():
    sys.meta_path.insert(0, CarriedModules())
    from fuzz.repro.runtime import main as run

    return run(CASE, EXPECTED)


SOURCES = {
    "fuzz/__init__.py": """from __future__ import annotations
import importlib
from typing import Any

def __getattr__(name):
    raise AttributeError(f"module 'fuzz' has no attribute {name!r}")
""",
    "fuzz/_protocol.py": """from __future__ import annotations
import json
from dataclasses import dataclass, field
from typing import Any, Union

def decode(line):
    ...
""",
    "fuzz/_rank/__init__.py": """
""",
    "fuzz/_rank/compose.py": """from __future__ import annotations
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
import torch
from torch import nn
from fuzz._rank.context import RankContext
from fuzz._rank.knobs import KnobState
from fuzz._rank.models import build_model
from fuzz._rank.options import checkpoint_kwargs
from fuzz.model import Composition, Dtype, MixedPrecision, ModuleTree, ShardSpec, Wrapper, is_ancestor
TORCH_DTYPES = {Dtype.FLOAT32: torch.float32, Dtype.FLOAT64: torch.float64, Dtype.BFLOAT16: torch.bfloat16, Dtype.FLOAT16: torch.float16}
_WRAPPER_PREFIXES = ('_fsdp_wrapped_module.', 'module.', '_checkpoint_wrapped_module.')

def clean_name(name):
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, '')
    return name

def mesh_for(comp, ctx):
    return ctx.mesh((ctx.world_size,), ('shard',))

def apply_fully_shard(model, spec, mesh):
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
    kwargs: dict[str, Any] = {'mesh': mesh, 'reshard_after_forward': spec.reshard_after_forward}
    modules = [model.get_submodule(p) for p in spec.paths]
    fully_shard(modules if spec.group else modules[0], **kwargs)

@dataclass
class Composed:
    model: nn.Module
    fsdp_roots: list[nn.Module] = field(default_factory=list)
    wrapper: Wrapper = Wrapper.NONE
    param_names: list[str] = field(default_factory=list)
    knobs: KnobState | None = None

    def no_sync(self):
        ...

    def set_sync(self, requires_gradient_sync=True, requires_all_reduce=True):
        for m in self.fsdp_roots:
            m.set_requires_gradient_sync(requires_gradient_sync)
            m.set_requires_all_reduce(requires_all_reduce)

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
        out = {}
        for n, p in self.model.named_parameters():
            out[clean_name(n)] = (p.full_tensor() if isinstance(p, DTensor) else p).detach()
        yield out

def compose(model, comp, ctx, tree=None):
    from torch.distributed._composable import checkpoint, replicate
    ckpt_kwargs = checkpoint_kwargs(comp.checkpoint_options)
    if comp.wrapper is not Wrapper.NONE:
        names = [n for n, _ in model.named_parameters()]
        return Composed(model=_wrap(model, comp, ctx), wrapper=comp.wrapper, param_names=names)
    mesh = mesh_for(comp, ctx)
    specs = {s.path: s for s in comp.shards}
    for api, path in comp.steps():
        if api == 'fully_shard':
            apply_fully_shard(model, specs[path], mesh)
    sharded = comp.sharded_paths
    tops = [p for p in sharded if not any((is_ancestor(q, p) for q in sharded))]
    return Composed(model=model, fsdp_roots=[model.get_submodule(p) for p in tops])

def build_composed(tree, comp, dtype, ctx, *, seed):
    torch.manual_seed(seed)
    if not comp.meta_init:
        model = build_model(tree, ctx.device).to(dtype)
        return (model, _with_knobs(model, compose(model, comp, ctx, tree), comp, tree))

def _with_knobs(model, composed, comp, tree):
    return composed

def _wrap(model, comp, ctx):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    from fuzz._rank.models import TreeBlock
    strategy = {Wrapper.FSDP1_FULL_SHARD: ShardingStrategy.FULL_SHARD, Wrapper.FSDP1_SHARD_GRAD_OP: ShardingStrategy.SHARD_GRAD_OP, Wrapper.FSDP1_NO_SHARD: ShardingStrategy.NO_SHARD, Wrapper.FSDP1_HYBRID_SHARD: ShardingStrategy.HYBRID_SHARD}[comp.wrapper]
    kwargs: dict[str, Any] = {'sharding_strategy': strategy, 'device_id': ctx.device, 'use_orig_params': True}
    if comp.auto_wrap:
        kwargs['auto_wrap_policy'] = ModuleWrapPolicy({TreeBlock})
    return FSDP(model, **kwargs)
""",
    "fuzz/_rank/context.py": """from __future__ import annotations
import gc
from dataclasses import dataclass, field
from typing import Any
import torch
FULL_GC_EVERY = 50

@dataclass
class RankContext:
    rank: int
    world_size: int
    device: torch.device
    backend: str
    _meshes: dict[tuple[tuple[int, ...], tuple[str, ...]], Any] = field(default_factory=dict)

    def mesh(self, shape, names):
        from torch.distributed.device_mesh import init_device_mesh
        key = (shape, names)
        if key not in self._meshes:
            self._meshes[key] = init_device_mesh(self.device.type, shape, mesh_dim_names=names)
        return self._meshes[key]
    _cases: int = 0
    extra_groups: list[Any] = field(default_factory=list)
    _groups: dict[str, Any] = field(default_factory=dict)

    def group(self, name):
        ...

    def _check_in_step(self):
        import torch.distributed as dist
        groups: list[Any] = [None]
        for mesh in self._meshes.values():
            groups.extend(mesh.get_all_groups())
        groups.extend(self.extra_groups)
        seen: set[int] = set()
        mine = torch.tensor([self._cases, self.rank], dtype=torch.int64)
        for group in groups:
            key = id(group if group is not None else dist.group.WORLD)
            if key in seen or not _has_cpu_backend(group):
                continue
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

def _has_cpu_backend(group):
    import torch.distributed as dist
    pg: Any = group if group is not None else dist.group.WORLD
    pg._get_backend(torch.device('cpu'))
    return True
""",
    "fuzz/_rank/knobs.py": """from __future__ import annotations
from typing import Any
import torch
from torch import nn
from fuzz.model import Composition, Knobs, Layout, ModuleTree, ShardSpec, contains, is_ancestor

def fsdp_sharded(p):
    from torch.distributed.tensor import DTensor
    return isinstance(p, DTensor) and 'shard' in (p.device_mesh.mesh_dim_names or ('shard',))

class KnobState:

    def __init__(self, model, comp, tree, roots):
        ...

    def _prefetch(self, units):
        ...

    def _hook(self, spec, scale):
        ...

    def before_microbatch(self, first, last):
        ...

    def _own_params(self, root):
        ...

    def _check_unshard_reshard(self):
        ...
""",
    "fuzz/_rank/models.py": """from __future__ import annotations
import torch
from torch import nn
from fuzz.model import Leaf, LeafKind, ModuleTree, Node

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

class PointwiseConv1d(nn.Conv1d):

    def forward(self, x):
        return super().forward(x.unsqueeze(-1)).squeeze(-1)

def build_leaf(leaf, width):
    module = _build_leaf(leaf, width)
    if leaf.frozen:
        module.requires_grad_(False)
    return module

def _build_leaf(leaf, width):
    if leaf.kind is LeafKind.CONV1D:
        return PointwiseConv1d(width, width, kernel_size=1, bias=leaf.bias)

def build_node(node, width):
    if isinstance(node, Leaf):
        return build_leaf(node, width)
    return TreeBlock([build_node(c, width) for c in node.children], node.residual, width, node.scale, node.buffer)

def build_model(tree, device):
    with torch.device(device):
        return build_node(tree.root, tree.width)

def tree_blocks(model):
    return {'.'.join((c for c in name.split('.') if c.isdigit())): m for name, m in model.named_modules() if isinstance(m, TreeBlock)}

def set_skipped(blocks, paths):
    skipped: dict[str, set[str]] = {p: set() for p in blocks}
    for p, block in blocks.items():
        pass
""",
    "fuzz/_rank/options.py": """from __future__ import annotations
from typing import Any
import torch
from torch import nn
from fuzz._rank.context import RankContext
from fuzz.model import CheckpointOptions, Composition, ContextFn, Layout, ModuleTree, ReplicateGroup

def checkpoint_kwargs(opts):
    kwargs: dict[str, Any] = {}
    if not opts.is_set:
        return kwargs
""",
    "fuzz/_rank/parity.py": """from __future__ import annotations
import copy
from typing import Any
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from fuzz._rank.compose import TORCH_DTYPES, Composed, build_composed, clean_name
from fuzz._rank.compose import apply_fully_shard as apply_fully_shard
from fuzz._rank.context import RankContext
from fuzz._rank.knobs import fsdp_sharded
from fuzz._rank.models import build_model, set_skipped, tree_blocks
from fuzz.model import AccumSync, Case, Compile, Composition, Layout, MetamorphicBody, MixedPrecision, ModuleTree, Optimizer, ParityBody, Training, contains, is_ancestor

def make_optimizer(params, training, later=()):
    held = {id(p) for p in later}
    params = [p for p in params if p.requires_grad or id(p) in held]
    groups: Any = params
    foreach = training.foreach
    if training.optimizer is Optimizer.SGD:
        return torch.optim.SGD(groups, lr=training.lr, momentum=training.momentum, foreach=foreach)

def full_parameters(model):
    ...

def batches(case, training, width, ctx, tp_size=1):
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

def _seed_for_run(case, ctx, tp_size=1):
    torch.manual_seed((case.seed * 7919 + ctx.rank // tp_size + 1) % 2 ** 63)

class _Contracts:

    def __init__(self, model, comp):
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

    def _on_output(self, path):

        def hook(module, args, output):
            if isinstance(output, torch.Tensor):
                self.output_dtypes.setdefault(path, str(output.dtype).removeprefix('torch.'))
        return hook

    def _on_leaf(self, name):

        def hook(module, args):
            p = next(module.parameters(recurse=False))
            self.leaf_dtypes.setdefault(name, str(p.dtype).removeprefix('torch.'))
        return hook

    def after_forward(self, skipped):
        for h in self.handles:
            h.remove()
        sharded = self.comp.sharded_paths + list(self.comp.replicates)
        state: dict[str, list[bool]] = {}
        for spec in self.comp.shards:
            flags: list[bool] = []
            for path in spec.paths:
                for sub, _ in iter_paths_of(self.model, path):
                    mod = self.model.get_submodule(sub)
                    flags += [fsdp_sharded(p) for p in mod.parameters(recurse=False)]
            state[spec.path] = flags
        return {'sharded_after_forward': state, 'leaf_dtypes': self.leaf_dtypes, 'output_dtypes': self.output_dtypes}

def iter_paths_of(model, path):
    root = model.get_submodule(path)
    return [(f'{path}.{n}' if path and n else n or path, m) for n, m in root.named_modules()]

def replicate_contract(model, comp, skipped=None):
    from torch.distributed._composable import replicate
    out = {}
    return out

def train(case, tree, training, comp, ctx, tp_size=1, grad_scales=None, precision=None, local=frozenset()):
    dtype = TORCH_DTYPES[training.dtype]
    if comp is not None:
        model, composed = build_composed(tree, comp, dtype, ctx, seed=case.seed)
    contracts = _Contracts(model, comp) if comp is not None else None
    obs: dict[str, Any] = {}
    blocks = tree_blocks(composed.model)
    later = _unfrozen_later(composed.model, training)
    opt = make_optimizer(composed.model.parameters(), training, [p for ps in later.values() for p in ps])
    forward = _compiled(composed.model, training) if comp is not None else composed.model
    _seed_for_run(case, ctx, tp_size)
    losses: list[list[float]] = []
    params_per_step: list[dict[str, list[float]]] = []
    grad_norms: list[float] = []
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
            with ctx_mgr:
                out = forward(x)
                if contracts is not None and comp is not None:
                    obs['contracts'] = contracts.after_forward(skipped)
                    obs['contracts']['output_dtype'] = str(out.dtype).removeprefix('torch.')
                    obs['contracts']['replicate_params'] = replicate_contract(model, comp, skipped)
                    contracts = None
                loss = F.mse_loss(out.to(y.dtype), y)
                loss.backward()
            step_losses.append(loss.item())
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

def _unfrozen_later(model, training):
    out: dict[str, list[nn.Parameter]] = {u.path: [] for u in training.unfreeze}
    for name, p in model.named_parameters():
        owner = '.'.join((c for c in clean_name(name).split('.')[:-1] if c.isdigit()))
        if owner in out:
            out[owner].append(p)
    return out

def _compiled(model, training):
    if training.compile is Compile.NONE:
        return model

class _null:

    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return None

def _grad_norm(composed):
    from torch.distributed.tensor import DTensor
    total = torch.zeros((), dtype=torch.float64)
    for p in composed.model.parameters():
        if p.grad is not None:
            g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
            total += g.double().pow(2).sum().cpu()
    return float(total.sqrt())

def _local_of(tree, comp):
    if comp is None or not comp.replicate_options.ignored_modules:
        return frozenset()

def _local_replicated(model, local=frozenset()):
    from torch.distributed.tensor import DTensor
    return {n: p.detach().double().cpu().flatten().tolist() for n, p in model.named_parameters() if not isinstance(p, DTensor) and (not n.startswith('_fsdp_wrapped_module')) and ('_fsdp' not in n) and (clean_name(n).rpartition('.')[0] not in local)}

def run_parity(case, body, ctx):
    ...

def run_metamorphic(case, body, ctx):
    first = train(case, body.tree, body.training, body.composition, ctx)
    second = train(case, body.tree, body.training, body.variant, ctx)
    keys = ('losses', 'params', 'grad_norms', 'knob_problems')
    return {**first, 'ref': {k: second[k] for k in keys if k in second}}
""",
    "fuzz/_rank/programs.py": """from __future__ import annotations
import importlib
import os
import signal
import time
from typing import Any
import torch
import torch.distributed as dist
from fuzz._rank.context import RankContext
from fuzz.model import Case

def run_case(case, ctx):
    module, function = case.body.PROGRAM.split(':')
    program = getattr(importlib.import_module(module), function)
    result: dict[str, Any] = program(case, case.body, ctx)
    return result
""",
    "fuzz/_rank/worker.py": """from __future__ import annotations
import faulthandler
import importlib
import os
import signal
import sys
import threading
import time
import traceback
from datetime import timedelta
from typing import Any
from fuzz._protocol import decode
PROCESS_GROUP_TIMEOUT = timedelta(minutes=30)
SAMPLE_AFTER_S = 2.0
SAMPLE_EVERY_S = 1.0

class _Sampler(threading.Thread):

    def __init__(self, path):
        super().__init__(name='shardfuzz-sampler', daemon=True)
        self.path = path
        self.main = threading.main_thread().ident
        self.case: tuple[int, float] | None = None

    def run(self):
        while True:
            time.sleep(SAMPLE_EVERY_S)
            current = self.case
            if current is None or time.monotonic() - current[1] < SAMPLE_AFTER_S:
                continue
            frame = sys._current_frames().get(self.main) if self.main is not None else None
            if frame is None:
                continue
            text = f'{current[0]}\\n' + ''.join(traceback.format_stack(frame))
            del frame
            if self.case is not current:
                continue
            try:
                with open(self.path + '.tmp', 'w', encoding='utf-8') as f:
                    f.write(text)
                os.replace(self.path + '.tmp', self.path)
            except OSError:
                pass

def main():
    ...
if __name__ == '__main__':
    sys.exit(main())
""",
    "fuzz/known.py": """from __future__ import annotations
from dataclasses import dataclass
from fuzz.model import PARAM_LEAVES, AccumSync, Block, Body, Case, Compile, Composition, Dtype, Layout, Leaf, ModuleTree, Optimizer, Training, Wrapper, fsdp1_gathers, is_fsdp1, owns_params
from fuzz.verdict import Stall
KNOWN_BUG_ODDS = 16
KNOWN_HANG_ODDS = 64
NONE_FOUND = 'none found'

@dataclass(frozen=True)
class KnownBug:
    id: str
    title: str
    symptoms: frozenset[str] = frozenset({'exception'})
    upstream: str = NONE_FOUND
    relation: str = ''
    state: str = ''
    ends_ranks: bool = True
    odds: int = KNOWN_BUG_ODDS
    tag: str = ''
    see_also: tuple[str, ...] = ()
    docs: str = 'docs/known_bugs.md'
    fixed_in: str = ''
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

def present(bug, torch_version):
    ...

def get(bug_id):
    ...

def shard1(comp):
    return bool(comp.mesh) and comp.mesh[1] == 1

def frozen_int_reshard_unit(tree, comp):
    layout = Layout(tree, comp)
    return any((u.api == 'fully_shard' and (not isinstance(comp.shards[u.index].reshard_after_forward, bool)) and layout.frozen_only(u) for u in layout.units))

def unfrozen_unresharded_unit(tree, comp, training):
    unfrozen = {u.path for u in training.unfreeze}
    return any((p in unfrozen for p in unresharded_frozen(tree, comp)))

def unresharded_frozen(tree, comp):
    layout = Layout(tree, comp)
    shards = [u for u in layout.units if u.api == 'fully_shard']
    out: list[str] = []
    for top in shards:
        subtree = [p for p, n in layout.paths.items() if top.covers(p) and owns_params(n)]
        if not subtree or not all((_frozen_leaf(layout.paths[p]) for p in subtree)):
            continue
    return out

def fsdp1_unfrozen_in_frozen_unit(tree, comp, training, world_size=2):
    unsharded = is_fsdp1(comp) and (not fsdp1_gathers(comp, world_size))
    paths = tree.paths()
    return any((_frozen_fsdp1_unit(paths[later.path.rpartition('.')[0]]) for later in training.unfreeze))

def mismatch_tags(comp, tree=None, training=None, world_size=2):
    tags = FSDP1_HSDP_SHARD1.tag if shard1(comp) else ''
    if tree is not None and training is not None:
        if fsdp1_unfrozen_in_frozen_unit(tree, comp, training, world_size):
            tags += FSDP1_UNFROZEN_FROZEN_UNIT.tag
    return tags

def _frozen_leaf(node):
    return isinstance(node, Leaf) and node.frozen

def _frozen_fsdp1_unit(node):
    leaves = [c for c in node.children if isinstance(c, Leaf) and c.kind in PARAM_LEAVES]
    return bool(leaves) and all((c.frozen for c in leaves))

def ends_ranks(case):
    ...

def rank0_alone_in_broadcast(stacks):
    ...
ALONE_IN_BROADCAST_STALL = Stall(name='rank 0 alone in _broadcast_state_dict', deadlocked=rank0_alone_in_broadcast, after=10.0, hold=3.0)
""",
    "fuzz/model/__init__.py": """from fuzz.model.case import Body, Case, MetamorphicBody, ParityBody
from fuzz.model.codec import case_from_json
from fuzz.model.composition import CheckpointOptions, Composition, ContextFn, DeterminismCheck, Knobs, MixedPrecision, ReplicateGroup, ReplicateOptions, ShardSpec, TpPair, Wrapper
from fuzz.model.layout import Layout, Unit
from fuzz.model.rules import check_composition, check_mesh, check_training
from fuzz.model.state import dcp_root, fsdp1_gathers, is_fsdp1
from fuzz.model.training import AccumSync, Compile, Optimizer, Skip, Training, Unfreeze
from fuzz.model.tree import PARAM_LEAVES, Block, Dtype, Leaf, LeafKind, ModuleTree, Node, contains, is_ancestor, iter_paths, owns_params, param_names
""",
    "fuzz/model/case.py": """from __future__ import annotations
import builtins
import enum
from dataclasses import dataclass, field
from typing import Any, ClassVar
from fuzz.model.composition import Composition
from fuzz.model.rules import check_composition, check_mesh, check_training
from fuzz.model.training import AccumSync, Training
from fuzz.model.tree import Block, Leaf, LeafKind, ModuleTree, iter_paths

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
BODY_MODULES: tuple[str, ...] = ('fuzz.model.state',)

@dataclass(frozen=True)
class ParityBody(Body):
    KIND: ClassVar[str] = 'parity'
    PROGRAM: ClassVar[str] = 'fuzz._rank.parity:run_parity'
    tree: ModuleTree
    composition: Composition
    training: Training = field(default_factory=Training)

    @property
    def size(self):
        ...

    def validate_for(self, world_size):
        ...

@dataclass(frozen=True)
class MetamorphicBody(Body):
    KIND: ClassVar[str] = 'metamorphic'
    PROGRAM: ClassVar[str] = 'fuzz._rank.parity:run_metamorphic'
    tree: ModuleTree
    composition: Composition
    variant: Composition
    training: Training = field(default_factory=Training)

    def __post_init__(self):
        check_composition(self.tree, self.composition)
        check_composition(self.tree, self.variant, 'variant')
        check_training(self.tree, (self.composition, self.variant), self.training)

    @property
    def size(self):
        ...

    def validate_for(self, world_size):
        check_mesh(self.composition, world_size)
        check_mesh(self.variant, world_size, 'variant')

@dataclass(frozen=True)
class Case:
    property: str
    world_size: int
    seed: int
    body: Body

    def __post_init__(self):
        self.body.validate_for(self.world_size)

    @builtins.property
    def size(self):
        ...
""",
    "fuzz/model/codec.py": """from __future__ import annotations
import dataclasses
import enum
import importlib
import json
import types
import typing
from typing import Any, Union
from fuzz.model.case import BODY_MODULES, Body, Case
from fuzz.model.tree import Block, Leaf

def case_from_json(data, path='case'):
    schema = data.get('schema')
    body = {k: v for k, v in data.items() if k != 'schema'}
    result = _decode(Case, body, path)
    assert isinstance(result, Case)
    return result

def _decode(tp, value, path):
    if tp is Body:
        for module in BODY_MODULES:
            importlib.import_module(module)
        kinds = Body.registry
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
        for option in options:
            if option is type(None) and value is None:
                return None
    if origin is tuple:
        item_tp, _ellipsis = typing.get_args(tp)
        return tuple((_decode(item_tp, v, f'{path}[{i}]') for i, v in enumerate(value)))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(value)
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        fields = {f.name: f for f in dataclasses.fields(tp)}
        tag = {'kind'} if getattr(tp, 'KIND', None) else set()
        unknown = set(value) - set(fields) - tag
        kwargs = {}
        for name, f in fields.items():
            if name in value:
                kwargs[name] = _decode(hints[name], value[name], f'{path}.{name}')
        return typing.cast(Any, tp)(**kwargs)
    if tp is float:
        return float(value)
    if tp is int:
        return value
    if tp is bool:
        return value
    if tp is str:
        return value
""",
    "fuzz/model/composition.py": """from __future__ import annotations
import enum
from dataclasses import dataclass, field, fields
from fuzz.model.tree import Dtype, contains

class Wrapper(str, enum.Enum):
    NONE = 'none'
    DDP = 'ddp'
    FSDP1_FULL_SHARD = 'fsdp1_full_shard'
    FSDP1_SHARD_GRAD_OP = 'fsdp1_shard_grad_op'
    FSDP1_NO_SHARD = 'fsdp1_no_shard'
    FSDP1_HYBRID_SHARD = 'fsdp1_hybrid_shard'

@dataclass(frozen=True)
class MixedPrecision:
    param_dtype: Dtype | None = None
    reduce_dtype: Dtype | None = None
    output_dtype: Dtype | None = None
    cast_forward_inputs: bool = True

@dataclass(frozen=True)
class ShardSpec:
    path: str
    reshard_after_forward: bool | int = True
    shard_dim: int = 0
    group: tuple[str, ...] = ()
    mixed_precision: MixedPrecision | None = None
    offload: bool = False

    def __post_init__(self):
        raf = self.reshard_after_forward

    @property
    def paths(self):
        return (self.path, *self.group)

@dataclass(frozen=True)
class TpPair:
    colwise: str
    rowwise: str

@dataclass(frozen=True)
class Knobs:
    forward_prefetch: int = 0
    backward_prefetch: int = 0
    reshard_after_backward_last: bool = False
    late_reshard_after_forward: bool | None = None
    explicit_unshard: bool = False
    all_reduce_hook_scale: float | None = None
    gradient_divide_factor: float | None = None
    force_sum_reduction: bool = False

    def __post_init__(self):
        for name in ('forward_prefetch', 'backward_prefetch'):
            pass

    @property
    def is_set(self):
        return self != Knobs()

    def names(self):
        ...

class ReplicateGroup(str, enum.Enum):
    DEFAULT = 'default'
    PROCESS_GROUP = 'process_group'
    DEVICE_MESH = 'device_mesh'

@dataclass(frozen=True)
class ReplicateOptions:
    bucket_cap_mb: float | None = None
    bucket_cap_mb_list: tuple[float, ...] = ()
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    init_sync: bool = True
    dim: int = 0
    group: ReplicateGroup = ReplicateGroup.DEFAULT
    device_id: bool = False
    ignored_modules: tuple[str, ...] = ()
    forward_sync_buffers: bool | None = None
    batched_grad_copy: bool = False
    skip_all_reduce_unused_params: bool = False
    delay_all_reduce: bool = False

    def __post_init__(self):
        caps = (*(() if self.bucket_cap_mb is None else (self.bucket_cap_mb,)), *self.bucket_cap_mb_list)

    @property
    def is_set(self):
        return self != ReplicateOptions()

    def names(self):
        ...

class ContextFn(str, enum.Enum):
    NONE = 'none'
    SAVE_MATMULS = 'save_matmuls'
    SAVE_MATMULS_LIST = 'save_matmuls_list'

class DeterminismCheck(str, enum.Enum):
    DEFAULT = 'default'
    NONE = 'none'

@dataclass(frozen=True)
class CheckpointOptions:
    preserve_rng_state: bool = True
    context_fn: ContextFn = ContextFn.NONE
    determinism_check: DeterminismCheck | None = None
    debug: bool = False
    early_stop: bool | None = None

    @property
    def is_set(self):
        return self != CheckpointOptions()

    def names(self):
        ...

@dataclass(frozen=True)
class Composition:
    shards: tuple[ShardSpec, ...] = ()
    replicates: tuple[str, ...] = ()
    checkpoints: tuple[str, ...] = ()
    checkpoint_first: bool = True
    mesh: tuple[int, ...] = ()
    wrapper: Wrapper = Wrapper.NONE
    auto_wrap: bool = False
    meta_init: bool = False
    tp: tuple[TpPair, ...] = ()
    tp_size: int = 1
    find_unused: bool = False
    knobs: Knobs = field(default_factory=Knobs)
    replicate_options: ReplicateOptions = field(default_factory=ReplicateOptions)
    checkpoint_options: CheckpointOptions = field(default_factory=CheckpointOptions)

    def __post_init__(self):
        pass

    def uniform_precision(self):
        ...

    def reshard_after_forward(self, spec):
        ...

    @property
    def sharded_paths(self):
        return [p for spec in self.shards for p in spec.paths]

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
""",
    "fuzz/model/layout.py": """from __future__ import annotations
from dataclasses import dataclass
from functools import cached_property
from fuzz.model.composition import Composition
from fuzz.model.tree import Leaf, ModuleTree, Node, contains, is_ancestor, owns_params, param_names

@dataclass(frozen=True)
class Unit:
    api: str
    index: int
    members: tuple[str, ...]

    def covers(self, path):
        return any((contains(m, path) for m in self.members))

@dataclass(frozen=True)
class Layout:
    tree: ModuleTree
    comp: Composition

    @cached_property
    def paths(self):
        return self.tree.paths()

    @cached_property
    def units(self):
        shards = tuple((Unit('fully_shard', i, spec.paths) for i, spec in enumerate(self.comp.shards)))
        return shards + tuple((Unit('replicate', i, (p,)) for i, p in enumerate(self.comp.replicates)))

    @cached_property
    def member_paths(self):
        return tuple((m for u in self.units for m in u.members))

    def member_of(self, path, api=None):
        best: str | None = None
        members = self.member_paths if api is None else [m for u in self.units if u.api == api for m in u.members]
        for m in members:
            if contains(m, path) and (best is None or is_ancestor(best, m)):
                best = m
        ignored = self.comp.replicate_options.ignored_modules
        return best

    def unit_of(self, path):
        ...

    def owned_by(self, unit, member=None):
        ...

    def outermost(self, unit):
        return not any((other != unit and other.api == 'fully_shard' and any((is_ancestor(o, m) for o in other.members for m in unit.members)) for other in self.units))

    def frozen_only(self, unit, member=None):
        ...

    def manages_under(self, member, path):
        ...

    def unmanaged(self):
        local = self.local()
        return [p for p, n in self.paths.items() if owns_params(n) and self.member_of(p) is None and (p not in local)]

    def local(self):
        ignored = self.comp.replicate_options.ignored_modules
        return [p for p, n in self.paths.items() if owns_params(n) and any((contains(i, p) for i in ignored)) and (self.member_of(p) is None)]

    def ignored_by(self, member):
        ...

    def replicated_params(self, member):
        ...

    def delay_plan(self, member):
        ...

    def _trainable(self, path):
        ...

    def gradient_scale(self, path, world_size):
        ...
""",
    "fuzz/model/rules.py": """from __future__ import annotations
from dataclasses import replace
from fuzz.model.composition import Composition, Wrapper
from fuzz.model.layout import Layout
from fuzz.model.training import AccumSync, Compile, Optimizer, Skip, Training
from fuzz.model.tree import PARAM_LEAVES, Block, Leaf, LeafKind, ModuleTree, Node, contains, is_ancestor, iter_paths, owns_params

def check_composition(tree, comp, where='composition'):
    paths = tree.paths()
    sharded: list[str] = []
    for i, spec in enumerate(comp.shards):
        for j, path in enumerate(spec.paths):
            at = f'{where}.shards[{i}].' + ('path' if j == 0 else f'group[{j - 1}]')
            node = paths[path]
            sharded.append(path)
    for name, group in (('replicates', comp.replicates), ('checkpoints', comp.checkpoints)):
        pass
    done: list[str] = []
    for api, path in comp.steps():
        members = comp._spec_paths(api, path)
        for member in members:
            late = [d for d in done if is_ancestor(d, member)]
        done += members
    _check_tp(tree, comp, where)
    _check_replicate_options(tree, comp, where)
    _check_checkpoint_options(tree, comp, where)
    if comp.wrapper is Wrapper.NONE:
        pass

def _check_replicate_options(tree, comp, where):
    opts = comp.replicate_options
    paths = tree.paths()
    plain = Layout(tree, replace(comp, replicate_options=replace(opts, ignored_modules=())))
    at = f'{where}.replicate_options.ignored_modules'
    layout = Layout(tree, comp)

def _check_checkpoint_options(tree, comp, where):
    if comp.checkpoint_options.preserve_rng_state:
        return

def _check_tp(tree, comp, where):
    paths = tree.paths()
    used: list[str] = []

def check_mesh(comp, world_size, where='composition'):
    shard_size = comp.mesh[1] if comp.mesh else world_size // comp.tp_size
    for i, spec in enumerate(comp.shards):
        raf = spec.reshard_after_forward

def check_training(tree, comps, t, where='training'):
    paths = tree.paths()
    for i, later in enumerate(t.unfreeze):
        node = paths.get(later.path)
        for comp in comps:
            pass
    for comp in comps:
        k = comp.knobs
        _check_replicate_training(comp, t, where)

def _check_replicate_training(comp, t, where):
    opts = comp.replicate_options
    if not (opts.static_graph or opts.skip_all_reduce_unused_params or opts.delay_all_reduce) or not t.skips:
        return
""",
    "fuzz/model/state.py": """from __future__ import annotations
import enum
import os
import tempfile
from dataclasses import dataclass, field, fields
from typing import ClassVar
from fuzz.model.case import Body
from fuzz.model.composition import Composition, Wrapper
from fuzz.model.rules import check_composition, check_mesh
from fuzz.model.training import Training
from fuzz.model.tree import Block, Leaf, ModuleTree

def dcp_root(driver_pid):
    return os.path.join(tempfile.gettempdir(), f'shardfuzz-dcp-{driver_pid}')

def is_fsdp1(comp):
    return comp.wrapper.value.startswith('fsdp1')

def fsdp1_gathers(comp, world_size):
    return comp.wrapper in (Wrapper.FSDP1_FULL_SHARD, Wrapper.FSDP1_SHARD_GRAD_OP) and world_size > 1
""",
    "fuzz/model/training.py": """from __future__ import annotations
import enum
from dataclasses import dataclass
from fuzz.model.tree import Dtype, ModuleTree

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
    path: str
    step: int
    microbatch: int = 0

@dataclass(frozen=True)
class Unfreeze:
    path: str
    step: int

@dataclass(frozen=True)
class Training:
    optimizer: Optimizer = Optimizer.SGD
    lr: float = 0.1
    momentum: float = 0.0
    eps: float = 0.001
    steps: int = 2
    batch_per_rank: int = 2
    dtype: Dtype = Dtype.FLOAT32
    grad_accum: int = 1
    accum_sync: AccumSync = AccumSync.ALWAYS
    set_to_none: bool = True
    same_input: bool = False
    param_groups: int = 1
    foreach: bool | None = None
    skips: tuple[Skip, ...] = ()
    unfreeze: tuple[Unfreeze, ...] = ()
    compile: Compile = Compile.NONE

    def __post_init__(self):
        for i, later in enumerate(self.unfreeze):
            pass

    def skipped_at(self, step, microbatch):
        return [s.path for s in self.skips if s.step == step and s.microbatch == microbatch]

    def unused_on_some_microbatches(self, tree):
        ...
""",
    "fuzz/model/tree.py": """from __future__ import annotations
import enum
import typing
from dataclasses import dataclass
from typing import Union

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
    kind: LeafKind
    bias: bool = True
    frozen: bool = False

    def __post_init__(self):
        pass

@dataclass(frozen=True)
class Block:
    children: tuple[Node, ...]
    residual: bool = False
    scale: bool = False
    buffer: bool = False

    def __post_init__(self):
        pass
Node = Union[Leaf, Block]

def iter_paths(block, prefix=''):
    yield (prefix, block)
    for i, child in enumerate(block.children):
        path = f'{prefix}.{i}' if prefix else str(i)
        if isinstance(child, Block):
            yield from iter_paths(child, path)
        else:
            yield (path, child)

def owns_params(node):
    if isinstance(node, Leaf):
        return node.kind in PARAM_LEAVES
    return node.scale

def param_names(node):
    ...

@dataclass(frozen=True)
class ModuleTree:
    width: int
    root: Block

    def __post_init__(self):
        pass

    def paths(self):
        return dict(iter_paths(self.root))

    @property
    def size(self):
        ...

def contains(outer, path):
    return outer == path or outer == '' or path.startswith(outer + '.')

def is_ancestor(ancestor, path):
    return ancestor != path and contains(ancestor, path)
""",
    "fuzz/properties/__init__.py": """from __future__ import annotations
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from fuzz.model import Body, Case
from fuzz.signature import Failure
from fuzz.verdict import Outcome, Stall

@dataclass(frozen=True)
class Property:
    name: str
    description: str
    cases: Callable[..., Any]
    judge: Callable[[Case, Outcome], Failure | None]
    features: Callable[[Case], list[str]]
    min_world_size: int = 1
    stall: Stall | None = None
    body: type[Body] | None = None
    repro: str | None = None
    repro_refusal: str | None = None

def strategy(name):

    def cases(*, world_size, **kwargs):
        ...
    return cases
_REGISTRY: dict[str, Property] = {}

def register(prop):
    _REGISTRY[prop.name] = prop
    return prop
""",
    "fuzz/properties/parity.py": """from __future__ import annotations
import math
from typing import Any
from fuzz import known
from fuzz.model import Block, Case, Compile, Composition, Layout, Leaf, MetamorphicBody, ModuleTree, ParityBody, Training, Unit, Wrapper
from fuzz.properties import Property, register, strategy
from fuzz.signature import Failure, Signature
from fuzz.tolerance import Tolerance, first_mismatch, tolerance_for
from fuzz.verdict import Outcome

def _mismatch(prop, check, api, summary, **details):
    if api:
        family, *tags = api.split(':')
        signature = Signature('mismatch', prop, where=family, tags=tuple(tags))
    return Failure('mismatch', str(signature), summary, {'check': check, **details})

def api_of(comp, tree=None, training=None, world_size=2):
    if comp.wrapper is not Wrapper.NONE:
        name = 'fsdp1'
    return name + known.mismatch_tags(comp, tree, training, world_size)

def _judged_steps(observations):
    steps = min((len(obs['ref']['losses']) for obs in observations))
    for obs in observations:
        for step, losses in enumerate(obs['ref']['losses']):
            pass
    return steps

def compare_runs(prop, observations, tol, api=''):
    judged = _judged_steps(observations)
    for rank, obs in enumerate(observations):
        ref = obs['ref']
        for step, (got, want) in enumerate(zip(obs['losses'][:judged], ref['losses'][:judged])):
            bad = first_mismatch(got, want, tol)
        norms = [(i, g, w) for i, (g, w) in enumerate(zip(obs['grad_norms'][:judged], ref['grad_norms'][:judged])) if not (math.isnan(g) or math.isnan(w))]
        for step, got_norm, want_norm in norms:
            bad = first_mismatch([got_norm], [want_norm], tol)
            if bad is not None:
                return _mismatch(prop, 'grad', api, f'rank {rank} gradient norm at step {step} is {got_norm!r}, expected {want_norm!r}', rank=rank, step=step)

def check_knobs(prop, observations):
    for rank, obs in enumerate(observations):
        for run in (obs, obs.get('ref', {})):
            problems = run.get('knob_problems') or []
    return None

def _tolerance(training):
    return tolerance_for(training.dtype.value)

def judge_parity(case, outcome):
    ...

def judge_mixed_precision(case, outcome):
    ...

def judge_metamorphic(case, outcome):
    body = case.body
    assert isinstance(body, MetamorphicBody)
    api = api_of(body.variant, body.tree, body.training, case.world_size)
    for bug, met in ((known.FROZEN_INT_RESHARD, known.frozen_int_reshard_unit(body.tree, body.composition)), (known.UNFROZEN_UNRESHARDED, known.unfrozen_unresharded_unit(body.tree, body.composition, body.training))):
        pass
    return check_knobs(case.property, outcome.observations) or compare_runs(case.property, outcome.observations, _tolerance(body.training), api)

def features(case):
    ...
PARITY = register(Property(name='parity', description='composed models (fully_shard, replicate, checkpoint, HSDP, DDP, FSDP1) train like the all-reduce reference, step by step; API contracts hold', cases=strategy('parity_cases'), judge=judge_parity, features=features, body=ParityBody, repro='fuzz.repro.script:render'))
MIXED_PRECISION = register(Property(name='mixed_precision', description="fully_shard's MixedPrecisionPolicy: parameter dtype in forward, output dtype, sharding", cases=strategy('mixed_precision_cases'), judge=judge_mixed_precision, features=features, body=ParityBody, repro='fuzz.repro.script:render'))
METAMORPHIC = register(Property(name='metamorphic', description='meta-device init, checkpoint on/off, reshard_after_forward, mesh shape, FSDP2/FSDP1/DDP do not change numerics', cases=strategy('metamorphic_cases'), judge=judge_metamorphic, features=features, body=MetamorphicBody, repro='fuzz.repro.script:render'))
""",
    "fuzz/repro/__init__.py": """
""",
    "fuzz/repro/runtime.py": """from __future__ import annotations
import argparse
import contextlib
import faulthandler
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from typing import Any
FAILURE_GRACE_S = 3.0
DEFAULT_TIMEOUT_S = 60.0
POLL_S = 0.05
STALL_LOOK_EVERY_S = 0.5
DUMP_WAIT_S = 5.0
FATAL_SIGNALS = {'Segmentation fault': signal.SIGSEGV, 'Aborted': signal.SIGABRT, 'Bus error': signal.SIGBUS, 'Floating-point exception': signal.SIGFPE, 'Floating point exception': signal.SIGFPE, 'Illegal instruction': signal.SIGILL}
CASE_ID = 1

def main(case_text, expected, argv=None):
    parser = argparse.ArgumentParser(description='reproduce one shardfuzz corpus entry under torchrun')
    parser.add_argument('--backend', choices=('gloo', 'nccl'), default=os.environ.get('REPRO_BACKEND', 'gloo'))
    parser.add_argument('--timeout', type=float, default=float(os.environ.get('REPRO_TIMEOUT', DEFAULT_TIMEOUT_S)), help=f'seconds before ranks still in the case are stuck: a hang (default {DEFAULT_TIMEOUT_S:g})')
    args = parser.parse_args(argv)
    if os.environ.get('REPRO_JUDGE'):
        return judge_process(case_text, expected, os.environ['REPRO_JUDGE'], args.timeout)
    if 'LOCAL_RANK' not in os.environ:
        problem = _input_problem(case_text, args.backend)
        if problem is not None:
            print(f'repro: error: {problem}', file=sys.stderr)
            return 2
        return launch(int(expected['world_size']), argv if argv is not None else sys.argv[1:])
    return run_rank(case_text, expected, args.backend)

def launch(world_size, argv):
    with tempfile.TemporaryDirectory(prefix='shardfuzz-repro-') as tmp:
        status_file = os.path.join(tmp, 'status')
        command = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc-per-node']
        command += [str(world_size), os.path.abspath(sys.argv[0]), *argv]
        code = subprocess.call(command, env={**os.environ, 'REPRO_STATUS_FILE': status_file})
        try:
            with open(status_file) as f:
                return int(f.read())
        except (OSError, ValueError):
            return code or 1

def _one_line(text):
    ...

def _exit(code):
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)

def _status(code):
    path = os.environ.get('REPRO_STATUS_FILE')
    if path:
        with open(path, 'w') as f:
            f.write(str(code))
    return code

def _input_problem(case_text, backend):
    try:
        decode(case_text)
    except ValueError as e:
        return f'the case does not decode: {_one_line(e)}'
    if backend == 'nccl':
        import torch
        if not torch.cuda.is_available():
            return '--backend nccl needs CUDA, and torch.cuda.is_available() is False here'
    return None

def decode(case_text):
    from fuzz.model import case_from_json
    return case_from_json(json.loads(case_text))

def run_rank(case_text, expected, backend):
    rank, world_size = (int(os.environ['RANK']), int(os.environ['WORLD_SIZE']))
    local_rank = int(os.environ['LOCAL_RANK'])
    needed = int(expected['world_size'])

    def refuse(message: str) -> int:
        if rank == 0:
            print(f'repro: error: {message}', file=sys.stderr)
            return _status(2)
        return 2
    if world_size != needed:
        return refuse(f'this case needs {needed} ranks (torchrun --nproc-per-node {needed}), not {world_size}')
    try:
        case = decode(case_text)
    except ValueError as e:
        return refuse(f'the case does not decode: {_one_line(e)}')
    import torch
    if backend == 'nccl' and (not torch.cuda.is_available()):
        return refuse('--backend nccl needs CUDA, and torch.cuda.is_available() is False here')
    from datetime import timedelta
    import torch.distributed as dist
    from fuzz._rank.context import RankContext
    from fuzz._rank.programs import run_case
    from fuzz._rank.worker import _Sampler
    shared: list[Any] = [None]
    if rank == 0:
        shared[0] = tempfile.mkdtemp(prefix='shardfuzz-repro-')
        print(_versions(torch, backend, world_size), flush=True)
        judge_proc = subprocess.Popen([sys.executable, os.path.abspath(sys.argv[0]), *sys.argv[1:]], env={**os.environ, 'REPRO_JUDGE': shared[0]})
        with open(os.path.join(shared[0], 'judge-pid'), 'w') as f:
            f.write(str(judge_proc.pid))
    device = torch.device('cuda', local_rank) if backend == 'nccl' else torch.device('cpu')
    if device.type == 'cuda':
        torch.cuda.set_device(device)
    dist.init_process_group('cpu:gloo,cuda:nccl' if backend == 'nccl' else 'gloo', timeout=timedelta(minutes=30))
    ctx = RankContext(rank=rank, world_size=world_size, device=device, backend=backend)
    dist.broadcast_object_list(shared, src=0)
    run = Shared(str(shared[0]), world_size)
    stack_file = open(run.path('stack', rank), 'w')
    faulthandler.enable(file=stack_file, all_threads=True)
    with open(run.path('pid', rank), 'w') as f:
        f.write(str(os.getpid()))
    signal.signal(signal.SIGTERM, lambda *_: None)
    sampler = _Sampler(run.path('sample', rank))
    sampler.start()
    threading.Thread(target=_watch, args=(run, rank), name='repro-watch', daemon=True).start()
    dist.barrier()
    if rank == 0:
        run.write('start', None, time.time())
    sampler.case = (CASE_ID, time.monotonic())
    began = time.perf_counter()
    report: dict[str, Any]
    try:
        observation = run_case(case, ctx)
        ctx.end_case()
        report = {'observation': observation}
    except BaseException as e:
        report = {'exc_type': f'{type(e).__module__}.{type(e).__qualname__}', 'message': str(e)[:4000], 'traceback': traceback.format_exc()[-20000:]}
    report['seconds'] = time.perf_counter() - began
    sampler.case = None
    run.write('report', rank, report)
    while True:
        time.sleep(3600)

def _versions(torch, backend, world_size):
    device = torch.cuda.get_device_name(0) if backend == 'nccl' else 'cpu'
    python = sys.version.split()[0]
    return f'torch {torch.__version__}, Python {python}, backend {backend}, {world_size} ranks, device {device}'

class Shared:

    def __init__(self, root, world_size):
        self.root = root
        self.world_size = world_size

    def path(self, what, rank=None):
        return os.path.join(self.root, what if rank is None else f'{what}-{rank}')

    def write(self, what, rank, value):
        path = self.path(what, rank)
        with open(path + '.tmp', 'w') as f:
            json.dump(value, f)
        os.replace(path + '.tmp', path)

    def read(self, what, rank=None):
        try:
            with open(self.path(what, rank)) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def text(self, what, rank):
        try:
            with open(self.path(what, rank), encoding='utf-8', errors='replace') as f:
                return f.read()
        except OSError:
            return ''

    def sample(self, rank):
        ...

    def died(self, rank):
        text = self.text('stack', rank)
        for name, sig in FATAL_SIGNALS.items():
            if f'Fatal Python error: {name}' in text:
                return -int(sig)
        pid = self.read('pid', rank)
        if isinstance(pid, int) and (not _alive(pid)):
            return 1
        return None

def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except (OSError, IndexError):
        return True

def main_thread_stack():
    ...

def _watch(run, rank):
    dumped = False
    judge_pid = run.read('judge-pid')
    while True:
        time.sleep(POLL_S)
        verdict = run.read('verdict')
        if verdict is not None or not os.path.isdir(run.root):
            if rank == 0:
                from fuzz.model import dcp_root
                shutil.rmtree(dcp_root(os.environ.get('SHARDFUZZ_PARENT_PID', os.getppid())), ignore_errors=True)
            _exit(int(verdict) if rank == 0 and isinstance(verdict, int) else 0)
        if isinstance(judge_pid, int) and (not _alive(judge_pid)) and (run.read('verdict') is None):
            print(f'repro: error: rank {rank}: the judge process ended without a verdict', file=sys.stderr)
            _exit(1)
        if not dumped and os.path.exists(run.path('dump')):
            dumped = True
            if not os.path.exists(run.path('report', rank)):
                run.write('stuck', rank, {'stack': main_thread_stack()})
                print(f'--- rank {rank} is still in the case; its threads:', file=sys.stderr, flush=True)
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)

def judge_process(case_text, expected, root, timeout):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    run = Shared(root, int(expected['world_size']))
    code = 1
    try:
        case = decode(case_text)
        until = time.monotonic() + timeout
        while run.read('start') is None:
            if time.monotonic() >= until or run.died(0) is not None:
                print('repro: error: the ranks never started the case', file=sys.stderr)
                raise SystemExit(1)
            time.sleep(POLL_S)
        code = judge(run, case, expected, time.monotonic(), timeout)
    except SystemExit as e:
        code = int(e.code or 0)
    except BaseException:
        traceback.print_exc()
        print('repro: error: the script could not judge the case (above)', file=sys.stderr)
    _status(code)
    sys.stdout.flush()
    run.write('verdict', None, code)
    time.sleep(1.0)
    shutil.rmtree(run.root, ignore_errors=True)
    return code

def collect(run, start, deadline, stall):
    done: dict[int, dict[str, Any]] = {}
    dead: dict[int, int] = {}
    first_failure: float | None = None
    next_look = start + stall.after if stall is not None else math.inf
    held_since: float | None = None
    while len(done) + len(dead) < run.world_size:
        now = time.monotonic()
        until = deadline if first_failure is None else min(deadline, first_failure + FAILURE_GRACE_S)
        if now >= until:
            break
        if stall is not None and first_failure is None and (now >= next_look):
            next_look = now + STALL_LOOK_EVERY_S
            stacks = ['' if r in done or r in dead else run.sample(r) for r in range(run.world_size)]
            if not stall.deadlocked(stacks):
                held_since = None
            elif held_since is None:
                held_since = now
            elif now - held_since >= stall.hold:
                return (done, dead, stall.name)
        for r in range(run.world_size):
            if r in done or r in dead:
                continue
            report = run.read('report', r)
            status = None if report is not None else run.died(r)
            if report is not None:
                done[r] = report
            elif status is not None:
                dead[r] = status
            if (status is not None or (report and report.get('exc_type'))) and first_failure is None:
                first_failure = time.monotonic()
        time.sleep(POLL_S)
    return (done, dead, None)

def outcome_of(run, start, timeout, stall):
    from fuzz.verdict import Outcome, OutcomeKind, RankReport
    done, dead, stalled = collect(run, start, start + timeout, stall)
    stuck = [r for r in range(run.world_size) if r not in done and r not in dead]
    stacks: dict[int, str] = {}
    if stuck:
        run.write('dump', None, stuck)
        until = time.monotonic() + DUMP_WAIT_S
        while time.monotonic() < until and any((run.read('stuck', r) is None for r in stuck)):
            time.sleep(POLL_S)
        for r in stuck:
            written = run.read('stuck', r)
            stacks[r] = written['stack'] if written else ''
    reports = []
    for r in range(run.world_size):
        m = done.get(r)
        fatal = run.text('stack', r) or None
        if m is not None:
            reports.append(RankReport(rank=r, observation=m.get('observation'), exc_type=m.get('exc_type'), message=m.get('message'), traceback=m.get('traceback'), stack=fatal, seconds=m.get('seconds')))
        elif r in dead:
            reports.append(RankReport(rank=r, stack=fatal, exit_status=dead[r]))
        else:
            reports.append(RankReport(rank=r, stack=stacks.get(r) or fatal))
    if dead:
        kind = OutcomeKind.CRASH
    elif any((m.get('exc_type') for m in done.values())):
        kind = OutcomeKind.EXCEPTION
    elif stuck:
        kind = OutcomeKind.HANG
    else:
        kind = OutcomeKind.OK
    seconds = time.monotonic() - start
    return Outcome(kind=kind, ranks=tuple(reports), seconds=seconds, stalled=stalled if stuck else None)

def reproduces(expected, signature):
    from fuzz.signature import same_bug
    signatures = list(expected['signatures'])
    if signature in signatures:
        return True
    return bool(expected.get('known')) and any((same_bug(s, signature) for s in signatures))

def judge(run, case, expected, start, timeout):
    import importlib
    importlib.import_module(expected['judge'])
    from fuzz.properties import _REGISTRY
    prop = _REGISTRY[case.property]
    outcome = outcome_of(run, start, timeout, prop.stall)
    failure = prop.judge(case, outcome)
    _save_observations(outcome, failure)
    print(f'outcome: {outcome.kind.value} after {outcome.seconds:.1f} s')
    if failure is None:
        print(f"PASS: the case passes here; the entry's failure ({expected['signature']}) did not reproduce")
        return 0
    if failure.kind != 'mismatch':
        print(outcome.describe()[-6000:])
    check = failure.details.get('check') if isinstance(failure.details, dict) else None
    said = f"{failure.signature}{(f' ({check})' if check else '')}: {failure.summary}"
    if reproduces(expected, failure.signature):
        print(f'REPRODUCED {said}')
        return 1
    print(f"FAIL (not the entry's failure, {expected['signature']}): {said}")
    return 0

def _save_observations(outcome, failure):
    path = os.environ.get('REPRO_OBSERVATIONS')
    if not path:
        return
    modules = {name: getattr(getattr(module, '__spec__', None), 'origin', None) for name, module in list(sys.modules.items()) if name == 'fuzz' or name.startswith('fuzz.')}
    data = {'observations': outcome.observations, 'kind': outcome.kind.value, 'signature': failure.signature if failure is not None else None, 'modules': modules, 'top_level': sorted({name.split('.')[0] for name in sys.modules})}
    with open(path, 'w') as f:
        json.dump(data, f)
""",
    "fuzz/signature.py": """from __future__ import annotations
import signal
from dataclasses import dataclass, field
from typing import Any
from fuzz.verdict import Outcome, OutcomeKind

@dataclass(frozen=True)
class Signature:
    kind: str
    property: str
    check: str = ''
    where: str = ''
    tags: tuple[str, ...] = ()

    def __str__(self):
        text = f'{self.kind}:{self.property}'
        if self.where:
            text += f'@{self.where}'
        return text + ''.join((f':{t}' for t in self.tags))

    @classmethod
    def parse(cls, text):
        ...

@dataclass(frozen=True)
class Failure:
    kind: str
    signature: str
    summary: str
    details: dict[str, Any] = field(default_factory=dict)

def same_bug(entry, found):
    ...
""",
    "fuzz/tolerance.py": """from __future__ import annotations
import math
from dataclasses import dataclass

@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float
POLICY: dict[str, Tolerance] = {'float64': Tolerance(rtol=1e-09, atol=1e-12), 'float32': Tolerance(rtol=1e-05, atol=1e-06), 'bfloat16': Tolerance(rtol=0.032, atol=0.001), 'float16': Tolerance(rtol=0.004, atol=0.0001)}

def tolerance_for(dtype):
    return POLICY[dtype]

@dataclass(frozen=True)
class Mismatch:
    index: int
    actual: float
    expected: float
    error: float
    allowed: float

def first_mismatch(actual, expected, tol):
    worst: Mismatch | None = None
    for i, (a, e) in enumerate(zip(actual, expected)):
        allowed = tol.atol + tol.rtol * abs(e)
        err = abs(a - e)
        if not err <= allowed or not math.isfinite(e):
            excess = err - allowed if err == err else float('inf')
            if worst is None or excess > worst.error - worst.allowed:
                worst = Mismatch(index=i, actual=a, expected=e, error=err, allowed=allowed)
    return worst
""",
    "fuzz/verdict.py": """from __future__ import annotations
import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

class OutcomeKind(str, enum.Enum):
    OK = 'ok'
    EXCEPTION = 'exception'
    HANG = 'hang'
    CRASH = 'crash'

@dataclass(frozen=True)
class RankReport:
    rank: int
    observation: dict[str, Any] | None = None
    exc_type: str | None = None
    message: str | None = None
    traceback: str | None = None
    stack: str | None = None
    exit_status: int | None = None
    output_tail: str | None = None
    seconds: float | None = None
    stats: dict[str, float] = field(default_factory=dict)

    @property
    def status(self):
        ...

@dataclass(frozen=True)
class Stall:
    name: str
    deadlocked: Callable[[list[str]], bool]
    after: float = 10.0
    hold: float = 3.0

@dataclass(frozen=True)
class Outcome:
    kind: OutcomeKind
    ranks: tuple[RankReport, ...]
    seconds: float
    stalled: str | None = None

    @property
    def ok(self):
        return self.kind is OutcomeKind.OK

    @property
    def observations(self):
        return [r.observation or {} for r in self.ranks]

    def describe(self):
        ...
""",
}
MODULES = {
    "fuzz": PREFIX + "fuzz/__init__.py",
    "fuzz._protocol": PREFIX + "fuzz/_protocol.py",
    "fuzz._rank": PREFIX + "fuzz/_rank/__init__.py",
    "fuzz._rank.compose": PREFIX + "fuzz/_rank/compose.py",
    "fuzz._rank.context": PREFIX + "fuzz/_rank/context.py",
    "fuzz._rank.knobs": PREFIX + "fuzz/_rank/knobs.py",
    "fuzz._rank.models": PREFIX + "fuzz/_rank/models.py",
    "fuzz._rank.options": PREFIX + "fuzz/_rank/options.py",
    "fuzz._rank.parity": PREFIX + "fuzz/_rank/parity.py",
    "fuzz._rank.programs": PREFIX + "fuzz/_rank/programs.py",
    "fuzz._rank.worker": PREFIX + "fuzz/_rank/worker.py",
    "fuzz.known": PREFIX + "fuzz/known.py",
    "fuzz.model": PREFIX + "fuzz/model/__init__.py",
    "fuzz.model.case": PREFIX + "fuzz/model/case.py",
    "fuzz.model.codec": PREFIX + "fuzz/model/codec.py",
    "fuzz.model.composition": PREFIX + "fuzz/model/composition.py",
    "fuzz.model.layout": PREFIX + "fuzz/model/layout.py",
    "fuzz.model.rules": PREFIX + "fuzz/model/rules.py",
    "fuzz.model.state": PREFIX + "fuzz/model/state.py",
    "fuzz.model.training": PREFIX + "fuzz/model/training.py",
    "fuzz.model.tree": PREFIX + "fuzz/model/tree.py",
    "fuzz.properties": PREFIX + "fuzz/properties/__init__.py",
    "fuzz.properties.parity": PREFIX + "fuzz/properties/parity.py",
    "fuzz.repro": PREFIX + "fuzz/repro/__init__.py",
    "fuzz.repro.runtime": PREFIX + "fuzz/repro/runtime.py",
    "fuzz.signature": PREFIX + "fuzz/signature.py",
    "fuzz.tolerance": PREFIX + "fuzz/tolerance.py",
    "fuzz.verdict": PREFIX + "fuzz/verdict.py",
}

if __name__ == "__main__":
    sys.exit(main())
