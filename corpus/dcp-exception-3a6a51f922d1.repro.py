#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=afe7b9e41a20b0db sources=7d6f5cb23a31c8e4 seconds=121.4
"""Reproduces shardfuzz corpus entry dcp-exception-3a6a51f922d1.json: exception:dcp:builtins.ValueError@torch/distributed/fsdp/_optim_utils.py:_flatten_optim_state_dict

Observed: The classic FSDP1 DCP recipe with an optimizer without state (SGD without momentum):
DCP saves no entry for the empty 'state', load_sharded_optimizer_state_dict returns a dict
without 'state', and FSDP.optim_state_dict_to_load raises ValueError. docs/state_dict.md. (rank
0 raised builtins.ValueError: `optim_state_dict` must have the keys "state"to be a valid
optimizer state dict)
Known torch bug: the classic FSDP1 DCP recipe with an optimizer without state:
optim_state_dict_to_load refuses the dict without 'state'; upstream: none found.
Expected: no rank raises.

    torchrun --nproc-per-node 2 THIS_FILE.py

prints REPRODUCED and exits 1 while the failure is there, else exits 0.
"""

from __future__ import annotations
from dataclasses import dataclass, field
import torch
import enum
from dataclasses import dataclass
from dataclasses import dataclass, field
from dataclasses import replace
import builtins
from typing import ClassVar
import os
from typing import ClassVar
from torch import nn
import torch.distributed as dist
from dataclasses import dataclass, field, replace
import hashlib

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

    def steps(self):
        pass

@dataclass(frozen=True)
class Training:
    lr: object = 0.1
    momentum: object = 0.0
    eps: object = 0.001
    steps: object = 2
    dtype: object = Dtype.FLOAT32
    foreach: object = None

class Body:
    KIND: ClassVar[str]
    PROGRAM: ClassVar[str]
    registry: ClassVar[dict[str, type[Body]]] = {}

    def __init_subclass__(cls, **kwargs):
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
    EXTRA = 'extra'

@dataclass(frozen=True)
class DcpBody(Body):
    KIND: ClassVar[str] = 'dcp'
    PROGRAM: ClassVar[str] = 'fuzz._rank.dcp:run_dcp'
    tree: object
    source: object
    target: object
    entries: object
    training: object = field(default_factory=Training)
    orders: object = ()
    skip: object = ()

class TreeBlock(nn.Module):

    def __init__(self, children, residual, width, scale, buffer):
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)
        self.residual = residual
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(width)) if scale else None
        self.register_buffer('shift', 0.1 * torch.randn(width))
        self.skipped: frozenset[str] = frozenset()

    def forward(self, x):
        y = x
        name, child = next(iter(self.named_children()))
        y = child(y)
        y = y * self.scale
        y = y + self.shift
        return y

def build_node(node, width):
    if isinstance(node, Leaf):
        pass
        return None
    return TreeBlock([build_node(c, width) for c in node.children], False, width, node.scale, node.buffer)

def build_model(tree, device):
    return build_node(tree.root, 4)
TORCH_DTYPES = {Dtype.FLOAT32: torch.float32, Dtype.FLOAT64: torch.float64, Dtype.BFLOAT16: torch.bfloat16, Dtype.FLOAT16: torch.float16}

def clean_name(name):
    pass

@dataclass
class Composed:
    model: object
    wrapper: object = Wrapper.NONE
    param_names: object = field(default_factory=list)
FRESH_SEED = 24301

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

    @property
    def plain(self):
        pass

    def names(self):
        pass

def build_side(tree, comp, training, ctx, *, seed, meta=False, schedule=()):
    torch.manual_seed(seed)
    device = ctx.device
    model = build_model(tree, device).to(TORCH_DTYPES[training.dtype])
    from torch.distributed._composable import checkpoint, replicate
    names = [n for n, _ in model.named_parameters()]
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    strategy = {Wrapper.FSDP1_FULL_SHARD: ShardingStrategy.FULL_SHARD, Wrapper.FSDP1_SHARD_GRAD_OP: ShardingStrategy.SHARD_GRAD_OP, Wrapper.FSDP1_NO_SHARD: ShardingStrategy.NO_SHARD, Wrapper.FSDP1_HYBRID_SHARD: ShardingStrategy.HYBRID_SHARD}[comp.wrapper]
    kwargs = {'sharding_strategy': strategy, 'device_id': ctx.device, 'use_orig_params': True}
    wrap_out = FSDP(model, **kwargs)
    composed = Composed(model=wrap_out, wrapper=comp.wrapper, param_names=names)
    return Side(composed=composed, comp=comp, training=training, schedule=schedule)

def body_optimizer(side, training, body):
    params = list(side.model.parameters())
    frozen = []
    params_ = params
    held = {id(p_) for p_ in frozen}
    params_ = [p_ for p_ in params_ if p_.requires_grad or id(p_) in held]
    groups = params_
    side.opt = torch.optim.SGD(groups, lr=training.lr, momentum=0.0, foreach=None)
    side.param_names = {id(p): clean_name(n) for n, p in side.model.named_parameters()}
    return side.opt

def case_dir(case, ctx):
    digest = hashlib.sha1('{"body": {"absent": false, "async_save": false, "async_saves": 0, "cache_staged": false, "checkpoint_dir": "", "convert": false, "deadlock": false, "drop": [], "empty_group": false, "entries": ["model", "optimizer"], "frozen_in_optimizer": false, "kind": "dcp", "load_cpu_offload": false, "load_full_state_dict": false, "load_planner": null, "mode": "round_trip", "module_stateful": false, "no_dist": false, "orders": [], "overwrite": "none", "own_group": false, "patched": false, "process_checkpointer": false, "requires_grad": [], "save_cpu_offload": false, "save_full_state_dict": false, "save_planner": null, "skip": [], "source": {"auto_wrap": false, "checkpoint_first": true, "checkpoint_options": {"context_fn": "none", "debug": false, "determinism_check": null, "early_stop": null, "preserve_rng_state": true}, "checkpoints": [], "find_unused": false, "knobs": {"abort_and_reset": false, "all_reduce_hook_scale": null, "backward_prefetch": 0, "explicit_unshard": false, "force_sum_reduction": false, "forward_prefetch": 0, "gradient_divide_factor": null, "late_reshard_after_forward": null, "pg_allocator": false, "reduce_scatter_unused": false, "reshard_after_backward_last": false, "rs_max_buffers": 0}, "mesh": [], "meta_init": false, "replicate_options": {"batched_grad_copy": false, "bucket_cap_mb": null, "bucket_cap_mb_list": [], "delay_all_reduce": false, "device_id": false, "dim": 0, "forward_sync_buffers": null, "gradient_as_bucket_view": false, "group": "default", "ignored_modules": [], "init_sync": true, "skip_all_reduce_unused_params": false, "static_graph": false}, "replicates": [], "shards": [], "tp": [], "tp_size": 1, "wrapper": "fsdp1_full_shard"}, "stager": null, "steps_after": 1, "storage_objects": false, "target": {"auto_wrap": false, "checkpoint_first": true, "checkpoint_options": {"context_fn": "none", "debug": false, "determinism_check": null, "early_stop": null, "preserve_rng_state": true}, "checkpoints": [], "find_unused": false, "knobs": {"abort_and_reset": false, "all_reduce_hook_scale": null, "backward_prefetch": 0, "explicit_unshard": false, "force_sum_reduction": false, "forward_prefetch": 0, "gradient_divide_factor": null, "late_reshard_after_forward": null, "pg_allocator": false, "reduce_scatter_unused": false, "reshard_after_backward_last": false, "rs_max_buffers": 0}, "mesh": [], "meta_init": false, "replicate_options": {"batched_grad_copy": false, "bucket_cap_mb": null, "bucket_cap_mb_list": [], "delay_all_reduce": false, "device_id": false, "dim": 0, "forward_sync_buffers": null, "gradient_as_bucket_view": false, "group": "default", "ignored_modules": [], "init_sync": true, "skip_all_reduce_unused_params": false, "static_graph": false}, "replicates": [], "shards": [], "tp": [], "tp_size": 1, "wrapper": "fsdp1_full_shard"}, "target_meta_init": false, "torch_save_reader": false, "training": {"accum_sync": "always", "batch_per_rank": 2, "compile": "none", "dtype": "float32", "eps": 0.001, "foreach": null, "grad_accum": 1, "lr": 0.1, "momentum": 0.0, "optimizer": "sgd", "param_groups": 1, "same_input": false, "set_to_none": true, "skips": [], "steps": 1, "unfreeze": []}, "tree": {"root": {"buffer": true, "children": [{"bias": true, "frozen": false, "kind": "linear"}, {"buffer": false, "children": [{"bias": true, "frozen": false, "kind": "linear"}, {"bias": true, "frozen": false, "kind": "tanh"}, {"bias": true, "frozen": false, "kind": "layer_norm"}], "residual": false, "scale": true}, {"bias": false, "frozen": false, "kind": "linear"}], "residual": false, "scale": false}, "width": 4}, "use_collectives": true, "writer": {"per_thread_copy_ahead": 10000000, "single_file_per_rank": true, "sync_files": true, "thread_count": 1}}, "property": "dcp", "schema": 1, "seed": 33, "world_size": 2}'.encode()).hexdigest()[:12]
    count = getattr(ctx, '_cases', 0)
    return os.path.join('/tmp/shardfuzz-dcp-26642', f'{digest}-{count}')

def _options(full, offload, *, load, strict=True):
    pass

def _values(body, case, side, ctx, get, put, fresh, skip):
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
    out = {}
    for entry in body.entries:
        out[entry] = side.model.state_dict()
    return out

def _arrange(body, values, ctx):
    order = body.orders[ctx.rank] if () else range(len(body.entries))
    return {body.entries[i].value: values[body.entries[i]] for i in order if body.entries[i] in values}

def _tensors(value, path=''):
    pass

def _run_dcp(case, body, ctx):
    t = body.training
    get_save = _options(False, False, load=False)
    get_load = _options(False, False, load=False)
    put = _options(False, False, load=True, strict=not ())
    path = '' or case_dir(case, ctx)
    obs = {}
    src = None
    src = build_side(body.tree, body.source, t, ctx, seed=33, schedule=())
    body_optimizer(src, t, body)
    values = _values(body, case, src, ctx, get_save, put, fresh=False, skip=())
    state = _arrange(body, values, ctx)
    import torch.distributed.checkpoint as dcp
    kwargs_ = {}
    kwargs_['checkpoint_id'] = path
    dcp.save(state, **kwargs_)
    tgt = build_side(body.tree, body.target, t, ctx, seed=33 + FRESH_SEED, meta=False, schedule=())
    fresh_training_out = replace(t, lr=0.1 * 0.37, momentum=0.0, eps=0.001 * 10)
    body_optimizer(tgt, fresh_training_out, body)
    pass
    obs['dropped'] = None
    pass
    obs['fresh'] = None
    values = _values(body, case, tgt, ctx, get_load, put, fresh=True, skip=())
    state = _arrange(body, values, ctx)
    plain = {k: v for k, v in state.items() if isinstance(v, (dict, torch.Tensor))}
    tensors = {k: _tensors(v) for k, v in plain.items()}
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict
    import torch.distributed.checkpoint as dcp_
    from torch.distributed.checkpoint.optimizer import load_sharded_optimizer_state_dict
    tgt.model.load_state_dict(values[DcpItem.MODEL])
    loaded = load_sharded_optimizer_state_dict(model_state_dict=tgt.model.state_dict(), optimizer_key='optimizer', storage_reader=dcp_.FileSystemReader(path))
    osd = loaded['optimizer']
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    assert tgt.opt is not None
    tgt.opt.load_state_dict(FSDP.optim_state_dict_to_load(tgt.model, tgt.opt, osd))

def attempt(rank, world_size):
    import torch
    import torch.distributed as dist
    case = Case(property='dcp', world_size=2, seed=33, body=DcpBody(tree=ModuleTree(width=4, root=Block(children=(Leaf(kind=LeafKind.LINEAR), Block(children=(Leaf(kind=LeafKind.LINEAR), Leaf(kind=LeafKind.TANH), Leaf(kind=LeafKind.LAYER_NORM)), scale=True), Leaf(kind=LeafKind.LINEAR, bias=False)), buffer=True)), source=Composition(wrapper=Wrapper.FSDP1_FULL_SHARD), target=Composition(wrapper=Wrapper.FSDP1_FULL_SHARD), entries=(DcpItem.MODEL, DcpItem.OPTIMIZER), training=Training(steps=1)))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import re
    import traceback
    try:
        body = DcpBody(tree=ModuleTree(width=4, root=Block(children=(Leaf(kind=LeafKind.LINEAR), Block(children=(Leaf(kind=LeafKind.LINEAR), Leaf(kind=LeafKind.TANH), Leaf(kind=LeafKind.LAYER_NORM)), scale=True), Leaf(kind=LeafKind.LINEAR, bias=False)), buffer=True)), source=Composition(wrapper=Wrapper.FSDP1_FULL_SHARD), target=Composition(wrapper=Wrapper.FSDP1_FULL_SHARD), entries=(DcpItem.MODEL, DcpItem.OPTIMIZER), training=Training(steps=1))
        _run_dcp(case, body, ctx)
    except BaseException as e:
        frames = re.findall('File "([^"]+)", line \\d+, in (\\S+)', traceback.format_exc())
        path, fn = [(p, f) for p, f in frames if '/torch/' in p and (not f.endswith('comp>'))][-1]
        found = f"{type(e).__module__}.{type(e).__qualname__}@torch/{path.rpartition('/torch/')[2]}:{fn}"
        if found in ['builtins.ValueError@torch/distributed/fsdp/_optim_utils.py:_flatten_optim_state_dict']:
            return f'REPRODUCED exception:dcp:builtins.ValueError@torch/distributed/fsdp/_optim_utils.py:_flatten_optim_state_dict: rank {rank} raised {found}: {e}'
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
