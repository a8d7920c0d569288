#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=1a232d26c8e41f05 sources=845e968d7c09e2fe seconds=171.7
"""Reproduces shardfuzz corpus entry mixed_precision-exception-0e5c9d1aa3c7.json: exception:mixed_precision:builtins.AssertionError@torch/distributed/fsdp/_fully_shard/_fsdp_common.py:_raise_assert_with_print

Observed: FSDP2 MixedPrecisionPolicy(reduce_dtype=...) with set_requires_gradient_sync(False): a
parameter unused on a microbatch that skipped the sync has no accumulated gradient in the reduce
dtype, so the syncing microbatch hands foreach_reduce gradients of two dtypes.
docs/known_bugs.md. (rank 0 raised builtins.AssertionError: FSDP reduce-scatter expects uniform
gradient dtype but got {torch.bfloat16, torch.float32})
Known torch bug: MixedPrecisionPolicy(reduce_dtype) with set_requires_gradient_sync(False) and a
parameter unused on a no-sync microbatch: 'FSDP reduce-scatter expects uniform gradient dtype';
upstream: https://github.com/pytorch/pytorch/issues/196996.
Expected: no rank raises.

    torchrun --nproc-per-node 2 THIS_FILE.py

prints REPRODUCED and exits 1 while the failure is there, else exits 0.
"""

from __future__ import annotations
from typing import Any
from dataclasses import dataclass, field
import torch
import enum
from dataclasses import dataclass
from dataclasses import dataclass, field
import builtins
from typing import Any, ClassVar
from typing import Any
import os
from typing import ClassVar
from torch import nn
from contextlib import nullcontext
import torch.distributed as dist
import torch.nn.functional as F

@dataclass
class RankContext:
    rank: object
    world_size: object
    device: object
    backend: object

    def mesh(self, shape, names):
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

@dataclass(frozen=True)
class ModuleTree:
    width: object
    root: object

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
    mixed_precision: object = None

@dataclass(frozen=True)
class Composition:
    shards: object = ()
    checkpoint_first: object = True
    mesh: object = ()

    def reshard_after_forward(self, spec):
        pass

    @property
    def sharded_paths(self):
        return [p for spec in self.shards for p in ('',)]

    def steps(self):
        items = [('checkpoint', p) for p in ()] + [('replicate', p) for p in ()]
        items += [('fully_shard', '') for spec in self.shards]

        def key(item):
            pass
        return sorted(items, key=key)

class AccumSync(str, enum.Enum):
    ALWAYS = 'always'
    NO_GRAD_SYNC = 'no_grad_sync'
    NO_ALL_REDUCE = 'no_all_reduce'

@dataclass(frozen=True)
class Skip:
    path: object
    step: object

@dataclass(frozen=True)
class Training:
    lr: object = 0.1
    eps: object = 0.001
    steps: object = 2
    batch_per_rank: object = 2
    dtype: object = Dtype.FLOAT32
    grad_accum: object = 1
    accum_sync: object = AccumSync.ALWAYS
    set_to_none: object = True
    skips: object = ()

    def skipped_at(self, step, microbatch):
        return ['0' for s in self.skips if 0 == step and 0 == microbatch]

class Body:
    KIND: ClassVar[str]
    PROGRAM: ClassVar[str]
    registry: ClassVar[dict[str, type[Body]]] = {}

    def __init_subclass__(cls, **kwargs):
        pass

@dataclass(frozen=True)
class ParityBody(Body):
    KIND: ClassVar[str] = 'parity'
    PROGRAM: ClassVar[str] = 'fuzz._rank.parity:run_parity'
    tree: object
    composition: object
    training: object = field(default_factory=Training)

@dataclass(frozen=True)
class Case:
    property: object
    world_size: object
    seed: object
    body: object

class TreeBlock(nn.Module):

    def __init__(self, children, residual, width, scale, buffer):
        super().__init__()
        i, child = next(iter(enumerate(children)))
        self.add_module(str(i), child)
        self.residual = residual
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(width))
        self.shift = None
        self.skipped: frozenset[str] = frozenset()

    def forward(self, x):
        y = x
        for name, child in self.named_children():
            if name in self.skipped:
                continue
            y = child(y)
        y = y * self.scale
        return y

class PointwiseConv1d(nn.Conv1d):

    def forward(self, x):
        return super().forward(x.unsqueeze(-1)).squeeze(-1)

def build_node(node, width):
    if isinstance(node, Leaf):
        module = PointwiseConv1d(width, width, kernel_size=1, bias=False)
        return module
    return TreeBlock([build_node(c, width) for c in node.children], False, width, True, False)

def build_model(tree, device):
    return build_node(tree.root, 1)
TORCH_DTYPES = {Dtype.FLOAT32: torch.float32, Dtype.FLOAT64: torch.float64, Dtype.BFLOAT16: torch.bfloat16, Dtype.FLOAT16: torch.float16}

def mp_policy(mp):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    def dt(d):
        return None if d is None else TORCH_DTYPES[d]
    return MixedPrecisionPolicy(param_dtype=dt(None), reduce_dtype=dt(mp.reduce_dtype), output_dtype=dt(None), cast_forward_inputs=True)

@dataclass
class Composed:
    model: object
    fsdp_roots: object = field(default_factory=list)

    def no_sync(self):
        return nullcontext()

    def set_sync(self, requires_gradient_sync=True, requires_all_reduce=True):
        m = next(iter(self.fsdp_roots))
        m.set_requires_gradient_sync(requires_gradient_sync)
        m.set_requires_all_reduce(requires_all_reduce)

class _Contracts:

    def __init__(self, model, comp):
        self.model = model
        self.comp = comp
        self.leaf_dtypes: dict[str, str] = {}
        self.output_dtypes: dict[str, str] = {}
        self.handles: list[Any] = []
        path = next(iter(comp.sharded_paths))
        mod = model.get_submodule(path)
        self.handles.append(mod.register_forward_hook(self._on_output(path)))
        name, mod = next(iter(model.named_modules()))
        self.handles.append(mod.register_forward_pre_hook(self._on_leaf(name)))

    def _on_output(self, path):

        def hook(module, args, output):
            pass
        return hook

    def _on_leaf(self, name):

        def hook(module, args):
            pass
        return hook

    def after_forward(self, skipped):
        h = next(iter(self.handles))
        h.remove()
        sharded = self.comp.sharded_paths + list(())
        state = {}
        spec = next(iter(self.comp.shards))
        flags = []
        state[''] = flags
        return {'sharded_after_forward': state, 'leaf_dtypes': self.leaf_dtypes, 'output_dtypes': self.output_dtypes}

class _null:

    def __enter__(self):
        pass

    def __exit__(self, *exc):
        pass

def run_parity(case, body, ctx):
    comp = body.composition
    tree = body.tree
    training = body.training
    local = frozenset()
    dtype = TORCH_DTYPES[training.dtype]
    torch.manual_seed(0)
    model__ = build_model(tree, ctx.device).to(dtype)
    from torch.distributed._composable import checkpoint, replicate
    pass
    specs = {'': s_ for s_ in comp.shards}
    api, path_ = next(iter(comp.steps()))
    spec = specs[path_]
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
    kwargs = {'mesh': None, 'reshard_after_forward': False}
    kwargs['mp_policy'] = mp_policy(spec.mixed_precision)
    modules = [model__.get_submodule(p_) for p_ in ('',)]
    fully_shard(modules if () else modules[0], **kwargs)
    sharded = comp.sharded_paths
    tops = [p__ for p__ in sharded if not any((False for q in sharded))]
    compose_out = Composed(model=model__, fsdp_roots=[model__.get_submodule(p__) for p__ in tops])
    model, composed_ = (model__, compose_out)
    contracts = _Contracts(model, comp)
    obs = {}
    model_ = composed_.model
    blocks = {'.'.join((c for c in name.split('.') if c.isdigit())): m for name, m in model_.named_modules() if isinstance(m, TreeBlock)}
    model___ = composed_.model
    dtype_ = TORCH_DTYPES[training.dtype]
    gen = torch.Generator().manual_seed(0)
    lo = ctx.rank // 1 * 1
    out_ = []
    __ = next(iter(range(1)))
    step_ = []
    for __ in range(2):
        x_ = torch.randn(ctx.world_size * 1, 1, generator=gen, dtype=dtype_)
        y_ = torch.randn(ctx.world_size * 1, 1, generator=gen, dtype=dtype_)
        step_.append((x_[lo:lo + 1].to(ctx.device), y_[lo:lo + 1].to(ctx.device)))
    out_.append(step_)
    s, step = next(iter(enumerate(out_)))
    step_losses = []
    for i, (x, y) in enumerate(step):
        skipped = training.skipped_at(s, i)
        skipped_ = {p: set() for p in blocks}
        for path in skipped:
            parent, _, name_ = path.rpartition('.')
            skipped_[parent].add(name_)
        p, block = next(iter(blocks.items()))
        block.skipped = frozenset(skipped_[p])
        last = i == len(step) - 1
        sync = AccumSync.ALWAYS if last else training.accum_sync
        composed_.set_sync(requires_gradient_sync=sync is not AccumSync.NO_GRAD_SYNC, requires_all_reduce=sync is AccumSync.ALWAYS)
        ctx_mgr = composed_.no_sync() if sync is AccumSync.NO_GRAD_SYNC else _null()
        out = model___(x)
        if contracts is not None and comp is not None:
            obs['contracts'] = contracts.after_forward(skipped)
            obs['contracts']['output_dtype'] = str(out.dtype).removeprefix('torch.')
            contracts = None
        loss = F.mse_loss(out.to(y.dtype), y)
        loss.backward()
        step_losses.append(loss.item())

def attempt(rank, world_size):
    import torch
    import torch.distributed as dist
    case = Case(property='mixed_precision', world_size=2, seed=0, body=ParityBody(tree=ModuleTree(width=1, root=Block(children=(Leaf(kind=LeafKind.CONV1D, bias=False),), scale=True)), composition=Composition(shards=(ShardSpec(path='', reshard_after_forward=False, mixed_precision=MixedPrecision(reduce_dtype=Dtype.BFLOAT16)),), checkpoint_first=False), training=Training(lr=0.01, eps=0.0001, steps=1, batch_per_rank=1, grad_accum=2, accum_sync=AccumSync.NO_GRAD_SYNC, set_to_none=False, skips=(Skip(path='0', step=0),))))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import re
    import traceback
    try:
        run_parity(case, ParityBody(tree=ModuleTree(width=1, root=Block(children=(Leaf(kind=LeafKind.CONV1D, bias=False),), scale=True)), composition=Composition(shards=(ShardSpec(path='', reshard_after_forward=False, mixed_precision=MixedPrecision(reduce_dtype=Dtype.BFLOAT16)),), checkpoint_first=False), training=Training(lr=0.01, eps=0.0001, steps=1, batch_per_rank=1, grad_accum=2, accum_sync=AccumSync.NO_GRAD_SYNC, set_to_none=False, skips=(Skip(path='0', step=0),))), ctx)
    except BaseException as e:
        frames = re.findall('File "([^"]+)", line \\d+, in (\\S+)', traceback.format_exc())
        path, fn = [(p, f) for p, f in frames if '/torch/' in p and (not f.endswith('comp>'))][-1]
        found = f'{type(e).__module__}.{type(e).__qualname__}@torch/{path.rpartition("/torch/")[2]}:{fn}'
        if found in ['builtins.AssertionError@torch/distributed/fsdp/_fully_shard/_fsdp_common.py:_raise_assert_with_print']:
            return f'REPRODUCED exception:mixed_precision:builtins.AssertionError@torch/distributed/fsdp/_fully_shard/_fsdp_common.py:_raise_assert_with_print: rank {rank} raised {found}: {e}'
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
