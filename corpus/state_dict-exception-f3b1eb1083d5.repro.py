#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=05f2a60d585ed364 sources=5f5e88fa2ae7132f seconds=151.8
"""Reproduces shardfuzz corpus entry state_dict-exception-f3b1eb1083d5.json: exception:state_dict:builtins.RuntimeError@torch/distributed/checkpoint/state_dict.py:_split_optim_state_dict

Observed: get_optimizer_state_dict keys a fused module's parameters (a child its state-dict
hooks hide, declared by _fqn_modifiers) by named_parameters' names, set_optimizer_state_dict
looks for the model state dict's: a strict load raises. Any model, sharded or not. (rank 0
raised builtins.RuntimeError: Missing optimizer state for parameter '0.1.weight' in checkpoint.
The parameter requires gradients but has no saved optimizer state. To load anyway, use
StateDictOptions(strict=False).)
Known torch bug: a module whose state-dict hooks hide a child, declared through its fqn
modifiers method (StateDictOptions.dsd_fqn_modifiers): get_optimizer_state_dict keys that
child's parameters by named_parameters' names ('0.fused.weight'), set_optimizer_state_dict looks
them up by the model state dict's ('0.weight'), so a get/set round trip of the optimizer fails:
strict raises RuntimeError 'Missing optimizer state for parameter', non-strict drops that state,
flattened raises KeyError 'param_groups.<fqn>.lr'. Any model, sharded or not; upstream: none
found.
Expected: no rank raises.

    torchrun --nproc-per-node 2 THIS_FILE.py

prints REPRODUCED and exits 1 while the failure is there, else exits 0.
"""

from __future__ import annotations
import torch
import enum
from torch import nn
from dataclasses import dataclass, field, replace

@dataclass
class RankContext:
    rank: object
    world_size: object
    device: object
    backend: object

class LeafKind(str, enum.Enum):
    CONV1D = 'conv1d'
    RELU = 'relu'

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
    shards: object = ()

    @property
    def sharded_paths(self):
        return [p for spec in self.shards for p in ()]

@dataclass()
class Training:
    momentum: object = 0.0
    dtype: object = Dtype.FLOAT32
DEFAULT_FQN_MODIFIERS = '_fqn_modifiers'

class PointwiseConv1d(nn.Conv1d):
    pass

def build_node(node, width):
    if isinstance(node, Leaf):
        module = PointwiseConv1d(width, width, kernel_size=1)
        return module
    return nn.Sequential(*[build_node(c, width) for c in node.children])
FUSED_CHILD = 'fused'

class FusedLeaf(nn.Module):

    def __init__(self, leaf, method=DEFAULT_FQN_MODIFIERS):
        super().__init__()
        self.add_module(FUSED_CHILD, leaf)
        self._atoms = [n for n, _ in leaf.named_parameters()]
        object.__setattr__(self, method, self.key_modifiers)

    def key_modifiers(self):
        return {atom: FUSED_CHILD for atom in self._atoms}
TORCH_DTYPES = {Dtype.FLOAT32: torch.float32}

@dataclass
class Composed:
    model: object
    fsdp_roots: object = field()
FRESH_SEED = 24301

@dataclass
class Side:
    composed: object
    comp: object
    training: object

    @property
    def model(self):
        return self.composed.model

def build_side(tree, comp, training, ctx, *, seed, meta=False, schedule=(), fused=(), fqn_modifiers=DEFAULT_FQN_MODIFIERS):
    build_model_out = build_node(tree.root, 1)
    model = build_model_out.to(TORCH_DTYPES[training.dtype])
    path = next(iter(fused))
    parent, _, name = path.rpartition('.')
    owner = model.get_submodule(parent)
    owner.add_module(name, FusedLeaf(owner.get_submodule(name), fqn_modifiers))
    sharded = comp.sharded_paths
    tops = [p for p in sharded if not any((False for q in sharded))]
    composed = Composed(model=model, fsdp_roots=[model.get_submodule(p) for p in tops])
    return Side(composed=composed, comp=comp, training=training)

def body_optimizer(side, training):
    params = list(side.model.parameters())
    side.opt = torch.optim.SGD(params, momentum=training.momentum)

def attempt(rank, world_size):
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import re
    import traceback
    try:
        t = Training(momentum=0.9)
        fused = {'fused': ('0.2',)}
        src = build_side(ModuleTree(width=1, root=Block(children=(Block(children=(Leaf(kind=LeafKind.RELU), Leaf(kind=LeafKind.CONV1D), Leaf(kind=LeafKind.CONV1D))),))), Composition(), t, ctx, seed=6424, **fused)
        body_optimizer(src, t)
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
        msd_ = get_model_state_dict(src.model)
        msd, osd = (msd_, get_optimizer_state_dict(src.model, src.opt))
        tgt = build_side(ModuleTree(width=1, root=Block(children=(Block(children=(Leaf(kind=LeafKind.RELU), Leaf(kind=LeafKind.CONV1D), Leaf(kind=LeafKind.CONV1D))),))), Composition(), t, ctx, seed=6424 + FRESH_SEED, **fused)
        fresh_training_out = replace(t)
        body_optimizer(tgt, fresh_training_out)
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict
        opt = tgt.opt
        set_optimizer_state_dict(tgt.model, opt, osd)
    except BaseException as e:
        frames = re.findall('File "([^"]+)", line \\d+, in (\\S+)', traceback.format_exc())
        at = [f"torch/{p.rpartition('/torch/')[2]}:{f}" for p, f in frames if '/torch/' in p and 'comp>' not in f]
        found = f"{type(e).__module__}.{type(e).__qualname__}@{(at or ['torch/?:?'])[-1]}"
        if found in ['builtins.AttributeError@torch/optim/sgd.py:_single_tensor_sgd', 'builtins.KeyError@torch/distributed/checkpoint/state_dict.py:_unflatten_optim_state_dict', 'builtins.KeyError@torch/optim/adam.py:step', 'builtins.KeyError@torch/optim/sgd.py:step', 'builtins.RuntimeError@torch/distributed/checkpoint/state_dict.py:_split_optim_state_dict', 'builtins.TypeError@torch/optim/adam.py:__setstate__'] and at[0] == 'torch/distributed/checkpoint/state_dict.py:set_optimizer_state_dict' and (re.sub('\\d+(?:\\.\\d+)*', '#', str(e).partition('\n')[0]) == "Missing optimizer state for parameter '#.weight' in checkpoint. The parameter requires gradients but has no saved optimizer state. To load anyway, use StateDictOptions(strict=False)."):
            return f'REPRODUCED exception:state_dict:builtins.RuntimeError@torch/distributed/checkpoint/state_dict.py:_split_optim_state_dict: rank {rank} raised {found}: {e}'
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
