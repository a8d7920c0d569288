#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=0c68acf3fa5c0cb8 sources=845e968d7c09e2fe seconds=150.7
"""Reproduces shardfuzz corpus entry parity-exception-f2ce67efc316.json: exception:parity:builtins.RuntimeError@torch/distributed/tensor/_dispatch.py:_try_replicate_spec_for_scalar_tensor

Observed: rank 0 raised builtins.RuntimeError: aten._foreach_add_.List got mixed torch.Tensor
and DTensor, need to convert all torch.Tensor to DTensor before calling distributed operators!
Known torch bug: foreach optimizers over a mix of DTensor (fully_shard) and plain (replicate)
parameters raise; upstream: https://github.com/pytorch/pytorch/issues/183207.
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
import os
from typing import ClassVar
from torch import nn
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
class ShardSpec:
    path: object
    reshard_after_forward: object = True

@dataclass(frozen=True)
class Composition:
    shards: object = ()
    replicates: object = ()
    mesh: object = ()

    def reshard_after_forward(self, spec):
        pass

    @property
    def sharded_paths(self):
        return [p for spec in self.shards for p in ('0',)]

    def steps(self):
        order = {'checkpoint': 0, 'fully_shard': 1, 'replicate': 2}
        items = [('checkpoint', p) for p in ()] + [('replicate', p) for p in ('',)]
        items += [('fully_shard', '0') for spec in self.shards]

        def key(item):
            api, path = item
            depth = min((q.count('.') + (q != '') for q in self._spec_paths(api, path)))
            return (-depth, order[api], path)
        return sorted(items, key=key)

    def _spec_paths(self, api, path):
        if api == 'fully_shard':
            return next((('0',) for s in self.shards if '0' == path))
        return (path,)

@dataclass(frozen=True)
class Training:
    lr: object = 0.1
    momentum: object = 0.0
    steps: object = 2
    batch_per_rank: object = 2
    dtype: object = Dtype.FLOAT32
    foreach: object = None

    def skipped_at(self, step, microbatch):
        pass

class Body:
    KIND: ClassVar[str]

@dataclass(frozen=True)
class ParityBody(Body):
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

def build_node(node, width):
    if isinstance(node, Leaf):
        module = nn.Linear(width, width, bias=True)
        return module
    return TreeBlock([build_node(c, width) for c in node.children], False, width, False, False)

def build_model(tree, device):
    return build_node(tree.root, 2)
TORCH_DTYPES = {Dtype.FLOAT32: torch.float32, Dtype.FLOAT64: torch.float64, Dtype.BFLOAT16: torch.bfloat16, Dtype.FLOAT16: torch.float16}

@dataclass
class Composed:
    model: object
    fsdp_roots: object = field(default_factory=list)

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
        sharded = self.comp.sharded_paths + list(('',))
        state = {}
        spec = next(iter(self.comp.shards))
        flags = []
        state['0'] = flags
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
    api, path = next(iter(comp.steps()))
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
    kwargs = {'mesh': None, 'reshard_after_forward': True}
    modules = [model_.get_submodule(p_) for p_ in ('0',)]
    fully_shard(modules if () else modules[0], **kwargs)
    sharded = comp.sharded_paths
    tops = [p__ for p__ in sharded if not any((False for q in sharded))]
    compose_out = Composed(model=model_, fsdp_roots=[model_.get_submodule(p__) for p__ in tops])
    model, composed_ = (model_, compose_out)
    contracts = _Contracts(model, comp)
    obs = {}
    model__ = composed_.model
    out__ = {u.path: [] for u in ()}
    name, p____ = next(iter(model__.named_parameters()))
    pass
    params = composed_.model.parameters()
    later_ = [p for ps in out__.values() for p in ps]
    held = {id(p___) for p___ in later_}
    params = [p___ for p___ in params if p___.requires_grad or id(p___) in held]
    groups = params
    opt = torch.optim.SGD(groups, lr=0.1, momentum=0.0, foreach=True)
    model___ = composed_.model
    dtype_ = TORCH_DTYPES[training.dtype]
    gen = torch.Generator().manual_seed(0)
    lo = ctx.rank // 1 * 1
    out_ = []
    _ = next(iter(range(1)))
    step_ = []
    for _ in range(1):
        x_ = torch.randn(ctx.world_size * 1, 2, generator=gen, dtype=dtype_)
        y_ = torch.randn(ctx.world_size * 1, 2, generator=gen, dtype=dtype_)
        step_.append((x_[lo:lo + 1].to(ctx.device), y_[lo:lo + 1].to(ctx.device)))
    out_.append(step_)
    s, step = next(iter(enumerate(out_)))
    step_losses = []
    i, (x, y) = next(iter(enumerate(step)))
    skipped = training.skipped_at(s, i)
    last = i == len(step) - 1
    ctx_mgr = _null()
    out = model___(x)
    obs['contracts'] = contracts.after_forward(skipped)
    obs['contracts']['output_dtype'] = str(out.dtype).removeprefix('torch.')
    contracts = None
    loss = F.mse_loss(out.to(y.dtype), y)
    loss.backward()
    step_losses.append(loss.item())
    opt.step()

def attempt(rank, world_size):
    import torch
    import torch.distributed as dist
    case = Case(property='parity', world_size=2, seed=0, body=ParityBody(tree=ModuleTree(width=2, root=Block(children=(Leaf(kind=LeafKind.LINEAR), Leaf(kind=LeafKind.LINEAR)))), composition=Composition(shards=(ShardSpec(path='0'),), replicates=('',)), training=Training(steps=1, batch_per_rank=1, foreach=True)))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import re
    import traceback
    try:
        run_parity(case, ParityBody(tree=ModuleTree(width=2, root=Block(children=(Leaf(kind=LeafKind.LINEAR), Leaf(kind=LeafKind.LINEAR)))), composition=Composition(shards=(ShardSpec(path='0'),), replicates=('',)), training=Training(steps=1, batch_per_rank=1, foreach=True)), ctx)
    except BaseException as e:
        frames = re.findall('File "([^"]+)", line \\d+, in (\\S+)', traceback.format_exc())
        path, fn = [(p, f) for p, f in frames if '/torch/' in p and (not f.endswith('comp>'))][-1]
        found = f'{type(e).__module__}.{type(e).__qualname__}@torch/{path.rpartition("/torch/")[2]}:{fn}'
        if found in ['builtins.RuntimeError@torch/distributed/tensor/_dispatch.py:_try_replicate_spec_for_scalar_tensor', 'builtins.RuntimeError@torch/optim/sgd.py:_multi_tensor_sgd']:
            return f'REPRODUCED exception:parity:builtins.RuntimeError@torch/distributed/tensor/_dispatch.py:_try_replicate_spec_for_scalar_tensor: rank {rank} raised {found}: {e}'
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
