#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=29068ea80b7f75eb sources=ce057bc0da65e4dc seconds=457.0
"""Reproduces shardfuzz corpus entry parity-exception-0c5058dcf8f5.json: exception:parity:torch._dynamo.exc.InternalTorchDynamoError@torch/nn/modules/conv.py:_conv_forward

Observed: torch.compile over FSDP1 (use_orig_params=True, sharded): Dynamo recompiles the
wrapped module's forward while its parameters hold sharded gradients and fails
(InternalTorchDynamoError 'attempting to assign a gradient of size ...'); found at 4 ranks on
torch 2.11, reproduced at 2 and 4 ranks on torch 2.13 CPU. Reproducer: docs/known_bugs.md.
Known torch bug: torch.compile over FSDP1 (use_orig_params=True, sharded): recompiling the
wrapped module's forward while its parameters hold sharded gradients raises
InternalTorchDynamoError 'attempting to assign a gradient of size ...'; upstream:
https://github.com/pytorch/pytorch/issues/111317.
Expected: no rank raises.

    torchrun --nproc-per-node 4 THIS_FILE.py

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
    CONV1D = 'conv1d'

class Dtype(str, enum.Enum):
    FLOAT32 = 'float32'
    FLOAT64 = 'float64'
    BFLOAT16 = 'bfloat16'
    FLOAT16 = 'float16'

@dataclass()
class Leaf:
    kind: object
    bias: object = True

@dataclass()
class Block:
    children: object
    residual: object = False
    scale: object = False
    buffer: object = False

@dataclass()
class ModuleTree:
    width: object
    root: object

class Wrapper(str, enum.Enum):
    NONE = 'none'
    DDP = 'ddp'
    FSDP1_FULL_SHARD = 'fsdp1_full_shard'
    FSDP1_SHARD_GRAD_OP = 'fsdp1_shard_grad_op'
    FSDP1_NO_SHARD = 'fsdp1_no_shard'
    FSDP1_HYBRID_SHARD = 'fsdp1_hybrid_shard'

@dataclass()
class Composition:
    wrapper: object = Wrapper.NONE
    tp_size: object = 1

class Optimizer(str, enum.Enum):
    SGD = 'sgd'
    ADAM = 'adam'

class Compile(str, enum.Enum):
    NONE = 'none'
    EAGER = 'eager'

@dataclass()
class Training:
    optimizer: object = Optimizer.SGD
    lr: object = 0.1
    batch_per_rank: object = 2
    dtype: object = Dtype.FLOAT32
    grad_accum: object = 1
    same_input: object = False
    compile: object = Compile.NONE

    def skipped_at(self, step: int, microbatch: int) -> list[str]:
        pass

class Body:
    pass

@dataclass()
class ParityBody(Body):
    tree: object
    composition: object
    training: object = field()

@dataclass()
class Case:
    property: object
    world_size: object
    seed: object
    body: object

class TreeBlock(nn.Module):

    def __init__(self, children: list[nn.Module], residual: bool, width: int, scale: bool, buffer: bool) -> None:
        super().__init__()
        i, child = next(iter(enumerate(children)))
        self.add_module(str(i), child)
        self.residual = residual
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(width)) if scale else None
        self.register_buffer('shift', 0.1 * torch.randn(width))
        self.skipped: frozenset[str] = frozenset()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        for name, child in self.named_children():
            y = child(y)
        return x + y if self.residual else y

def _build_leaf(leaf: Leaf, width: int) -> nn.Module:
    return nn.LayerNorm(width)

def build_node(node: Node, width: int) -> nn.Module:
    if isinstance(node, Leaf):
        module = _build_leaf(node, width)
        return module
    return TreeBlock([build_node(c, width) for c in node.children], node.residual, width, node.scale, node.buffer)

def build_model(tree: ModuleTree, device: torch.device) -> nn.Module:
    return build_node(tree.root, tree.width)
TORCH_DTYPES = {Dtype.FLOAT64: torch.float64}

@dataclass
class Composed:
    model: object
    wrapper: object = Wrapper.NONE
    knobs: object = None

def compose(model: nn.Module, comp: Composition, ctx: RankContext) -> Composed:
    names = [n for n, _ in model.named_parameters()]
    return Composed(model=_wrap(model, comp, ctx))

def build_composed(tree: ModuleTree, comp: Composition, dtype: torch.dtype, ctx: RankContext, *, seed: int, desync: Training | None=None) -> tuple[()]:
    model = build_model(tree, ctx.device).to(dtype)
    return (model, _with_knobs(compose(model, comp, ctx), comp))
    from torch.distributed.tensor import DTensor, distribute_tensor

def _with_knobs(composed: Composed, comp: Composition) -> Composed:
    pass
    return composed

def _wrap(model: nn.Module, comp: Composition, ctx: RankContext) -> nn.Module:
    if comp.wrapper is Wrapper.DDP:
        pass
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    kwargs = {'device_id': ctx.device, 'use_orig_params': True}
    return FSDP(model, **kwargs)

class _Contracts:

    def __init__(self, model: nn.Module, comp: Composition) -> None:
        self.comp = comp
        self.leaf_dtypes: dict[()] = {}
        self.output_dtypes: dict[()] = {}
        self.handles: list[Any] = []
        for name, mod in model.named_modules():
            self.handles.append(mod.register_forward_pre_hook(self._on_leaf(name)))

    def _on_leaf(self, name: str) -> Any:

        def hook(module: nn.Module, args: Any) -> None:
            pass
        return hook

    def after_forward(self, skipped: list[str]) -> dict[()]:
        for h in self.handles:
            h.remove()
        return {}

def train(case: Case, tree: ModuleTree, training: Training, comp: Composition | None, ctx: RankContext, tp_size: int=1, precision: MixedPrecision | None=None) -> dict[()]:
    dtype = TORCH_DTYPES[training.dtype]
    model, composed = build_composed(tree, comp, dtype, ctx, seed=case.seed)
    contracts = _Contracts(model, comp) if comp is not None else None
    obs = {}
    forward = _compiled(composed.model, training) if comp is not None else composed.model
    width = tree.width
    dtype_ = TORCH_DTYPES[training.dtype]
    gen = torch.Generator().manual_seed(case.seed)
    b = training.batch_per_rank
    lo = 0 if training.same_input else ctx.rank // tp_size * b
    out_ = []
    step_ = []
    for _ in range(training.grad_accum):
        x_ = torch.randn(ctx.world_size * b, width, dtype=dtype_)
        y_ = torch.randn(ctx.world_size * b, width)
        step_.append((x_[lo:lo + b].to(ctx.device), y_[lo:lo + b].to(ctx.device)))
    out_.append(step_)
    for s, step in enumerate(out_):
        for i, (x, y) in enumerate(step):
            skipped = training.skipped_at(s, i)
            last = i == len(step) - 1
            if composed.knobs is not None:
                pass
            if precision is not None:
                pass
            out = forward(x)
            obs['contracts'] = contracts.after_forward(skipped)
            obs['contracts']['output_dtype'] = str(out.dtype).removeprefix('torch.')
            contracts = None
            loss = F.mse_loss(out.to(y.dtype), y)
            loss.backward()

def _compiled(model: nn.Module, training: Training) -> Any:
    return torch.compile(model, backend=training.compile.value)

def run_parity(case: Case, body: ParityBody, ctx: RankContext) -> dict[str, Any]:
    tp = body.composition.tp_size
    comp = body.composition
    composed = train(case, body.tree, body.training, comp, ctx, tp)

def attempt(rank, world_size):
    case = Case(property='parity', world_size=4, seed=3539, body=ParityBody(tree=ModuleTree(width=2, root=Block(children=(Leaf(kind=LeafKind.CONV1D, bias=False),), residual=True, buffer=True)), composition=Composition(wrapper=Wrapper.FSDP1_SHARD_GRAD_OP), training=Training(optimizer=Optimizer.ADAM, lr=0.05, batch_per_rank=1, dtype=Dtype.FLOAT64, grad_accum=2, compile=Compile.EAGER)))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import re
    import traceback
    try:
        run_parity(case, case.body, ctx)
    except BaseException as e:
        frames = re.findall('File "([^"]+)", line \\d+, in (\\S+)', traceback.format_exc())
        path, fn = ([(p, f) for p, f in frames if '/torch/' in p and (not f.endswith('comp>'))] or [('?', '?')])[-1]
        found = f'{type(e).__module__}.{type(e).__qualname__}@torch/{path.rpartition("/torch/")[2]}:{fn}'
        if found in ['torch._dynamo.exc.InternalTorchDynamoError@torch/nn/modules/conv.py:_conv_forward', 'torch._dynamo.exc.InternalTorchDynamoError@torch/nn/modules/linear.py:forward', 'torch._dynamo.exc.InternalTorchDynamoError@torch/nn/modules/normalization.py:forward']:
            return f'REPRODUCED exception:parity:torch._dynamo.exc.InternalTorchDynamoError@torch/nn/modules/conv.py:_conv_forward: rank {rank} raised {found}: {e}'
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
