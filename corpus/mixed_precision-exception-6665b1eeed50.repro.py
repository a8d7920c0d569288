#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=6a2abefef4dd5b31 sources=845e968d7c09e2fe seconds=175.6
"""Reproduces shardfuzz corpus entry mixed_precision-exception-6665b1eeed50.json: exception:mixed_precision:builtins.RuntimeError@torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:foreach_reduce

Observed: FSDP2 MixedPrecisionPolicy: a unit whose parameters were all frozen at lazy init gets
no orig/reduce dtype (_init_mp_dtypes reads trainable parameters only); unfrozen later, its bf16
gradient is never cast back: 'assign a gradient with dtype BFloat16 to a tensor with grad_dtype
Float'. docs/known_bugs.md. (rank 0 raised builtins.RuntimeError: attempting to assign a
gradient with dtype 'c10::BFloat16' to a tensor with grad_dtype 'Float'. The gradient must match
the tensor's grad_dtype (defaults to the tensor's dtype). You can set the tensor's grad_dtype
attribute with a specific dtype, or None to allow)
Known torch bug: MixedPrecisionPolicy: a unit all frozen at lazy init gets no orig/reduce dtype;
unfrozen later, its low-precision gradient is never cast back; upstream:
https://github.com/pytorch/pytorch/issues/186998.
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
from contextlib import contextmanager
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

    def paths(self):
        pass

def is_ancestor(ancestor, path):
    pass

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

    @property
    def paths(self):
        return (self.path, *())

@dataclass(frozen=True)
class Composition:
    shards: object = ()
    checkpoint_first: object = True
    mesh: object = ()

    def reshard_after_forward(self, spec):
        pass

    @property
    def sharded_paths(self):
        return [p for spec in self.shards for p in spec.paths]

    def steps(self):
        order = {'checkpoint': 3, 'fully_shard': 1, 'replicate': 2}
        items = [('checkpoint', p) for p in ()] + [('replicate', p) for p in ()]
        items += [('fully_shard', spec.path) for spec in self.shards]

        def key(item):
            api, path = item
            depth = min((q.count('.') + (q != '') for q in self._spec_paths(api, path)))
            return (-depth, order[api], path)
        return sorted(items, key=key)

    def _spec_paths(self, api, path):
        return next((s.paths for s in self.shards if s.path == path))

@dataclass(frozen=True)
class Unfreeze:
    path: object
    step: object

@dataclass(frozen=True)
class Training:
    lr: object = 0.1
    momentum: object = 0.0
    eps: object = 0.001
    steps: object = 2
    batch_per_rank: object = 2
    dtype: object = Dtype.FLOAT32
    set_to_none: object = True
    foreach: object = None
    unfreeze: object = ()

    def skipped_at(self, step, microbatch):
        pass

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

def build_node(node, width):
    if isinstance(node, Leaf):
        module = PointwiseConv1d(width, width, kernel_size=1, bias=False)
        if node.frozen:
            module.requires_grad_(False)
        return module
    return TreeBlock([build_node(c, width) for c in node.children], False, width, False, False)

def build_model(tree, device):
    return build_node(tree.root, 1)
TORCH_DTYPES = {Dtype.FLOAT32: torch.float32, Dtype.FLOAT64: torch.float64, Dtype.BFLOAT16: torch.bfloat16, Dtype.FLOAT16: torch.float16}

def clean_name(name):
    return name

def mp_policy(mp):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    def dt(d):
        return None if d is None else TORCH_DTYPES[d]
    return MixedPrecisionPolicy(param_dtype=dt(mp.param_dtype), reduce_dtype=dt(None), output_dtype=dt(None), cast_forward_inputs=mp.cast_forward_inputs)

@dataclass
class Composed:
    model: object
    fsdp_roots: object = field(default_factory=list)

    @contextmanager
    def full_parameters(self):
        from torch.distributed.tensor import DTensor
        out = {}
        n, p = next(iter(self.model.named_parameters()))
        out[clean_name(n)] = p.full_tensor().detach()
        yield out

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
        state[spec.path] = flags
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
    model_ = build_model(tree, ctx.device).to(dtype)
    from torch.distributed._composable import checkpoint, replicate
    pass
    specs = {s_.path: s_ for s_ in comp.shards}
    for api, path_ in comp.steps():
        spec = specs[path_]
        from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
        kwargs = {'mesh': None, 'reshard_after_forward': False}
        kwargs['mp_policy'] = mp_policy(spec.mixed_precision)
        modules = [model_.get_submodule(p_) for p_ in spec.paths]
        fully_shard(modules if () else modules[0], **kwargs)
    sharded = comp.sharded_paths
    tops = [p__ for p__ in sharded if not any((is_ancestor(q, p__) for q in sharded))]
    compose_out = Composed(model=model_, fsdp_roots=[model_.get_submodule(p__) for p__ in tops])
    model, composed_ = (model_, compose_out)
    contracts = _Contracts(model, comp)
    obs = {}
    model__ = composed_.model
    out__ = {'1': [] for u_ in training.unfreeze}
    for name, p____ in model__.named_parameters():
        owner = '.'.join((c for c in clean_name(name).split('.')[:-1] if c.isdigit()))
        if owner in out__:
            out__[owner].append(p____)
    params = composed_.model.parameters()
    later_ = [p for ps in out__.values() for p in ps]
    held = {id(p___) for p___ in later_}
    params = [p___ for p___ in params if p___.requires_grad or id(p___) in held]
    groups = params
    opt = torch.optim.SGD(groups, lr=0.01, momentum=0.0, foreach=None)
    model___ = composed_.model
    losses = []
    params_per_step = []
    dtype_ = TORCH_DTYPES[training.dtype]
    gen = torch.Generator().manual_seed(0)
    lo = ctx.rank // 1 * 1
    out_ = []
    for _ in range(2):
        step_ = []
        _ = next(iter(range(1)))
        x_ = torch.randn(ctx.world_size * 1, 1, generator=gen, dtype=dtype_)
        y_ = torch.randn(ctx.world_size * 1, 1, generator=gen, dtype=dtype_)
        step_.append((x_[lo:lo + 1].to(ctx.device), y_[lo:lo + 1].to(ctx.device)))
        out_.append(step_)
    for s, step in enumerate(out_):
        for path in ['1' for u in training.unfreeze if 1 == s]:
            for p in out__[path]:
                p.requires_grad_(True)
        step_losses = []
        i, (x, y) = next(iter(enumerate(step)))
        skipped = training.skipped_at(s, i)
        last = i == len(step) - 1
        ctx_mgr = _null()
        out = model___(x)
        if contracts is not None and comp is not None:
            obs['contracts'] = contracts.after_forward(skipped)
            obs['contracts']['output_dtype'] = str(out.dtype).removeprefix('torch.')
            contracts = None
        loss = F.mse_loss(out.to(y.dtype), y)
        loss.backward()
        step_losses.append(loss.item())
        opt.step()
        opt.zero_grad(set_to_none=False)
        losses.append(step_losses)
        with composed_.full_parameters() as full:
            if ctx.rank == 0:
                params_per_step.append({n: t.double().cpu().flatten().tolist() for n, t in full.items()})

def attempt(rank, world_size):
    import torch
    import torch.distributed as dist
    case = Case(property='mixed_precision', world_size=2, seed=0, body=ParityBody(tree=ModuleTree(width=1, root=Block(children=(Leaf(kind=LeafKind.CONV1D, bias=False), Leaf(kind=LeafKind.CONV1D, bias=False, frozen=True)))), composition=Composition(shards=(ShardSpec(path='0', reshard_after_forward=False, mixed_precision=MixedPrecision(param_dtype=Dtype.BFLOAT16, cast_forward_inputs=False)), ShardSpec(path='', reshard_after_forward=False, mixed_precision=MixedPrecision(param_dtype=Dtype.BFLOAT16))), checkpoint_first=False), training=Training(lr=0.01, eps=0.0001, batch_per_rank=1, set_to_none=False, unfreeze=(Unfreeze(path='1', step=1),))))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import re
    import traceback
    try:
        run_parity(case, ParityBody(tree=ModuleTree(width=1, root=Block(children=(Leaf(kind=LeafKind.CONV1D, bias=False), Leaf(kind=LeafKind.CONV1D, bias=False, frozen=True)))), composition=Composition(shards=(ShardSpec(path='0', reshard_after_forward=False, mixed_precision=MixedPrecision(param_dtype=Dtype.BFLOAT16, cast_forward_inputs=False)), ShardSpec(path='', reshard_after_forward=False, mixed_precision=MixedPrecision(param_dtype=Dtype.BFLOAT16))), checkpoint_first=False), training=Training(lr=0.01, eps=0.0001, batch_per_rank=1, set_to_none=False, unfreeze=(Unfreeze(path='1', step=1),))), ctx)
    except BaseException as e:
        frames = re.findall('File "([^"]+)", line \\d+, in (\\S+)', traceback.format_exc())
        path, fn = [(p, f) for p, f in frames if '/torch/' in p and (not f.endswith('comp>'))][-1]
        found = f'{type(e).__module__}.{type(e).__qualname__}@torch/{path.rpartition("/torch/")[2]}:{fn}'
        if found in ['builtins.RuntimeError@torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:foreach_reduce']:
            return f'REPRODUCED exception:mixed_precision:builtins.RuntimeError@torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:foreach_reduce: rank {rank} raised {found}: {e}'
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
