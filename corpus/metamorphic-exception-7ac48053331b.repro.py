#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=7cab03442e860cb4 sources=1f6fea1f8a59e6b3 seconds=173.9
"""Reproduces shardfuzz corpus entry metamorphic-exception-7ac48053331b.json: exception:metamorphic:builtins.RuntimeError@torch/distributed/tensor/_dispatch.py:_try_replicate_spec_for_scalar_tensor

Observed: rank 0 raised builtins.RuntimeError: aten._foreach_add_.List got mixed torch.Tensor
and DTensor, need to convert all torch.Tensor to DTensor before calling distributed operators!
Known torch bug: foreach optimizers over a mix of DTensor (fully_shard) and plain (replicate)
parameters raise; upstream: https://github.com/pytorch/pytorch/issues/183207.
Expected: no rank raises.

    torchrun --nproc-per-node 2 THIS_FILE.py

prints REPRODUCED and exits 1 while the failure is there, else exits 0.
"""

from __future__ import annotations
import torch
import enum
from dataclasses import dataclass, field
from torch import nn
import torch.nn.functional as F

@dataclass
class RankContext:
    rank: object
    world_size: object
    device: object
    backend: object

class LeafKind(str, enum.Enum):
    LINEAR = 'linear'

class Dtype(str, enum.Enum):
    FLOAT32 = 'float32'
    FLOAT64 = 'float64'
    BFLOAT16 = 'bfloat16'
    FLOAT16 = 'float16'

@dataclass()
class Leaf:
    kind: object

@dataclass()
class Block:
    children: object

@dataclass()
class ModuleTree:
    width: object
    root: object

@dataclass()
class ShardSpec:
    path: object

@dataclass()
class Composition:
    shards: object = ()
    replicates: object = ()
    checkpoints: object = ()

    @property
    def sharded_paths(self):
        return [p for spec in self.shards for p in ('0',)]

@dataclass()
class Training:
    steps: object = 2
    batch_per_rank: object = 2
    dtype: object = Dtype.FLOAT32
    foreach: object = None

    def skipped_at(self, step, microbatch):
        pass

class Body:
    pass

@dataclass()
class MetamorphicBody(Body):
    tree: object
    composition: object
    variant: object
    training: object = field()

@dataclass()
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

    def forward(self, x):
        y = x
        for name, child in self.named_children():
            y = child(y)
        return y

def build_node(node, width):
    if isinstance(node, Leaf):
        module = nn.Linear(width, width)
        return module
    return TreeBlock([build_node(c, width) for c in node.children], False, width, False, False)
TORCH_DTYPES = {Dtype.FLOAT32: torch.float32}

@dataclass
class Composed:
    model: object

class _Contracts:

    def __init__(self, model, comp):
        self.comp = comp
        self.leaf_dtypes: dict[()] = {}
        self.output_dtypes: dict[()] = {}
        self.handles: list[Any] = []
        path = next(iter(comp.sharded_paths))
        mod = model.get_submodule(path)
        name, mod = next(iter(model.named_modules()))

    def after_forward(self, skipped):
        pass

def attempt(rank, world_size):
    case = Case(property='metamorphic', world_size=2, seed=0, body=MetamorphicBody(tree=ModuleTree(width=2, root=Block(children=(Leaf(kind=LeafKind.LINEAR), Leaf(kind=LeafKind.LINEAR)))), composition=Composition(shards=(ShardSpec(path='0'),), replicates=('',)), variant=Composition(shards=(ShardSpec(path='0'),), replicates=('',), checkpoints=('1',)), training=Training(steps=1, batch_per_rank=1, foreach=True)))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import re
    import traceback
    try:
        body = MetamorphicBody(tree=ModuleTree(width=2, root=Block(children=(Leaf(kind=LeafKind.LINEAR), Leaf(kind=LeafKind.LINEAR)))), composition=Composition(shards=(ShardSpec(path='0'),)), variant=Composition(), training=Training())
        tree = body.tree
        training = body.training
        comp = body.composition
        dtype = TORCH_DTYPES[training.dtype]
        build_model_out = build_node(tree.root, 2)
        model_ = build_model_out.to(dtype)
        from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
        kwargs = {}
        modules = [model_.get_submodule(p_) for p_ in ('0',)]
        fully_shard(modules if () else modules[0], **kwargs)
        sharded = comp.sharded_paths
        tops = [p__ for p__ in sharded if not any((False for q in sharded))]
        compose_out = Composed(model=model_)
        model, composed = (model_, compose_out)
        contracts = _Contracts(model, comp)
        obs = {}
        pass
        params = composed.model.parameters()
        opt = torch.optim.SGD(params, foreach=True)
        model___ = composed.model
        gen = torch.Generator().manual_seed(0)
        lo = ctx.rank // 1 * 1
        out_ = []
        step_ = []
        _ = next(iter(range(1)))
        x_ = torch.randn(ctx.world_size * 1, 2)
        y_ = torch.randn(ctx.world_size * 1, 2)
        step_.append((x_[lo:lo + 1].to(ctx.device), y_[lo:lo + 1].to(ctx.device)))
        out_.append(step_)
        s, step = next(iter(enumerate(out_)))
        i, (x, y) = next(iter(enumerate(step)))
        skipped = training.skipped_at(s, i)
        out = model___(x)
        obs['contracts'] = contracts.after_forward(skipped)
        loss = F.mse_loss(out.to(y.dtype), y)
        loss.backward()
        opt.step()
    except BaseException as e:
        frames = re.findall('File "([^"]+)", line \\d+, in (\\S+)', traceback.format_exc())
        path, fn = [(p, f) for p, f in frames if '/torch/' in p and (not f.endswith('comp>'))][-1]
        found = f'{type(e).__module__}.{type(e).__qualname__}@torch/{path.rpartition("/torch/")[2]}:{fn}'
        if found in ['builtins.RuntimeError@torch/distributed/tensor/_dispatch.py:_try_replicate_spec_for_scalar_tensor', 'builtins.RuntimeError@torch/optim/sgd.py:_multi_tensor_sgd']:
            return f'REPRODUCED exception:metamorphic:builtins.RuntimeError@torch/distributed/tensor/_dispatch.py:_try_replicate_spec_for_scalar_tensor: rank {rank} raised {found}: {e}'
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
