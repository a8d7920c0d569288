#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=8a961ec26fda3260 sources=c2f9d3144d82dce8 seconds=184.8
"""Reproduces shardfuzz corpus entry state_dict-exception-ab49bbd468b0.json: exception:state_dict:builtins.AssertionError@torch/distributed/fsdp/_state_dict_utils.py:_common_unshard_post_state_dict_hook

Observed: FSDP1 NO_SHARD (use_orig_params) with an auto-wrapped unit whose parameters are all
frozen: after a training step state_dict() raises 'FSDP assumes ... is in the state_dict'.
docs/state_dict.md. (rank 0 raised builtins.AssertionError: FSDP assumes 0.weight is in the
state_dict but the state_dict only has odict_keys(['1.0.weight', '1.0.bias']). prefix=,
module_name=0., param_name=weight rank=0.)
Known torch bug: FSDP1 NO_SHARD with an auto-wrapped unit of frozen parameters: state_dict()
after training raises 'FSDP assumes ... is in the state_dict'; upstream:
https://github.com/pytorch/pytorch/issues/85831.
Expected: no rank raises.

    torchrun --nproc-per-node 2 THIS_FILE.py

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
    LINEAR = 'linear'

class Dtype(str, enum.Enum):
    FLOAT32 = 'float32'

@dataclass()
class Leaf:
    kind: object
    frozen: object = False

@dataclass()
class Block:
    children: object

@dataclass()
class ModuleTree:
    width: object
    root: object

class Wrapper(str, enum.Enum):
    FSDP1_NO_SHARD = 'fsdp1_no_shard'

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
class Options:
    pass

@dataclass()
class StateDictBody(Body):
    tree: object
    source: object
    target: object
    training: object = field()
    load: object = field()

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
        if node.frozen:
            module.requires_grad_(False)
        return module
    return TreeBlock([build_node(c, width) for c in node.children], False, width, False, False)
TORCH_DTYPES = {Dtype.FLOAT32: torch.float32}

def batches(case, training, width, ctx, tp_size=1):
    lo = ctx.rank // tp_size * 2
    out = []
    step = []
    x = torch.randn(ctx.world_size * 2, width)
    y = torch.randn(ctx.world_size * 2, width)
    step.append((x[lo:lo + 2].to(ctx.device), y[lo:lo + 2].to(ctx.device)))
    out.append(step)
    return out

def attempt(rank, world_size):
    case = Case(property='state_dict', world_size=2, seed=37, body=StateDictBody(tree=ModuleTree(width=2, root=Block(children=())), source=Composition(), target=Composition(), training=Training(), load=Options()))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import re
    import traceback
    try:
        t = Training()
        data = [step[0] for step in batches(case, replace(t), 2, ctx)]
        build_model_out = build_node(Block(children=(Leaf(kind=LeafKind.LINEAR, frozen=True), Block(children=(Leaf(kind=LeafKind.LINEAR),)))), 2)
        model = build_model_out.to(TORCH_DTYPES[t.dtype])
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        strategy = {Wrapper.FSDP1_NO_SHARD: ShardingStrategy.NO_SHARD}[Wrapper.FSDP1_NO_SHARD]
        kwargs = {'sharding_strategy': strategy, 'device_id': torch.device('cpu'), 'use_orig_params': True}
        kwargs['auto_wrap_policy'] = ModuleWrapPolicy({TreeBlock})
        wrap_out = FSDP(model, **kwargs)
        data_ = data[:2]
        x, y = next(iter(data_))
        loss = F.mse_loss(wrap_out(x).to(y.dtype), y)
        loss.backward()
        msd, osd = (wrap_out.state_dict(),)
    except BaseException as e:
        frames = re.findall('File "([^"]+)", line \\d+, in (\\S+)', traceback.format_exc())
        path, fn = [(p, f) for p, f in frames if '/torch/' in p and (not f.endswith('comp>'))][-1]
        found = f'{type(e).__module__}.{type(e).__qualname__}@torch/{path.rpartition("/torch/")[2]}:{fn}'
        if found in ['builtins.AssertionError@torch/distributed/fsdp/_state_dict_utils.py:_common_unshard_post_state_dict_hook']:
            return f'REPRODUCED exception:state_dict:builtins.AssertionError@torch/distributed/fsdp/_state_dict_utils.py:_common_unshard_post_state_dict_hook: rank {rank} raised {found}: {e}'
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
