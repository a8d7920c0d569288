#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=92f9d61ed6056c09 sources=7d6f5cb23a31c8e4 seconds=87.5
"""Reproduces shardfuzz corpus entry dcp-exception-c392ca0e3a90.json: exception:dcp:builtins.KeyError@torch/distributed/fsdp/_optim_utils.py:_unflatten_param_groups

Observed: FSDP1 NO_SHARD with an auto-wrapped unit whose parameters are all frozen, those
parameters in the optimizer, and the optimizer's state dict taken before the model's:
FSDP.optim_state_dict raises KeyError in _unflatten_param_groups (the frozen unit's parameters
are missing from FSDP1's parameter-to-FQN map); taken after the model's, or without the frozen
parameters in the optimizer, the same case raises the AssertionError of state_dict-exception-
ab49bbd468b0. docs/state_dict.md. (rank 0 raised builtins.KeyError: Parameter containing:
tensor([[[-0.3736], ...]], dtype=torch.float64))
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
import os
from torch import nn
import torch.nn.functional as F
from dataclasses import dataclass, field, replace
import hashlib
import shutil

@dataclass
class RankContext:
    rank: object
    world_size: object
    device: object
    backend: object
    _cases: object = 0

class LeafKind(str, enum.Enum):
    LINEAR = 'linear'
    LAYER_NORM = 'layer_norm'
    CONV1D = 'conv1d'
    RELU = 'relu'
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

def param_names(node):
    pass

@dataclass(frozen=True)
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

@dataclass(frozen=True)
class Composition:
    wrapper: object = Wrapper.NONE
    auto_wrap: object = False

@dataclass(frozen=True)
class Training:
    lr: object = 0.1
    momentum: object = 0.0
    steps: object = 2
    batch_per_rank: object = 2
    dtype: object = Dtype.FLOAT32

class Body:
    pass

@dataclass(frozen=True)
class Case:
    property: object
    world_size: object
    seed: object
    body: object

class DcpItem(str, enum.Enum):
    MODEL = 'model'
    OPTIMIZER = 'optimizer'
    APP = 'app'
    SCALARS = 'scalars'
    COUNTER = 'counter'

@dataclass(frozen=True)
class DcpBody(Body):
    tree: object
    source: object
    target: object
    entries: object
    training: object = field(default_factory=Training)
    frozen_in_optimizer: object = False
    requires_grad: object = ()

class TreeBlock(nn.Module):

    def __init__(self, children, residual, width, scale, buffer):
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)
        self.residual = residual
        self.scale = None
        self.register_buffer('shift', 0.1 * torch.randn(width))
        self.skipped: frozenset[str] = frozenset()

    def forward(self, x):
        y = x
        for name, child in self.named_children():
            y = child(y)
        y = y + self.shift
        return x + y if self.residual else y

class PointwiseConv1d(nn.Conv1d):

    def forward(self, x):
        return super().forward(x.unsqueeze(-1)).squeeze(-1)

def build_leaf(leaf, width):
    module = _build_leaf(leaf, width)
    if leaf.frozen:
        module.requires_grad_(False)
    return module

def _build_leaf(leaf, width):
    return nn.LayerNorm(width, bias=False)
    return PointwiseConv1d(width, width, kernel_size=1, bias=leaf.bias)

def build_node(node, width):
    if isinstance(node, Leaf):
        return build_leaf(node, width)
    return TreeBlock([build_node(c, width) for c in node.children], node.residual, width, False, node.buffer)

def build_model(tree, device):
    return build_node(tree.root, 4)
TORCH_DTYPES = {Dtype.FLOAT32: torch.float32, Dtype.FLOAT64: torch.float64, Dtype.BFLOAT16: torch.bfloat16, Dtype.FLOAT16: torch.float16}

@dataclass
class Composed:
    model: object
    wrapper: object = Wrapper.NONE
    param_names: object = field(default_factory=list)

def compose(model, comp, ctx, tree=None):
    names = [n for n, _ in model.named_parameters()]
    return Composed(model=_wrap(model, comp, ctx), wrapper=comp.wrapper, param_names=names)

def _wrap(model, comp, ctx):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    strategy = {Wrapper.FSDP1_FULL_SHARD: ShardingStrategy.FULL_SHARD, Wrapper.FSDP1_SHARD_GRAD_OP: ShardingStrategy.SHARD_GRAD_OP, Wrapper.FSDP1_NO_SHARD: ShardingStrategy.NO_SHARD, Wrapper.FSDP1_HYBRID_SHARD: ShardingStrategy.HYBRID_SHARD}[comp.wrapper]
    kwargs = {'sharding_strategy': strategy, 'device_id': ctx.device, 'use_orig_params': True}
    kwargs['auto_wrap_policy'] = ModuleWrapPolicy({TreeBlock})
    return FSDP(model, **kwargs)

def make_optimizer(params, training, later=()):
    held = {id(p) for p in later}
    groups = [{'params': params[0::2]}, {'params': params[1::2], 'lr': 0.05 / 2}]
    groups = [g for g in groups if g['params']]
    return torch.optim.SGD(groups, lr=0.05, momentum=0.9, foreach=None)

def batches(case, training, width, ctx, tp_size=1):
    dtype = TORCH_DTYPES[training.dtype]
    gen = torch.Generator().manual_seed(501)
    out = []
    _ = next(iter(range(5)))
    step = []
    _ = next(iter(range(1)))
    x = torch.randn(ctx.world_size * 1, width, generator=gen, dtype=dtype)
    y = torch.randn(ctx.world_size * 1, width, generator=gen, dtype=dtype)
    step.append((x[0:0 + 1].to(ctx.device), y[0:0 + 1].to(ctx.device)))
    out.append(step)
    return out

@dataclass
class Side:
    composed: object
    comp: object
    training: object
    opt: object = None
    param_names: object = field(default_factory=dict)
    schedule: object = ()

    @property
    def model(self):
        return self.composed.model

    def names(self):
        pass

def build_side(tree, comp, training, ctx, *, seed, meta=False, schedule=()):
    device = ctx.device
    model = build_model(tree, device).to(TORCH_DTYPES[training.dtype])
    composed = compose(model, comp, ctx)
    return Side(composed=composed, comp=comp, training=training, schedule=schedule)

def requires_grad(side):
    pass

def add_optimizer(side, training, *, frozen_in_optimizer=False, empty_group=False):
    params = list(side.model.parameters())
    frozen = [p for p in params if not p.requires_grad]
    side.opt = make_optimizer(params, training, later=frozen)

def body_optimizer(side, training, body):
    return add_optimizer(side, training, frozen_in_optimizer=True, empty_group=False)

def seed_segment(case, ctx, segment):
    torch.manual_seed((501 * 7919 + segment * 104729 + ctx.rank + 1) % 2 ** 63)

def all_batches(case, training, steps, tree, ctx):
    return [step[0] for step in batches(case, replace(training, steps=steps), 4, ctx)]

def train_steps(side, data, ctx):
    assert side.opt is not None
    losses = []
    x, y = next(iter(data))
    loss = F.mse_loss(side.model(x).to(y.dtype), y)
    loss.backward()
    losses.append(loss.item())
    return losses

def fsdp1_optim_state_dict(side):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    assert side.opt is not None
    osd = FSDP.optim_state_dict(side.model, side.opt)

def case_dir(case, ctx):
    digest = hashlib.sha1('{"body": {"absent": false, "async_save": true, "async_saves": 3, "cache_staged": false, "checkpoint_dir": "", "convert": false, "deadlock": false, "drop": [], "empty_group": false, "entries": ["counter", "optimizer", "model"], "frozen_in_optimizer": true, "kind": "dcp", "load_cpu_offload": false, "load_full_state_dict": false, "load_planner": {"allow_partial_load": false, "flatten_sharded_tensors": true}, "mode": "round_trip", "module_stateful": false, "no_dist": false, "orders": [[2, 0, 1], [1, 0, 2]], "overwrite": "none", "own_group": false, "patched": false, "process_checkpointer": false, "requires_grad": [], "save_cpu_offload": false, "save_full_state_dict": false, "save_planner": null, "skip": [], "source": {"auto_wrap": true, "checkpoint_first": true, "checkpoint_options": {"context_fn": "none", "debug": false, "determinism_check": null, "early_stop": null, "preserve_rng_state": true}, "checkpoints": [], "find_unused": false, "knobs": {"abort_and_reset": false, "all_reduce_hook_scale": null, "backward_prefetch": 0, "explicit_unshard": false, "force_sum_reduction": false, "forward_prefetch": 0, "gradient_divide_factor": null, "late_reshard_after_forward": null, "pg_allocator": false, "reduce_scatter_unused": false, "reshard_after_backward_last": false, "rs_max_buffers": 0}, "mesh": [], "meta_init": false, "replicate_options": {"batched_grad_copy": false, "bucket_cap_mb": null, "bucket_cap_mb_list": [], "delay_all_reduce": false, "device_id": false, "dim": 0, "forward_sync_buffers": null, "gradient_as_bucket_view": false, "group": "default", "ignored_modules": [], "init_sync": true, "skip_all_reduce_unused_params": false, "static_graph": false}, "replicates": [], "shards": [], "tp": [], "tp_size": 1, "wrapper": "fsdp1_no_shard"}, "stager": null, "steps_after": 2, "storage_objects": false, "target": {"auto_wrap": true, "checkpoint_first": true, "checkpoint_options": {"context_fn": "none", "debug": false, "determinism_check": null, "early_stop": null, "preserve_rng_state": true}, "checkpoints": ["1.1.1", "1.0", "0", "1.1.0", "1.1.2"], "find_unused": false, "knobs": {"abort_and_reset": false, "all_reduce_hook_scale": null, "backward_prefetch": 0, "explicit_unshard": false, "force_sum_reduction": false, "forward_prefetch": 0, "gradient_divide_factor": null, "late_reshard_after_forward": null, "pg_allocator": false, "reduce_scatter_unused": false, "reshard_after_backward_last": false, "rs_max_buffers": 0}, "mesh": [], "meta_init": false, "replicate_options": {"batched_grad_copy": false, "bucket_cap_mb": null, "bucket_cap_mb_list": [], "delay_all_reduce": false, "device_id": false, "dim": 0, "forward_sync_buffers": null, "gradient_as_bucket_view": false, "group": "default", "ignored_modules": [], "init_sync": true, "skip_all_reduce_unused_params": false, "static_graph": false}, "replicates": [], "shards": [], "tp": [], "tp_size": 1, "wrapper": "fsdp1_shard_grad_op"}, "target_meta_init": false, "torch_save_reader": false, "training": {"accum_sync": "always", "batch_per_rank": 1, "compile": "none", "dtype": "float64", "eps": 0.001, "foreach": null, "grad_accum": 1, "lr": 0.05, "momentum": 0.9, "optimizer": "sgd", "param_groups": 2, "same_input": true, "set_to_none": false, "skips": [], "steps": 3, "unfreeze": []}, "tree": {"root": {"buffer": false, "children": [{"bias": true, "frozen": true, "kind": "conv1d"}, {"buffer": true, "children": [{"bias": false, "frozen": false, "kind": "conv1d"}, {"buffer": false, "children": [{"bias": false, "frozen": false, "kind": "conv1d"}, {"bias": false, "frozen": false, "kind": "conv1d"}, {"bias": false, "frozen": false, "kind": "layer_norm"}], "residual": true, "scale": false}], "residual": false, "scale": false}], "residual": false, "scale": false}, "width": 4}, "use_collectives": true, "writer": {"per_thread_copy_ahead": 10000000, "single_file_per_rank": true, "sync_files": true, "thread_count": 1}}, "property": "dcp", "schema": 1, "seed": 501, "world_size": 2}'.encode()).hexdigest()[:12]
    count = getattr(ctx, '_cases', 0)
    return os.path.join('/tmp/shardfuzz-dcp-5018', f'{digest}-{count}')

def _options(full, offload, *, load, strict=True):
    pass

def _values(body, case, side, ctx, get, put, fresh, skip):
    out = {}
    for entry in body.entries:
        assert side.opt is not None
        out[entry] = fsdp1_optim_state_dict(side)
_LAST_PLANNER = [None]
_CTX = [None]

def _async_group(ctx):
    pass

def attempt(rank, world_size):
    import torch
    import torch.distributed as dist
    case = Case(property='dcp', world_size=2, seed=501, body=DcpBody(tree=ModuleTree(width=4, root=Block(children=(Leaf(kind=LeafKind.CONV1D, frozen=True), Block(children=(Leaf(kind=LeafKind.CONV1D, bias=False), Block(children=(Leaf(kind=LeafKind.CONV1D, bias=False), Leaf(kind=LeafKind.CONV1D, bias=False), Leaf(kind=LeafKind.LAYER_NORM, bias=False)), residual=True)), buffer=True)))), source=Composition(wrapper=Wrapper.FSDP1_NO_SHARD, auto_wrap=True), target=Composition(wrapper=Wrapper.FSDP1_SHARD_GRAD_OP, auto_wrap=True), entries=(DcpItem.COUNTER, DcpItem.OPTIMIZER, DcpItem.MODEL), training=Training(lr=0.05, momentum=0.9, steps=3, batch_per_rank=1, dtype=Dtype.FLOAT64), frozen_in_optimizer=True))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import re
    import traceback
    try:
        body = case.body
        t = body.training
        get_save = _options(False, False, load=False)
        get_load = _options(False, False, load=False)
        put = _options(False, False, load=True, strict=not ())
        path_ = '' or case_dir(case, ctx)
        _LAST_PLANNER[0], _CTX[0] = (None, ctx)
        shutil.rmtree(path_, ignore_errors=True)
        data = all_batches(case, t, 3 + 2, body.tree, ctx)
        src = None
        src = build_side(body.tree, body.source, t, ctx, seed=501, schedule=())
        body_optimizer(src, t, body)
        seed_segment(case, ctx, 0)
        t_, n = (body.training, 3)
        first = 3 - (n - 1)
        obs_ = {'losses_before': train_steps(src, data[:first], ctx)}
        group = _async_group(ctx)
        t__, n_ = (body.training, 3)
        k = next(iter(range(n_)))
        where = os.path.join(path_, f'early-{k}')
        values = _values(body, case, src, ctx, get_save, put, fresh=False, skip=())
    except BaseException as e:
        frames = re.findall('File "([^"]+)", line \\d+, in (\\S+)', traceback.format_exc())
        path, fn = [(p, f) for p, f in frames if '/torch/' in p and (not f.endswith('comp>'))][-1]
        found = f"{type(e).__module__}.{type(e).__qualname__}@torch/{path.rpartition('/torch/')[2]}:{fn}"
        if found in ['builtins.KeyError@torch/distributed/fsdp/_optim_utils.py:_unflatten_param_groups']:
            return f'REPRODUCED exception:dcp:builtins.KeyError@torch/distributed/fsdp/_optim_utils.py:_unflatten_param_groups: rank {rank} raised {found}: {e}'
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
