#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=fcf8cd4586083371 sources=845e968d7c09e2fe seconds=301.2
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
import torch
import enum
from dataclasses import dataclass, field
from torch import nn
import torch.nn.functional as F

class LeafKind(str, enum.Enum):
    CONV1D = 'conv1d'

class Dtype(str, enum.Enum):
    BFLOAT16 = 'bfloat16'

@dataclass()
class Leaf:
    kind: object

@dataclass()
class Block:
    children: object

@dataclass()
class MixedPrecision:
    reduce_dtype: object = None

@dataclass()
class ShardSpec:
    path: object
    mixed_precision: object = None

@dataclass()
class Composition:
    shards: object = ()

    def steps(self):
        items = [] + []
        items += [('fully_shard', '') for spec in self.shards]
        return sorted(items)

class AccumSync(str, enum.Enum):
    ALWAYS = 'always'
    NO_GRAD_SYNC = 'no_grad_sync'

@dataclass()
class Skip:
    path: object
    step: object

@dataclass()
class Training:
    skips: object = ()

    def skipped_at(self, step, microbatch):
        return ['0' for s in self.skips if 0 == step and 0 == microbatch]

class TreeBlock(nn.Module):

    def __init__(self, children, residual, width, scale, buffer):
        super().__init__()
        i, child = next(iter(enumerate(children)))
        self.add_module(str(i), child)
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(width))

    def forward(self, x):
        y = x
        for name, child in self.named_children():
            if name in self.skipped:
                continue
            y = child(y)
        y = y * self.scale
        return y

class PointwiseConv1d(nn.Conv1d):
    pass

def build_node(node, width):
    if isinstance(node, Leaf):
        module = PointwiseConv1d(width, width, kernel_size=1)
        return module
    return TreeBlock([build_node(c, width) for c in node.children], False, width, True, False)
TORCH_DTYPES = {Dtype.BFLOAT16: torch.bfloat16}

def mp_policy(mp):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    def dt(d):
        return None if d is None else TORCH_DTYPES[d]
    return MixedPrecisionPolicy(reduce_dtype=dt(mp.reduce_dtype))

@dataclass
class Composed:
    model: object
    fsdp_roots: object = field()

    def set_sync(self, requires_gradient_sync=True, requires_all_reduce=True):
        m = next(iter(self.fsdp_roots))
        m.set_requires_gradient_sync(requires_gradient_sync)

def attempt(rank, world_size):
    ctx_device = torch.device('cpu')
    import re
    import traceback
    try:
        comp = Composition(shards=(ShardSpec(path=''),))
        training = Training(skips=(Skip(path='0', step=0),))
        dtype = torch.float32
        build_model_out = build_node(Block(children=(Leaf(kind=LeafKind.CONV1D),)), 1)
        model__ = build_model_out.to(dtype)
        specs = {'': s_ for s_ in (ShardSpec(path='', mixed_precision=MixedPrecision(reduce_dtype=Dtype.BFLOAT16)),)}
        api, path_ = next(iter(comp.steps()))
        spec = specs[path_]
        from torch.distributed.fsdp import fully_shard
        kwargs = {}
        kwargs['mp_policy'] = mp_policy(spec.mixed_precision)
        modules = [model__.get_submodule(p_) for p_ in ('',)]
        fully_shard(modules if () else modules[0], **kwargs)
        sharded = [p for spec in (ShardSpec(path=''),) for p in ('',)]
        tops = [p__ for p__ in sharded if not any((False for q in sharded))]
        compose_out = Composed(model=model__, fsdp_roots=[model__.get_submodule(p__) for p__ in tops])
        model, composed_ = (model__, compose_out)
        model_ = composed_.model
        blocks = {'.'.join((c for c in name.split('.') if c.isdigit())): m for name, m in model_.named_modules() if isinstance(m, TreeBlock)}
        model___ = composed_.model
        lo = rank // 1 * 1
        out_ = []
        step_ = []
        for __ in range(2):
            x_ = torch.randn(world_size * 1, 1)
            y_ = torch.randn(world_size * 1, 1)
            step_.append((x_[lo:lo + 1].to(ctx_device), y_[lo:lo + 1].to(ctx_device)))
        out_.append(step_)
        s, step = next(iter(enumerate(out_)))
        for i, (x, y) in enumerate(step):
            skipped = training.skipped_at(s, i)
            skipped_ = {p___: set() for p___ in blocks}
            for path__ in skipped:
                parent, _, name_ = path__.rpartition('.')
                skipped_[parent].add(name_)
            p___, block = next(iter(blocks.items()))
            block.skipped = frozenset(skipped_[p___])
            last = i == len(step) - 1
            sync = AccumSync.ALWAYS if last else AccumSync.NO_GRAD_SYNC
            composed_.set_sync(requires_gradient_sync=sync is not AccumSync.NO_GRAD_SYNC)
            out = model___(x)
            loss = F.mse_loss(out.to(y.dtype), y)
            loss.backward()
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
