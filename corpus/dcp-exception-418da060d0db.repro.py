#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=ddc9107588b830c3 sources=7d6f5cb23a31c8e4 seconds=287.0
"""Reproduces shardfuzz corpus entry dcp-exception-418da060d0db.json: exception:dcp:builtins.KeyError@torch/distributed/checkpoint/state_dict.py:_get_optim_state_dict

Observed: The FSDP2 bug of corpus/parity-mismatch-5f3ad2a543cd (a frozen unit with
reshard_after_forward=False under a replicate()d root is never resharded) met through
get_optimizer_state_dict: the optimizer holds the sharded parameter, the module the unsharded
one, so the optimizer's parameter has no name. Passes with reshard_after_forward=True or a
fully_shard root. docs/known_bugs.md. (rank 0 raised builtins.KeyError: 0)
Known torch bug: a frozen fully_shard unit without resharding under a replicate'd root is never
resharded: a leaf unfrozen later never trains (KeyError in get_optimizer_state_dict); upstream:
none found.
Expected: no rank raises.

    torchrun --nproc-per-node 4 THIS_FILE.py

prints REPRODUCED and exits 1 while the failure is there, else exits 0.
"""

from __future__ import annotations
import torch
import enum
from torch import nn
import torch.nn.functional as F
from dataclasses import dataclass, field, replace

@dataclass
class RankContext:
    rank: object
    world_size: object
    device: object
    backend: object

class LeafKind(str, enum.Enum):
    CONV1D = 'conv1d'

class Dtype(str, enum.Enum):
    FLOAT32 = 'float32'

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
class Composition:
    pass

@dataclass()
class Training:
    dtype: object = Dtype.FLOAT32

class Body:
    pass

@dataclass()
class Case:
    property: object
    world_size: object
    seed: object
    body: object

@dataclass()
class DcpBody(Body):
    tree: object
    source: object
    target: object
    entries: object
    training: object = field()

class TreeBlock(nn.Module):

    def __init__(self, children, residual, width, scale, buffer):
        super().__init__()
        i, child = next(iter(enumerate(children)))
        self.add_module(str(i), child)

    def forward(self, x):
        y = x
        name, child = next(iter(self.named_children()))
        y = child(y)
        return y

class PointwiseConv1d(nn.Conv1d):
    pass

def build_node(node, width):
    if isinstance(node, Leaf):
        module = PointwiseConv1d(width, width, kernel_size=1)
        return module
    return TreeBlock([build_node(c, width) for c in node.children], False, width, False, False)
TORCH_DTYPES = {Dtype.FLOAT32: torch.float32}

def batches(case, training, width, ctx, tp_size=1):
    lo = ctx.rank // tp_size * 1
    out = []
    step = []
    x = torch.randn(ctx.world_size * 1, width)
    y = torch.randn(ctx.world_size * 1, width)
    step.append((x[lo:lo + 1].to(ctx.device), y[lo:lo + 1].to(ctx.device)))
    out.append(step)
    return out

def attempt(rank, world_size):
    case = Case(property='dcp', world_size=4, seed=0, body=DcpBody(tree=ModuleTree(width=1, root=Block(children=())), source=Composition(), target=Composition(), entries=(), training=Training()))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import re
    import traceback
    try:
        t = Training()
        data = [step[0] for step in batches(case, replace(t), 1, ctx)]
        comp_shards = ()
        build_model_out = build_node(Block(children=(Leaf(kind=LeafKind.CONV1D),)), 1)
        model = build_model_out.to(TORCH_DTYPES[t.dtype])
        from torch.distributed.fsdp import fully_shard
        modules = [model.get_submodule(p_) for p_ in ('0',)]
        fully_shard(modules if () else modules[0])
        sharded = [p for spec in comp_shards for p in ()]
        params = list(model.parameters())
        src_opt = torch.optim.SGD(params)
        data_ = data[:1]
        x, y = next(iter(data_))
        loss = F.mse_loss(model(x).to(y.dtype), y)
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
        out[DcpItem.COUNTER] = get_optimizer_state_dict(model, src_opt)
    except BaseException as e:
        frames = re.findall('File "([^"]+)", line \\d+, in (\\S+)', traceback.format_exc())
        path, fn = [(p, f) for p, f in frames if '/torch/' in p and (not f.endswith('comp>'))][-1]
        found = f'{type(e).__module__}.{type(e).__qualname__}@torch/{path.rpartition("/torch/")[2]}:{fn}'
        if found in ['builtins.KeyError@torch/distributed/checkpoint/state_dict.py:_get_optim_state_dict']:
            return f'REPRODUCED exception:dcp:builtins.KeyError@torch/distributed/checkpoint/state_dict.py:_get_optim_state_dict: rank {rank} raised {found}: {e}'
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
