#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=14b13112cdb7665b sources=ca590eb54ff975c7 seconds=1433.5
"""Reproduces shardfuzz corpus entry metamorphic-exception-f2b0e694e1b5.json: exception:metamorphic:torch._dynamo.exc.InternalTorchDynamoError@torch/nn/modules/conv.py:_conv_forward
Known torch bug: torch.compile over FSDP1 (use_orig_params=True, sharded): recompiling the
wrapped module's forward while its parameters hold sharded gradients raises
InternalTorchDynamoError 'attempting to assign a gradient of size ...'; upstream:
https://github.com/pytorch/pytorch/issues/111317.
Observed: torch.compile over FSDP1 (use_orig_params=True, sharded): Dynamo recompiles the
wrapped module's forward while its parameters hold sharded gradients and fails ...
Run: torchrun --nproc-per-node 4 THIS_FILE.py: prints REPRODUCED and exits 1 while the
failure is there, else exits 0 (expected: no rank raises).
"""

from __future__ import annotations
from typing import Any
from dataclasses import dataclass, field
import torch
import enum
from dataclasses import dataclass
from typing import Union
from dataclasses import dataclass, field
from dataclasses import replace
from typing import Any, ClassVar
from typing import Any, Union
import os
from typing import ClassVar
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

def is_ancestor() -> bool:
    pass

class Wrapper(str, enum.Enum):
    NONE = 'none'
    DDP = 'ddp'
    FSDP1_FULL_SHARD = 'fsdp1_full_shard'
    FSDP1_SHARD_GRAD_OP = 'fsdp1_shard_grad_op'
    FSDP1_NO_SHARD = 'fsdp1_no_shard'
    FSDP1_HYBRID_SHARD = 'fsdp1_hybrid_shard'

@dataclass(frozen=True)
class MixedPrecision:
    output_dtype: object = None

@dataclass(frozen=True)
class Knobs:
    abort_and_reset: object = False

    @property
    def is_set(self) -> bool:
        pass

    def names(self) -> list[str]:
        pass

@dataclass(frozen=True)
class ReplicateOptions:
    device_id: object = False
    delay_all_reduce: object = False

    @property
    def is_set(self) -> bool:
        pass

    def names(self) -> list[str]:
        pass

@dataclass(frozen=True)
class Composition:
    shards: object = ()
    replicates: object = ()
    checkpoints: object = ()
    checkpoint_first: object = True
    mesh: object = ()
    wrapper: object = Wrapper.NONE
    auto_wrap: object = False
    meta_init: object = False
    tp: object = ()
    find_unused: object = False
    knobs: object = field(default_factory=Knobs)
    replicate_options: object = field(default_factory=ReplicateOptions)

    @property
    def sharded_paths(self) -> list[str]:
        return [p for spec in self.shards for p in spec.paths]

    def steps(self) -> list[tuple[str, str]]:
        items = [('checkpoint', p) for p in self.checkpoints] + [('replicate', p) for p in self.replicates]
        items += [('fully_shard', spec.path) for spec in self.shards]

        def key(item: tuple[str, str]) -> tuple[int, int, str]:
            pass
        return sorted(items, key=key)

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
    dtype: object = Dtype.FLOAT32
    grad_accum: object = 1
    accum_sync: object = AccumSync.ALWAYS
    set_to_none: object = True
    same_input: object = False
    param_groups: object = 1
    foreach: object = None
    unfreeze: object = ()
    compile: object = Compile.NONE

    def skipped_at(self, step: int, microbatch: int) -> list[str]:
        pass

class Body:
    KIND: ClassVar[str]
    PROGRAM: ClassVar[str]
    registry: ClassVar[dict[str, type[Body]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        pass

@dataclass(frozen=True)
class MetamorphicBody(Body):
    KIND: ClassVar[str] = 'metamorphic'
    PROGRAM: ClassVar[str] = 'fuzz._rank.parity:run_metamorphic'
    tree: object
    composition: object
    variant: object
    training: object = field(default_factory=Training)

@dataclass(frozen=True)
class Case:
    property: object
    world_size: object
    seed: object
    body: object

class TreeBlock(nn.Module):

    def __init__(self, children: list[nn.Module], residual: bool, width: int, scale: bool, buffer: bool) -> None:
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)
        self.residual = residual
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(width)) if scale else None
        if buffer:
            self.register_buffer('shift', 0.1 * torch.randn(width))
        else:
            self.shift = None
        self.skipped: frozenset[str] = frozenset()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        for name, child in self.named_children():
            if name in self.skipped:
                continue
            y = child(y)
        if self.scale is not None:
            y = y * self.scale
        if self.shift is not None:
            y = y + self.shift
        return x + y if self.residual else y

class PointwiseConv1d(nn.Conv1d):

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.unsqueeze(-1)).squeeze(-1)

def build_leaf(leaf: Leaf, width: int) -> nn.Module:
    module = _build_leaf(leaf, width)
    if leaf.frozen:
        module.requires_grad_(False)
    return module

def _build_leaf(leaf: Leaf, width: int) -> nn.Module:
    if leaf.kind is LeafKind.LINEAR:
        return nn.Linear(width, width, bias=leaf.bias)
    if leaf.kind is LeafKind.LAYER_NORM:
        return nn.LayerNorm(width, bias=leaf.bias)
    if leaf.kind is LeafKind.CONV1D:
        return PointwiseConv1d(width, width, kernel_size=1, bias=leaf.bias)
    if leaf.kind is LeafKind.DROPOUT:
        return nn.Dropout(0.5)
    if leaf.kind is LeafKind.RELU:
        return nn.ReLU()
    if leaf.kind is LeafKind.TANH:
        return nn.Tanh()
    if leaf.kind is LeafKind.GELU:
        return nn.GELU()
    raise AssertionError(f'unhandled leaf kind {leaf.kind}')

def build_node(node: Node, width: int) -> nn.Module:
    if isinstance(node, Leaf):
        return build_leaf(node, width)
    return TreeBlock([build_node(c, width) for c in node.children], node.residual, width, node.scale, node.buffer)

def build_model(tree: ModuleTree, device: torch.device) -> nn.Module:
    with torch.device(device):
        return build_node(tree.root, tree.width)
TORCH_DTYPES = {Dtype.FLOAT32: torch.float32, Dtype.FLOAT64: torch.float64, Dtype.BFLOAT16: torch.bfloat16, Dtype.FLOAT16: torch.float16}
_WRAPPER_PREFIXES = ('_fsdp_wrapped_module.', 'module.', '_checkpoint_wrapped_module.')

def clean_name(name: str) -> str:
    for prefix in _WRAPPER_PREFIXES:
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
        if self.wrapper.value.startswith('fsdp1'):
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            modules = {clean_name(n): m for n, m in self.model.named_modules()}
            with FSDP.summon_full_params(self.model):
                out = {}
                for name in self.param_names:
                    owner, _, attr = name.rpartition('.')
                    out[name] = getattr(modules[owner], attr).detach().clone()
                yield out
            return
        out = {}
        for n, p in self.model.named_parameters():
            out[clean_name(n)] = (p.full_tensor() if isinstance(p, DTensor) else p).detach()
        yield out

def compose(model: nn.Module, comp: Composition, ctx: RankContext) -> Composed:
    from torch.distributed._composable import checkpoint
    if comp.wrapper is not Wrapper.NONE:
        names = [n for n, _ in model.named_parameters()]
        for path in comp.checkpoints:
            checkpoint(model.get_submodule(path), **ckpt_kwargs)
        return Composed(model=_wrap(model, comp, ctx), wrapper=comp.wrapper, param_names=names)
    if comp.tp:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
        for pair in comp.tp:
            plan_colwise = ColwiseParallel()
            plan_rowwise = RowwiseParallel()
    specs = {s.path: s for s in comp.shards}
    for api, path in comp.steps():
        if api == 'checkpoint':
            checkpoint(model.get_submodule(path), **ckpt_kwargs)
        elif api == 'fully_shard':
            apply_fully_shard(model, specs[path], mesh)
    sharded = comp.sharded_paths
    tops = [p for p in sharded if not any((is_ancestor() for q in sharded))]
    return Composed(model=model, fsdp_roots=[model.get_submodule(p) for p in tops])

def build_composed(tree: ModuleTree, comp: Composition, dtype: torch.dtype, ctx: RankContext, *, seed: int, desync: Training | None=None) -> tuple[nn.Module, Composed]:
    torch.manual_seed(seed)
    if not comp.meta_init:
        model = build_model(tree, ctx.device).to(dtype)
        if desync is not None:
            pass
        return (model, _with_knobs(compose(model, comp, ctx), comp, tree))
    from torch.distributed.tensor import DTensor, distribute_tensor
    values = build_model(tree, ctx.device).to(dtype).state_dict()
    model = build_model(tree, torch.device('meta')).to(dtype)
    composed = compose(model, comp, ctx)
    offload = any((s.offload for s in comp.shards))
    model.to_empty(device='cpu' if offload else ctx.device)
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            src = values[clean_name(name)]
            if isinstance(t, DTensor) and offload:
                t.to_local().copy_(distribute_tensor(src, t.device_mesh, t.placements).to_local())
            elif isinstance(t, DTensor):
                t.copy_(distribute_tensor(src, t.device_mesh, t.placements))
            else:
                t.copy_(src)
        if offload:
            for module in model.modules():
                for key, buf in module._buffers.items():
                    if buf is not None:
                        module._buffers[key] = buf.to(ctx.device)
    return (model, _with_knobs(composed, comp, tree))

def _with_knobs(composed: Composed, comp: Composition, tree: ModuleTree) -> Composed:
    if comp.knobs.is_set:
        pass
    return composed

def _wrap(model: nn.Module, comp: Composition, ctx: RankContext) -> nn.Module:
    if comp.wrapper is Wrapper.DDP:
        from torch.nn.parallel import DistributedDataParallel as DDP
        device_ids = None if ctx.device.type == 'cpu' else [ctx.device]
        return DDP(model, device_ids=device_ids, find_unused_parameters=comp.find_unused)
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    strategy = {Wrapper.FSDP1_FULL_SHARD: ShardingStrategy.FULL_SHARD, Wrapper.FSDP1_SHARD_GRAD_OP: ShardingStrategy.SHARD_GRAD_OP, Wrapper.FSDP1_NO_SHARD: ShardingStrategy.NO_SHARD, Wrapper.FSDP1_HYBRID_SHARD: ShardingStrategy.HYBRID_SHARD}[comp.wrapper]
    kwargs = {'sharding_strategy': strategy, 'device_id': ctx.device, 'use_orig_params': True}
    if comp.wrapper is Wrapper.FSDP1_HYBRID_SHARD:
        pass
    if comp.auto_wrap:
        kwargs['auto_wrap_policy'] = ModuleWrapPolicy({TreeBlock})
    return FSDP(model, **kwargs)

def make_optimizer(params: Any, training: Training, later: Any=()) -> torch.optim.Optimizer:
    held = {id(p) for p in later}
    params = [p for p in params if p.requires_grad or id(p) in held]
    groups = params
    if training.param_groups == 2:
        groups = [{'params': params[0::2]}, {'params': params[1::2], 'lr': training.lr / 2}]
        groups = [g for g in groups if g['params']]
    foreach = training.foreach
    return torch.optim.AdamW(groups, lr=training.lr, eps=training.eps, foreach=foreach)

def batches(case: Case, training: Training, width: int, ctx: RankContext, tp_size: int=1) -> list[list[tuple[Any, Any]]]:
    dtype = TORCH_DTYPES[training.dtype]
    gen = torch.Generator().manual_seed(case.seed)
    b = training.batch_per_rank
    lo = 0 if training.same_input else ctx.rank // tp_size * b
    out = []
    for _ in range(training.steps):
        step = []
        for _ in range(training.grad_accum):
            x = torch.randn(ctx.world_size * b, width, generator=gen, dtype=dtype)
            y = torch.randn(ctx.world_size * b, width, generator=gen, dtype=dtype)
            step.append((x[lo:lo + b].to(ctx.device), y[lo:lo + b].to(ctx.device)))
        out.append(step)
    return out

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

def train(case: Case, tree: ModuleTree, training: Training, comp: Composition | None, ctx: RankContext, tp_size: int=1, grad_scales: dict[str, float] | None=None, precision: MixedPrecision | None=None, hsdp: tuple[Any, Any] | None=None, local: frozenset[str]=frozenset()) -> dict[str, Any]:
    dtype = TORCH_DTYPES[training.dtype]
    if comp is not None:
        model, composed = build_composed(tree, comp, dtype, ctx, seed=case.seed, desync=training)
    else:
        torch.manual_seed(case.seed)
        model = build_model(tree, ctx.device).to(dtype)
        composed = Composed(model)
    contracts = _Contracts(model, comp) if comp is not None else None
    obs = {}
    later = _unfrozen_later(composed.model, training)
    opt = make_optimizer(composed.model.parameters(), training, [p for ps in later.values() for p in ps])
    forward = _compiled(composed.model, training) if comp is not None else composed.model
    losses = []
    params_per_step = []
    grad_norms = []
    for s, step in enumerate(batches(case, training, tree.width, ctx, tp_size)):
        for path in [u.path for u in training.unfreeze if u.step == s]:
            for p in later[path]:
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
            if precision is not None:
                step_losses.append(loss.item())
                continue
            with ctx_mgr:
                out = forward(x)
                if contracts is not None and comp is not None:
                    obs['contracts'] = contracts.after_forward(skipped)
                    obs['contracts']['output_dtype'] = str(out.dtype).removeprefix('torch.')
                    if comp.replicate_options.delay_all_reduce:
                        pass
                    contracts = None
                loss = F.mse_loss(out.to(y.dtype), y)
                loss.backward()
            step_losses.append(loss.item())
        if comp is None and precision is None:
            pass
        if composed.wrapper.value.startswith('fsdp1') and composed.wrapper.value != 'fsdp1_no_shard':
            grad_norms.append(float('nan'))
        opt.step()
        opt.zero_grad(set_to_none=training.set_to_none)
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

def _unfrozen_later(model: nn.Module, training: Training) -> dict[str, list[nn.Parameter]]:
    out = {u.path: [] for u in training.unfreeze}
    for name, p in model.named_parameters():
        owner = '.'.join((c for c in clean_name(name).split('.')[:-1] if c.isdigit()))
        if owner in out:
            out[owner].append(p)
    return out

def _compiled(model: nn.Module, training: Training) -> Any:
    if training.compile is Compile.NONE:
        return model
    torch._dynamo.reset()
    return torch.compile(model, backend=training.compile.value)

class _null:

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc: object) -> None:
        pass

def run_metamorphic(case: Case, body: MetamorphicBody, ctx: RankContext) -> dict[str, Any]:
    first = train(case, body.tree, body.training, body.composition, ctx)
    second = train(case, body.tree, body.training, body.variant, ctx)
    keys = ('losses', 'params', 'grad_norms', 'knob_problems')
    return {**first, 'ref': {k: second[k] for k in keys if k in second}}

def attempt(rank, world_size):
    import torch
    import torch.distributed as dist
    case = Case(property='metamorphic', world_size=4, seed=5651, body=MetamorphicBody(tree=ModuleTree(width=1, root=Block(children=(Leaf(kind=LeafKind.CONV1D),), residual=True, buffer=True)), composition=Composition(replicates=('',), checkpoint_first=False, mesh=(1, 4)), variant=Composition(wrapper=Wrapper.FSDP1_FULL_SHARD, auto_wrap=True), training=Training(lr=0.05, momentum=0.9, steps=3, batch_per_rank=3, set_to_none=False, same_input=True, compile=Compile.EAGER)))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import re
    import traceback
    try:
        run_metamorphic(case, case.body, ctx)
    except BaseException as e:
        frames = re.findall('File "([^"]+)", line \\d+, in (\\S+)', traceback.format_exc())
        path, fn = ([(p, f) for p, f in frames if '/torch/' in p and (not f.endswith('comp>'))] or [('?', '?')])[-1]
        found = f'{type(e).__module__}.{type(e).__qualname__}@torch/{path.rpartition("/torch/")[2]}:{fn}'
        if found in ['torch._dynamo.exc.InternalTorchDynamoError@torch/nn/modules/conv.py:_conv_forward']:
            return f'REPRODUCED exception:metamorphic:torch._dynamo.exc.InternalTorchDynamoError@torch/nn/modules/conv.py:_conv_forward: rank {rank} raised {found}: {e}'
        return f"FAIL (not the entry's failure): rank {rank} raised {found}: {e}"
    return 'PASS: no rank raised'

def main():
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import torch.distributed as dist
    dist.init_process_group('gloo')
    verdict = attempt(dist.get_rank(), dist.get_world_size())
    if verdict:
        print(verdict, flush=True)
    os._exit(1 if verdict.startswith('REPRODUCED') else 0)
if __name__ == '__main__':
    main()
