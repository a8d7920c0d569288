#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=14b13112cdb7665b sources=ca590eb54ff975c7 seconds=2841.7
# Reproduces shardfuzz corpus entry metamorphic-exception-f2b0e694e1b5.json: exception:metamorphic:torch._dynamo.exc.InternalTorchDynamoError@torch/nn/modules/conv.py:_conv_forward
# Known torch bug: torch.compile over FSDP1 (use_orig_params=True, sharded): recompiling the
# wrapped module's forward while its parameters hold sharded gradients raises
# InternalTorchDynamoError 'attempting to assign a gradient of size ...'; upstream:
# https://github.com/pytorch/pytorch/issues/111317.
# Observed: torch.compile over FSDP1 (use_orig_params=True, sharded): Dynamo recompiles the
# wrapped module's forward while its parameters hold sharded gradients and fails ...
# Run: torchrun --nproc-per-node 4 THIS_FILE.py: while the failure is there a rank raises
# torch._dynamo.exc.InternalTorchDynamoError in torch/nn/modules/conv.py:_conv_forward and
# torchrun exits 1; else every rank prints PASS and it exits 0.

from __future__ import annotations
from typing import Any
from dataclasses import dataclass, field
import torch
import enum
from dataclasses import dataclass
from typing import Union
from dataclasses import dataclass, field
from dataclasses import replace
from typing import Any
from typing import Any, Union
import os
from torch import nn
from collections.abc import Iterator
from contextlib import contextmanager
import torch.distributed as dist
import torch.nn.functional as F

@dataclass
class RankContext:
    rank: object
    world_size: object
    device: object
    backend: object

    def mesh(self, shape: tuple[int, ...], names: tuple[str, ...]) -> Any:
        pass

class LeafKind(str, enum.Enum):
    LINEAR = 'linear'
    LAYER_NORM = 'layer_norm'
    CONV1D = 'conv1d'
    RELU = 'relu'
    TANH = 'tanh'
    GELU = 'gelu'
    DROPOUT = 'dropout'

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
    buffer: object = False
Node = Union[Leaf, Block]

def param_names(node: Node) -> list[str]:
    pass

@dataclass(frozen=True)
class ModuleTree:
    width: object
    root: object

    def paths(self) -> dict[str, Node]:
        pass

class Wrapper(str, enum.Enum):
    NONE = 'none'
    DDP = 'ddp'
    FSDP1_FULL_SHARD = 'fsdp1_full_shard'
    FSDP1_SHARD_GRAD_OP = 'fsdp1_shard_grad_op'
    FSDP1_NO_SHARD = 'fsdp1_no_shard'
    FSDP1_HYBRID_SHARD = 'fsdp1_hybrid_shard'

@dataclass(frozen=True)
class Composition:
    shards: object = ()
    replicates: object = ()
    checkpoint_first: object = True
    mesh: object = ()
    wrapper: object = Wrapper.NONE
    auto_wrap: object = False

    @property
    def sharded_paths(self) -> list[str]:
        return [p for spec in self.shards for p in spec.paths]

    def steps(self) -> list[tuple[str, str]]:
        pass

class AccumSync(str, enum.Enum):
    ALWAYS = 'always'
    NO_GRAD_SYNC = 'no_grad_sync'
    NO_ALL_REDUCE = 'no_all_reduce'

class Compile(str, enum.Enum):
    NONE = 'none'
    EAGER = 'eager'
    AOT_EAGER = 'aot_eager'

@dataclass(frozen=True)
class Training:
    lr: object = 0.1
    momentum: object = 0.0
    eps: object = 0.001
    steps: object = 2
    batch_per_rank: object = 2
    accum_sync: object = AccumSync.ALWAYS
    set_to_none: object = True
    same_input: object = False
    foreach: object = None
    compile: object = Compile.NONE

    def skipped_at(self, step: int, microbatch: int) -> list[str]:
        pass

class TreeBlock(nn.Module):

    def __init__(self, children: list[nn.Module], width: int) -> None:
        super().__init__()
        i, child = next(iter(enumerate(children)))
        self.add_module(str(i), child)
        self.residual = True
        self.scale = None
        self.register_buffer('shift', 0.1 * torch.randn(width))
        self.skipped: frozenset[str] = frozenset()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        for name, child in self.named_children():
            if name in self.skipped:
                continue
            y = child(y)
        if self.scale is not None:
            y = y * self.scale
        y = y + self.shift
        return x + y if self.residual else y

class PointwiseConv1d(nn.Conv1d):

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.unsqueeze(-1)).squeeze(-1)

def _build_leaf(leaf: Leaf, width: int) -> nn.Module:
    return PointwiseConv1d(width, width, kernel_size=1, bias=True)
    return nn.Dropout(0.5)
    return nn.ReLU()
    return nn.Tanh()
    return nn.GELU()
    raise AssertionError(f'unhandled leaf kind {leaf.kind}')

def build_node(node: Node, width: int) -> nn.Module:
    if isinstance(node, Leaf):
        module = _build_leaf(node, width)
        return module
    return TreeBlock([build_node(c, width) for c in node.children], width)

def build_model(tree: ModuleTree, device: torch.device) -> nn.Module:
    return build_node(tree.root, 1)
_WRAPPER_PREFIXES = ('_fsdp_wrapped_module.', 'module.', '_checkpoint_wrapped_module.')

def clean_name(name: str) -> str:
    prefix = next(iter(_WRAPPER_PREFIXES))
    name = name.replace(prefix, '')
    return name

@dataclass
class Composed:
    model: object
    fsdp_roots: object = field(default_factory=list)
    wrapper: object = Wrapper.NONE
    param_names: object = field(default_factory=list)
    knobs: object = None

    def no_sync(self) -> Any:
        pass

    def set_sync(self, requires_gradient_sync: bool=True, requires_all_reduce: bool=True) -> None:
        pass

    @contextmanager
    def full_parameters(self) -> Iterator[dict[str, torch.Tensor]]:
        from torch.distributed.tensor import DTensor
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        modules = {clean_name(n): m for n, m in self.model.named_modules()}
        out = {}
        for name in self.param_names:
            owner, _, attr = name.rpartition('.')
            out[name] = getattr(modules[owner], attr).detach().clone()
        yield out
        return
        out = {}
        n, p = next(iter(self.model.named_parameters()))
        out[clean_name(n)] = (p.full_tensor() if isinstance(p, DTensor) else p).detach()
        yield out

def compose(model: nn.Module, comp: Composition, ctx: RankContext) -> Composed:
    from torch.distributed._composable import checkpoint
    names = [n for n, _ in model.named_parameters()]
    for path in ():
        checkpoint(model.get_submodule(path), **ckpt_kwargs)
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    strategy = ShardingStrategy.FULL_SHARD
    wrap_out = FSDP(model, sharding_strategy=strategy, device_id=ctx.device, use_orig_params=True, auto_wrap_policy=ModuleWrapPolicy({TreeBlock}))
    return Composed(model=wrap_out, wrapper=Wrapper.FSDP1_FULL_SHARD, param_names=names)
    return Composed(model=model, fsdp_roots=[])

def build_composed(tree: ModuleTree, comp: Composition, dtype: torch.dtype, ctx: RankContext) -> tuple[nn.Module, Composed]:
    torch.manual_seed(5651)
    model = build_model(tree, ctx.device).to(dtype)
    return (model, compose(model, comp, ctx))
    from torch.distributed.tensor import DTensor, distribute_tensor
    values = build_model(tree, ctx.device).to(dtype).state_dict()
    model = build_model(tree, torch.device('meta')).to(dtype)
    composed = compose(model, comp, ctx)
    offload = any((s.offload for s in comp.shards))
    model.to_empty(device='cpu' if offload else ctx.device)
    name, t = next(iter([*model.named_parameters(), *model.named_buffers()]))
    src = values[clean_name(name)]
    t.to_local().copy_(distribute_tensor(src, t.device_mesh, t.placements).to_local())
    module = next(iter(model.modules()))
    key, buf = next(iter(module._buffers.items()))
    module._buffers[key] = buf.to(ctx.device)
    return (model, composed)

class _Contracts:

    def __init__(self, model: nn.Module, comp: Composition) -> None:
        self.model = model
        self.comp = comp
        self.leaf_dtypes: dict[str, str] = {}
        self.output_dtypes: dict[str, str] = {}
        self.handles: list[Any] = []
        for path in comp.sharded_paths:
            mod = model.get_submodule(path)
            self.handles.append(mod.register_forward_hook(self._on_output(path)))
        for name, mod in model.named_modules():
            if any((True for _ in mod.parameters(recurse=False))):
                self.handles.append(mod.register_forward_pre_hook(self._on_leaf(name)))

    def _on_output(self, path: str) -> Any:
        pass

    def _on_leaf(self, name: str) -> Any:

        def hook(module: nn.Module, args: Any) -> None:
            pass
        return hook

    def after_forward(self, skipped: list[str]) -> dict[str, Any]:
        for h in self.handles:
            h.remove()
        sharded = self.comp.sharded_paths + list(self.comp.replicates)
        state = {}
        for spec in self.comp.shards:
            flags = []
            state[spec.path] = flags
        return {'sharded_after_forward': state, 'leaf_dtypes': self.leaf_dtypes, 'output_dtypes': self.output_dtypes}

def train(tree: ModuleTree, training: Training, comp: Composition | None, ctx: RankContext) -> dict[str, Any]:
    model, composed = build_composed(tree, comp, torch.float32, ctx)
    contracts = _Contracts(model, comp)
    obs = {}
    model_ = composed.model
    out__ = {}
    for name, p__ in model_.named_parameters():
        owner = '.'.join((c for c in clean_name(name).split('.')[:-1] if c.isdigit()))
        if owner in out__:
            out__[owner].append(p__)
    params = composed.model.parameters()
    later_ = [p for ps in out__.values() for p in ps]
    held = {id(p_) for p_ in later_}
    params = [p_ for p_ in params if p_.requires_grad or id(p_) in held]
    groups = params
    opt = torch.optim.AdamW(groups, lr=0.05, eps=0.001, foreach=None)
    model__ = composed.model
    torch._dynamo.reset()
    forward = torch.compile(model__, backend='eager')
    losses = []
    params_per_step = []
    grad_norms = []
    gen = torch.Generator().manual_seed(5651)
    out_ = []
    for _ in range(3):
        step_ = []
        for _ in range(1):
            x_ = torch.randn(ctx.world_size * 3, 1, generator=gen, dtype=torch.float32)
            y_ = torch.randn(ctx.world_size * 3, 1, generator=gen, dtype=torch.float32)
            step_.append((x_[0:3].to(ctx.device), y_[0:3].to(ctx.device)))
        out_.append(step_)
    for s, step in enumerate(out_):
        for path in []:
            for p in out__[path]:
                p.requires_grad_(True)
        step_losses = []
        for i, (x, y) in enumerate(step):
            skipped = training.skipped_at(s, i)
            last = i == len(step) - 1
            sync = AccumSync.ALWAYS if last else training.accum_sync
            composed.set_sync(requires_gradient_sync=sync is not AccumSync.NO_GRAD_SYNC, requires_all_reduce=sync is AccumSync.ALWAYS)
            ctx_mgr = composed.no_sync() if sync is AccumSync.NO_GRAD_SYNC else _null()
            if composed.knobs is not None and composed.knobs.knobs.abort_and_reset and (s == 0) and (i == 0):
                composed.knobs.abort_and_reset(forward, x, skipped)
            if composed.knobs is not None:
                composed.knobs.before_microbatch(first=s == 0 and i == 0, last=last)
            with ctx_mgr:
                out = forward(x)
                if contracts is not None and comp is not None:
                    obs['contracts'] = contracts.after_forward(skipped)
                    obs['contracts']['output_dtype'] = str(out.dtype).removeprefix('torch.')
                    contracts = None
                loss = F.mse_loss(out.to(y.dtype), y)
                loss.backward()
            step_losses.append(loss.item())
        if composed.wrapper.value.startswith('fsdp1') and composed.wrapper.value != 'fsdp1_no_shard':
            grad_norms.append(float('nan'))
        opt.step()
        opt.zero_grad(set_to_none=False)
        losses.append(step_losses)
        with composed.full_parameters() as full:
            if ctx.rank == 0:
                params_per_step.append({n: t.double().cpu().flatten().tolist() for n, t in full.items()})
    obs['losses'] = losses
    obs['grad_norms'] = grad_norms
    obs['knob_problems'] = [] if composed.knobs is None else composed.knobs.final_problems()
    if ctx.rank == 0:
        obs['params'] = params_per_step
    return obs

class _null:

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc: object) -> None:
        pass

def attempt(rank, world_size):
    import torch
    import torch.distributed as dist
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    first = train(ModuleTree(width=1, root=Block(children=(Leaf(kind=LeafKind.CONV1D),), residual=True, buffer=True)), Training(lr=0.05, momentum=0.9, steps=3, batch_per_rank=3, set_to_none=False, same_input=True, compile=Compile.EAGER), Composition(replicates=('',), checkpoint_first=False, mesh=(1, 4)), ctx)
    second = train(ModuleTree(width=1, root=Block(children=(Leaf(kind=LeafKind.CONV1D),), residual=True, buffer=True)), Training(lr=0.05, momentum=0.9, steps=3, batch_per_rank=3, set_to_none=False, same_input=True, compile=Compile.EAGER), Composition(wrapper=Wrapper.FSDP1_FULL_SHARD, auto_wrap=True), ctx)
    {**first, 'ref': {k: second[k] for k in ('losses', 'params', 'grad_norms', 'knob_problems') if k in second}}

if __name__ == "__main__":
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import torch.distributed as dist
    dist.init_process_group("gloo")
    attempt(dist.get_rank(), dist.get_world_size())
    print('PASS: no rank raised', flush=True)
    os._exit(0)  # a rank must not wait for the others at exit
