#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=7e3bfa33e075cc53 sources=6c2335d0b1851556 seconds=15.1
"""Reproduces shardfuzz corpus entry state_dict-exception-d75bbc271571.json: exception:state_dict:builtins.AssertionError@torch/distributed/checkpoint/state_dict.py:_load_optim_state_dict

set_optimizer_state_dict(full_state_dict=True) raises AssertionError('Expected device to be
set') for an optimizer without tensor state (SGD without momentum): _load_optim_state_dict takes
the device from the local state's tensors of dim > 0 and finds none. Any model, sharded or not.
(rank 0 raised builtins.AssertionError: Expected device to be set)

Known torch bug: set_optimizer_state_dict(full_state_dict=True) for an optimizer without tensor
state: 'Expected device to be set'; upstream: none found.

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
  "api": "split",
  "drop": [],
  "empty_group": false,
  "frozen_in_optimizer": false,
  "kind": "state_dict",
  "load": {
   "broadcast_from_rank0": false,
   "cpu_offload": false,
   "flatten_optimizer_state_dict": false,
   "full_state_dict": true,
   "ignore_frozen_params": false,
   "strict": true
  },
  "requires_grad": [],
  "save": {
   "broadcast_from_rank0": false,
   "cpu_offload": false,
   "flatten_optimizer_state_dict": false,
   "full_state_dict": true,
   "ignore_frozen_params": false,
   "strict": true
  },
  "source": {
   "auto_wrap": false,
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
   "wrapper": "none"
  },
  "steps_after": 0,
  "target": {
   "auto_wrap": false,
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
   "wrapper": "none"
  },
  "target_meta_init": false,
  "training": {
   "accum_sync": "always",
   "batch_per_rank": 1,
   "compile": "none",
   "dtype": "float32",
   "eps": 0.001,
   "foreach": null,
   "grad_accum": 1,
   "lr": 0.1,
   "momentum": 0.0,
   "optimizer": "sgd",
   "param_groups": 1,
   "same_input": false,
   "set_to_none": true,
   "skips": [],
   "steps": 1,
   "unfreeze": []
  },
  "tree": {
   "root": {
    "buffer": false,
    "children": [
     {
      "bias": true,
      "frozen": false,
      "kind": "linear"
     }
    ],
    "residual": false,
    "scale": false
   },
   "width": 2
  }
 },
 "property": "state_dict",
 "schema": 1,
 "seed": 0,
 "world_size": 2
}
"""

EXPECTED = {'judge': 'fuzz.properties.state_dict',
 'known': True,
 'property': 'state_dict',
 'signature': 'exception:state_dict:builtins.AssertionError@torch/distributed/checkpoint/state_dict.py:_load_optim_state_dict',
 'signatures': ['exception:state_dict:builtins.AssertionError@torch/distributed/checkpoint/state_dict.py:_load_optim_state_dict'],
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
from fuzz.model import Composition, Dtype, MixedPrecision, ModuleTree, ShardSpec, Wrapper
TORCH_DTYPES = {Dtype.FLOAT32: torch.float32, Dtype.FLOAT64: torch.float64, Dtype.BFLOAT16: torch.bfloat16, Dtype.FLOAT16: torch.float16}
_WRAPPER_PREFIXES = ('_fsdp_wrapped_module.', 'module.', '_checkpoint_wrapped_module.')

def clean_name(name):
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, '')
    return name

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
        ...

    @contextmanager
    def full_parameters(self):
        from torch.distributed.tensor import DTensor
        out = {}
        for n, p in self.model.named_parameters():
            out[clean_name(n)] = (p.full_tensor() if isinstance(p, DTensor) else p).detach()
        yield out

def compose(model, comp, ctx, tree=None):
    ...
""",
    "fuzz/_rank/context.py": """from __future__ import annotations
from dataclasses import dataclass, field
from typing import Any
import torch

@dataclass
class RankContext:
    rank: int
    world_size: int
    device: torch.device
    backend: str
    _meshes: dict[tuple[tuple[int, ...], tuple[str, ...]], Any] = field(default_factory=dict)

    def mesh(self, shape, names):
        ...
    _cases: int = 0
    extra_groups: list[Any] = field(default_factory=list)
    _groups: dict[str, Any] = field(default_factory=dict)

    def group(self, name):
        ...

    def _check_in_step(self):
        ...

    def end_case(self):
        ...
""",
    "fuzz/_rank/knobs.py": """from __future__ import annotations
from typing import Any
import torch
from torch import nn
from fuzz.model import Composition, Knobs, ModuleTree, ShardSpec

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

def build_model(tree, device):
    with torch.device(device):
        return build_node(tree.root, tree.width)
""",
    "fuzz/_rank/parity.py": """from __future__ import annotations
import copy
from typing import Any
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from fuzz._rank.compose import TORCH_DTYPES, Composed, clean_name
from fuzz._rank.context import RankContext
from fuzz._rank.models import build_model
from fuzz.model import AccumSync, Case, Compile, Composition, MixedPrecision, ModuleTree, Optimizer, Training

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
""",
    "fuzz/_rank/state_dict.py": """from __future__ import annotations
import copy
import inspect
from dataclasses import dataclass, field, replace
from typing import Any
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from fuzz._rank.compose import TORCH_DTYPES, Composed, clean_name, compose
from fuzz._rank.context import RankContext
from fuzz._rank.models import build_model
from fuzz._rank.parity import batches, make_optimizer
from fuzz.model import Api, Case, Composition, ModuleTree, Optimizer, Options, RequiresGrad, StateDictBody, Training, is_fsdp1, is_plain
PROBE_ROWS = 3
FRESH_SEED = 24301

@dataclass
class Side:
    composed: Composed
    comp: Composition
    training: Training
    opt: torch.optim.Optimizer | None = None
    param_names: dict[int, str] = field(default_factory=dict)
    schedule: tuple[RequiresGrad, ...] = ()
    step: int = 0

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
    return [step[0] for step in batches(case, replace(training, steps=steps), tree.width, ctx)]

def train_steps(side, data, ctx):
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

def _flat(t):
    from torch.distributed.tensor import DTensor
    return [float(v) for v in t.detach().double().cpu().flatten().tolist()]

def observe_model(side):
    with side.composed.full_parameters() as params:
        out = {n: [float(v) for v in t.double().cpu().flatten().tolist()] for n, t in params.items()}
    return out

def _jsonable(value):
    if isinstance(value, (bool, int, float, str)) or value is None:
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
    out: dict[str, dict[str, list[float]]] = {}
    for group in side.opt.param_groups:
        for p in group['params']:
            state = side.opt.state.get(p, {})
            entry = {key: _jsonable(state[key]) for key in sorted(state)}
    return out

def probe(side, case, tree, ctx):
    gen = torch.Generator().manual_seed(case.seed + 1)
    x = torch.randn(PROBE_ROWS, tree.width, generator=gen, dtype=TORCH_DTYPES[side.training.dtype]).to(ctx.device)
    seed_segment(case, ctx, 99)
    with torch.no_grad():
        out = _flat(side.model(x))
    reshard(side.model)
    return out

def reshard(model):
    from torch.distributed.fsdp import FSDPModule
    for module in model.modules():
        pass

def observe(side, case, tree, ctx, *, model=True):
    obs: dict[str, Any] = {'groups': observe_groups(side)}
    if model:
        params = observe_model(side)
        optim = observe_optimizer(side)
        out = probe(side, case, tree, ctx)
        if ctx.rank == 0:
            obs.update(model=params, probe=out)
            if not side.fsdp1:
                obs['optimizer'] = optim
    return obs

def dropped_keys(side, drop):
    if not drop:
        return []

def fsdp1_optim_state_dict(side):
    ...

def torch_kwargs(fn, kwargs):
    params = inspect.signature(fn).parameters
    missing = sorted((k for k in kwargs if k not in params))
    return kwargs

def state_dict_options(o):
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    extra = {n: True for n in ('ignore_frozen_params', 'flatten_optimizer_state_dict') if getattr(o, n)}
    return StateDictOptions(full_state_dict=o.full_state_dict, cpu_offload=o.cpu_offload, broadcast_from_rank0=o.broadcast_from_rank0, strict=o.strict, **torch_kwargs(StateDictOptions, extra))

def _take(body, side):
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict, get_state_dict
    options = state_dict_options(body.save)
    assert side.opt is not None
    msd = get_model_state_dict(side.model, options=options)
    return (msd, get_optimizer_state_dict(side.model, side.opt, options=options))

def _put(body, side, msd, osd, ctx):
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict, set_state_dict
    options = state_dict_options(body.load)
    fresh = fresh_training(body.training)
    result = set_model_state_dict(side.model, msd, options=options)
    flags = requires_grad(side)
    opt = side.opt if side.opt is not None else body_optimizer(side, fresh, body)
    catch_up(side, body.training.steps)
    set_optimizer_state_dict(side.model, opt, osd, options=options)

def run_state_dict(case, body, ctx):
    t = body.training
    data = all_batches(case, t, t.steps + body.steps_after, body.tree, ctx)
    src = build_side(body.tree, body.source, t, ctx, seed=case.seed, schedule=body.requires_grad)
    body_optimizer(src, t, body)
    seed_segment(case, ctx, 0)
    obs: dict[str, Any] = {'losses_before': train_steps(src, data[:t.steps], ctx)}
    msd, osd = _take(body, src)
    nested_osd = osd
    ignored: list[str] = []
    msd, osd = copy.deepcopy((msd, osd))
    obs['saved'] = observe(src, case, body.tree, ctx)
    tgt = build_side(body.tree, body.target, t, ctx, seed=case.seed + FRESH_SEED, meta=body.target_meta_init, schedule=body.requires_grad)
    if not body.target_meta_init:
        body_optimizer(tgt, fresh_training(t), body)
        catch_up(tgt, t.steps)
    dropped = sorted(set(dropped_keys(src, body.drop)) | set(ignored))
    obs['dropped'] = dropped
    before = requires_grad(tgt)
    result, after = _put(body, tgt, msd, osd, ctx)
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
from fuzz.model import AccumSync, Api, Block, Body, Case, Compile, Composition, DcpBody, DcpItem, Dtype, Leaf, ModuleTree, Optimizer, Overwrite, StateDictBody, Training, Wrapper, is_fsdp1
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
    ...

def frozen_state_dropped(body):
    ...

def ends_ranks(case):
    ...

def rank0_alone_in_broadcast(stacks):
    inside = ['_broadcast_state_dict' in s for s in stacks]
    return bool(inside) and inside[0] and (not all(inside))
ALONE_IN_BROADCAST_STALL = Stall(name='rank 0 alone in _broadcast_state_dict', deadlocked=rank0_alone_in_broadcast, after=10.0, hold=3.0)
""",
    "fuzz/model/__init__.py": """from fuzz.model.case import Body, Case
from fuzz.model.codec import case_from_json
from fuzz.model.composition import CheckpointOptions, Composition, ContextFn, DeterminismCheck, Knobs, MixedPrecision, ReplicateGroup, ReplicateOptions, ShardSpec, TpPair, Wrapper
from fuzz.model.state import Api, DcpBody, DcpItem, DcpMode, LoadPlannerOptions, Options, Overwrite, RequiresGrad, SavePlannerOptions, StateDictBody, WriterOptions, dcp_root, is_fsdp1, is_plain, schedule_problem
from fuzz.model.training import AccumSync, Compile, Optimizer, Skip, Training, Unfreeze
from fuzz.model.tree import Block, Dtype, Leaf, LeafKind, ModuleTree, Node, param_names
""",
    "fuzz/model/case.py": """from __future__ import annotations
import builtins
import enum
from dataclasses import dataclass, field
from typing import Any, ClassVar
from fuzz.model.composition import Composition
from fuzz.model.training import AccumSync, Training
from fuzz.model.tree import Block, Leaf, LeafKind, ModuleTree

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
            return _decode(Leaf, value, path)
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
from fuzz.model.tree import Dtype

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

    @property
    def paths(self):
        ...

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
        ...

    def steps(self):
        ...

    def _spec_paths(self, api, path):
        ...
""",
    "fuzz/model/state.py": """from __future__ import annotations
import enum
import os
import tempfile
from dataclasses import dataclass, field, fields
from typing import ClassVar
from fuzz.model.case import Body
from fuzz.model.composition import Composition, Wrapper
from fuzz.model.training import Training
from fuzz.model.tree import Block, Leaf, ModuleTree

def dcp_root(driver_pid):
    return os.path.join(tempfile.gettempdir(), f'shardfuzz-dcp-{driver_pid}')

def is_plain(comp):
    return not comp.shards and (not comp.replicates) and (comp.wrapper is Wrapper.NONE)

def is_fsdp1(comp):
    return comp.wrapper.value.startswith('fsdp1')

def _check_side(comp, tree, where):
    if is_plain(comp):
        return

def _check_common(tree, source, target, training, steps_after, meta):
    _check_side(source, tree, 'source')
    _check_side(target, tree, 'target')

def _check_drop(drop):
    pass

def _check_frozen_in_optimizer(tree, frozen_in_optimizer):
    pass

def _check_schedule(body):
    problem = schedule_problem(body.tree, body.source, body.target, body.training, body.steps_after, body.requires_grad, body.frozen_in_optimizer)

@dataclass(frozen=True)
class RequiresGrad:
    path: str
    step: int
    trainable: bool

def schedule_problem(tree, source, target, training, steps_after, changes, frozen_in_optimizer):
    if not changes:
        return None

class Api(str, enum.Enum):
    SPLIT = 'split'
    COMBINED = 'combined'
    MODULE = 'module'
    FSDP1 = 'fsdp1_optim_state_dict'

@dataclass(frozen=True)
class Options:
    full_state_dict: bool = False
    cpu_offload: bool = False
    broadcast_from_rank0: bool = False
    strict: bool = True
    ignore_frozen_params: bool = False
    flatten_optimizer_state_dict: bool = False

@dataclass(frozen=True)
class StateDictBody(Body):
    KIND: ClassVar[str] = 'state_dict'
    PROGRAM: ClassVar[str] = 'fuzz._rank.state_dict:run_state_dict'
    tree: ModuleTree
    source: Composition
    target: Composition
    training: Training = field(default_factory=Training)
    steps_after: int = 1
    api: Api = Api.SPLIT
    save: Options = field(default_factory=Options)
    load: Options = field(default_factory=Options)
    target_meta_init: bool = False
    drop: tuple[int, ...] = ()
    frozen_in_optimizer: bool = False
    empty_group: bool = False
    requires_grad: tuple[RequiresGrad, ...] = ()

    def __post_init__(self):
        _check_common(self.tree, self.source, self.target, self.training, self.steps_after, self.target_meta_init)
        _check_drop(self.drop)
        _check_frozen_in_optimizer(self.tree, self.frozen_in_optimizer)
        _check_schedule(self)
        save, load = (self.save, self.load)
        self._check_frozen_and_flat()

    def _check_frozen_and_flat(self):
        save, load = (self.save, self.load)

    def _check_fsdp1(self):
        ...

    @property
    def size(self):
        ...

    def validate_for(self, world_size):
        for where, comp in (('source', self.source), ('target', self.target)):
            pass

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
    single_file_per_rank: bool = True
    sync_files: bool = True
    thread_count: int = 1
    per_thread_copy_ahead: int = 10000000

    def changed(self):
        ...

@dataclass(frozen=True)
class SavePlannerOptions:
    flatten_sharded_tensors: bool = True
    dedup_save_to_lowest_rank: bool = False
    enable_plan_caching: bool = False

@dataclass(frozen=True)
class LoadPlannerOptions:
    flatten_sharded_tensors: bool = True
    allow_partial_load: bool = False

class DcpMode(str, enum.Enum):
    ROUND_TRIP = 'round_trip'
    SAVE_ONLY = 'save_only'
    LOAD_ONLY = 'load_only'

@dataclass(frozen=True)
class DcpBody(Body):
    KIND: ClassVar[str] = 'dcp'
    PROGRAM: ClassVar[str] = 'fuzz._rank.dcp:run_dcp'
    tree: ModuleTree
    source: Composition
    target: Composition
    entries: tuple[DcpItem, ...]
    training: Training = field(default_factory=Training)
    steps_after: int = 1
    orders: tuple[tuple[int, ...], ...] = ()
    skip: tuple[DcpItem, ...] = ()
    drop: tuple[int, ...] = ()
    save_full_state_dict: bool = False
    save_cpu_offload: bool = False
    load_full_state_dict: bool = False
    load_cpu_offload: bool = False
    module_stateful: bool = False
    patched: bool = False
    async_save: bool = False
    storage_objects: bool = False
    target_meta_init: bool = False
    mode: DcpMode = DcpMode.ROUND_TRIP
    checkpoint_dir: str = ''
    deadlock: bool = False
    overwrite: Overwrite = Overwrite.NONE
    async_saves: int = 0
    cache_staged: bool = False
    no_dist: bool = False
    frozen_in_optimizer: bool = False
    empty_group: bool = False
    writer: WriterOptions = field(default_factory=WriterOptions)
    save_planner: SavePlannerOptions | None = None
    load_planner: LoadPlannerOptions | None = None
    absent: bool = False
    convert: bool = False
    own_group: bool = False
    requires_grad: tuple[RequiresGrad, ...] = ()

    @property
    def classic_fsdp1(self):
        ...

    def _check_fsdp1(self):
        ...

    def _check_saves(self):
        ...

    def _check_options(self):
        ...

    def _check_no_dist(self):
        ...

    @property
    def size(self):
        ...

    def collective_entries(self):
        ...

    def validate_for(self, world_size):
        ...
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
        pass

    def skipped_at(self, step, microbatch):
        ...

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

def param_names(node):
    ...

@dataclass(frozen=True)
class ModuleTree:
    width: int
    root: Block

    def __post_init__(self):
        pass

    def paths(self):
        ...

    @property
    def size(self):
        ...
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
    "fuzz/properties/state_dict.py": """from __future__ import annotations
import atexit
import dataclasses
import os
import shutil
from typing import Any
from fuzz import known
from fuzz.model import Api, Case, Composition, DcpBody, DcpItem, DcpMode, ModuleTree, Overwrite, StateDictBody, Wrapper, dcp_root, is_fsdp1, is_plain
from fuzz.properties import Property, register, strategy
from fuzz.signature import Failure, Signature, failure_from_outcome
from fuzz.verdict import Outcome
atexit.register(shutil.rmtree, dcp_root(os.getpid()), ignore_errors=True)

def _failure(prop, outcome):
    failure = failure_from_outcome(prop, outcome)
    texts = [(r.stack or '') + (r.traceback or '') for r in outcome.ranks]
    return failure

def _one_bug(case, failure):
    if failure is None or failure.kind != 'mismatch' or (not failure.signature.endswith(known.FSDP1_HSDP_SHARD1.tag)):
        return failure

def judge_state_dict(case, outcome):
    return _one_bug(case, _frozen_state_dropped(case, _judge_state_dict(case, outcome)))

def judge_dcp(case, outcome):
    ...
OPTIMIZER_CHECKS = ('optimizer', 'resume_loss', 'resume_params')

def _frozen_state_dropped(case, failure):
    body = case.body
    if failure is None or failure.kind != 'mismatch' or (not isinstance(body, (StateDictBody, DcpBody))) or (not known.frozen_state_dropped(body)) or (failure.details.get('check') not in OPTIMIZER_CHECKS):
        return failure

def _judge_state_dict(case, outcome):
    if not outcome.ok:
        return _failure(case.property, outcome)

def features_state_dict(case):
    ...

def features_dcp(case):
    ...
STATE_DICT = register(Property(name='state_dict', description="get/set_*_state_dict (and FSDP2's own) move model and optimizer state exactly, across layouts", cases=strategy('state_dict_cases'), judge=judge_state_dict, features=features_state_dict, stall=known.ALONE_IN_BROADCAST_STALL, body=StateDictBody, repro='fuzz.repro.script:render'))
DCP = register(Property(name='dcp', description='DCP save/async_save/load with Stateful objects and per-rank key orders round-trip exactly', cases=strategy('dcp_cases'), judge=judge_dcp, features=features_dcp, stall=known.ALONE_IN_BROADCAST_STALL, body=DcpBody, repro='fuzz.repro.script:render'))
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
import re
import signal
from dataclasses import dataclass, field
from typing import Any
from fuzz.verdict import Outcome, OutcomeKind
_FRAME = re.compile('File "([^"]+)", line \\\\d+,? in (\\\\S+)')

@dataclass(frozen=True)
class Signature:
    kind: str
    property: str
    check: str = ''
    where: str = ''
    tags: tuple[str, ...] = ()

    def __str__(self):
        text = f'{self.kind}:{self.property}'
        if self.check:
            text += f':{self.check}'
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
_INLINED = frozenset({'<listcomp>', '<dictcomp>', '<setcomp>'})

def location(text):
    frames = [(path, fn) for path, fn in _FRAME.findall(_current_thread(text or '')) if fn not in _INLINED]
    ordered = list(reversed(frames))
    for path, fn in ordered:
        at = path.rfind('/torch/')
        inner = path[at + 1:]
        if at >= 0 and '/fuzz/' not in path and ('-packages/' not in inner):
            return f'{inner}:{fn}'

def _current_thread(text):
    at = text.find('Current thread ')
    if at < 0:
        return text

def failure_from_outcome(prop, outcome):
    details = {'ranks': [_rank_details(r) for r in outcome.ranks], 'seconds': outcome.seconds}
    if outcome.kind is OutcomeKind.EXCEPTION:
        first = next((r for r in outcome.ranks if r.exc_type))
        where = location(first.traceback)
        summary = f"rank {first.rank} raised {first.exc_type}: {shorten(first.message or '', 300)}"
        return Failure('exception', str(Signature('exception', prop, first.exc_type or '?', where)), summary, details)

def _rank_details(r):
    return {'rank': r.rank, 'status': r.status, 'exc_type': r.exc_type, 'message': r.message, 'traceback': r.traceback, 'stack': r.stack, 'exit_status': r.exit_status, 'output_tail': r.output_tail}

def shorten(text, limit):
    if len(text) <= limit:
        return text

def same_bug(entry, found):
    ...
""",
    "fuzz/verdict.py": """from __future__ import annotations
import enum
import re
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
        if self.exc_type is not None:
            return 'error'

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
        ...

    def describe(self):
        parts = [f'{self.kind.value} after {self.seconds:.2f}s']
        for r in self.ranks:
            head = f'--- rank {r.rank}: {r.status}'
            parts.append(head)
            if r.exc_type:
                parts.append(r.traceback or f'{r.exc_type}: {r.message}')
        return '\\n'.join(parts)
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
    "fuzz._rank.parity": PREFIX + "fuzz/_rank/parity.py",
    "fuzz._rank.programs": PREFIX + "fuzz/_rank/programs.py",
    "fuzz._rank.state_dict": PREFIX + "fuzz/_rank/state_dict.py",
    "fuzz._rank.worker": PREFIX + "fuzz/_rank/worker.py",
    "fuzz.known": PREFIX + "fuzz/known.py",
    "fuzz.model": PREFIX + "fuzz/model/__init__.py",
    "fuzz.model.case": PREFIX + "fuzz/model/case.py",
    "fuzz.model.codec": PREFIX + "fuzz/model/codec.py",
    "fuzz.model.composition": PREFIX + "fuzz/model/composition.py",
    "fuzz.model.state": PREFIX + "fuzz/model/state.py",
    "fuzz.model.training": PREFIX + "fuzz/model/training.py",
    "fuzz.model.tree": PREFIX + "fuzz/model/tree.py",
    "fuzz.properties": PREFIX + "fuzz/properties/__init__.py",
    "fuzz.properties.state_dict": PREFIX + "fuzz/properties/state_dict.py",
    "fuzz.repro": PREFIX + "fuzz/repro/__init__.py",
    "fuzz.repro.runtime": PREFIX + "fuzz/repro/runtime.py",
    "fuzz.signature": PREFIX + "fuzz/signature.py",
    "fuzz.verdict": PREFIX + "fuzz/verdict.py",
}

if __name__ == "__main__":
    sys.exit(main())
