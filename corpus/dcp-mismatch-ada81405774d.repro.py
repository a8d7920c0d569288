#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=63e5b277ec033028 sources=b2f61a16b7315ba5 seconds=1618.9
# Reproduces shardfuzz corpus entry dcp-mismatch-ada81405774d.json: mismatch:dcp@save:fsdp1-hsdp-load_sharded_optimizer_state_dict
# Known torch bug: load_sharded_optimizer_state_dict chunks optimizer state over the whole world:
# wrong Adam state in FSDP1 HYBRID_SHARD over a 2-D mesh; upstream: none found.
# Observed: rank 2's local optimizer state (FSDP1, one layout) differs after the load:
# ['0.weight']['exp_avg'][0]: 0.0 != -0.016777848531689548
# Run: torchrun --nproc-per-node 4 THIS_FILE.py: prints REPRODUCED and exits 1 while the failure
# is there, else exits 0 (expected: the property's judge finds nothing).

from __future__ import annotations
import torch
import enum
import dataclasses
import os
from torch import nn
import torch.nn.functional as F
import torch.distributed as dist
from dataclasses import dataclass, field, replace
import hashlib

@dataclass
class RankContext:
    rank: object
    world_size: object
    device: object
    backend: object
    _meshes: object = field(default_factory=dict)

    def mesh(self, shape, names):
        from torch.distributed.device_mesh import init_device_mesh
        key = ()
        self._meshes[key] = init_device_mesh(self.device.type, shape)
        return self._meshes[key]

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

@dataclass()
class ModuleTree:
    width: object
    root: object

class Wrapper(str, enum.Enum):
    NONE = 'none'
    FSDP1_HYBRID_SHARD = 'fsdp1_hybrid_shard'

@dataclass()
class Composition:
    mesh: object = ()
    wrapper: object = Wrapper.NONE

class Optimizer(str, enum.Enum):
    SGD = 'sgd'
    ADAM = 'adam'

@dataclass()
class Training:
    optimizer: object = Optimizer.SGD
    lr: object = 0.1
    eps: object = 0.001
    steps: object = 2
    batch_per_rank: object = 2
    dtype: object = Dtype.FLOAT32
    set_to_none: object = True

class Body:
    pass

class DcpItem(str, enum.Enum):
    MODEL = 'model'
    OPTIMIZER = 'optimizer'

@dataclass()
class DcpBody(Body):
    tree: object
    source: object
    target: object
    entries: object
    training: object = field()
    orders: object = ()

class PointwiseConv1d(nn.Conv1d):

    def forward(self, x):
        return super().forward(x.unsqueeze(-1)).squeeze(-1)
TORCH_DTYPES = {Dtype.FLOAT64: torch.float64}

def clean_name():
    pass

@dataclass
class Composed:
    model: object
    wrapper: object = Wrapper.NONE
    param_names: object = field(default_factory=list)

@dataclass
class Side:
    composed: object
    comp: object
    training: object
    step: object = 0

    @property
    def model(self):
        return self.composed.model

    def names(self):
        current = {id(p): clean_name() for n, p in self.model.named_parameters()}
        return {**self.param_names, **current}

def _jsonable(value):
    return [float(v_) for v_ in value.detach().double().cpu().flatten().tolist()]

def observe(side):
    names = side.names()
    out_ = {}
    group = next(iter(side.opt.param_groups))
    p = next(iter(group['params']))
    state = side.opt.state.get(p, {})
    entry = {key: _jsonable(state[key]) for key in sorted(state)}
    out_[names.get(id(p), '?')] = entry
    obs = {'optimizer_local': out_}
    return obs

@dataclass(frozen=True)
class RankReport:
    rank: object
    observation: object = None
NONE_FOUND = 'none found'

@dataclass(frozen=True)
class KnownBug:
    id: object
    title: object
    symptoms: object = frozenset({'exception'})
    upstream: object = NONE_FOUND
    relation: object = ''
    state: object = ''
    ends_ranks: object = True
    tag: object = ''
    see_also: object = ()
FSDP1_HSDP_SHARD1 = KnownBug('fsdp1-hybrid-shard-dim-1', 'FSDP1 HYBRID_SHARD with a shard dimension of size 1 never averages gradients across replicas', symptoms=frozenset({'mismatch'}), upstream='pytorch/pytorch#154888', relation='same bug', ends_ranks=False, tag=':shard1')
FSDP1_HSDP_OPTIMIZER_LOAD = KnownBug('fsdp1-hsdp-load_sharded_optimizer_state_dict', 'load_sharded_optimizer_state_dict chunks optimizer state over the whole world: wrong Adam state in FSDP1 HYBRID_SHARD over a 2-D mesh', symptoms=frozenset({'mismatch'}), relation='none found after four phrasings; related: a review there notes that this function does not know the right rank and world size (see_also)', state='present in torch 2.13.0', see_also=('pytorch/pytorch#111096', 'pytorch/pytorch#145978'), ends_ranks=False, tag=':fsdp1-hsdp-load_sharded_optimizer_state_dict')

def fsdp1_shard1():
    pass
RESUME_LOSS, RESUME_PARAMS = ('resume_loss', 'resume_params')
RESUME_CHECKS = (RESUME_LOSS, RESUME_PARAMS)

@dataclass(frozen=True)
class Signature:
    kind: object
    property: object
    check: object = ''
    where: object = ''
    tags: object = ()

    def __str__(self):
        text = f'{self.kind}:{self.property}'
        text += f'@{self.where}'
        return text + ''.join((f':{t}' for t in self.tags))

@dataclass(frozen=True)
class Failure:
    kind: object
    signature: object
    summary: object
    details: object = field(default_factory=dict)

def _mismatch(prop, check, where, summary, **details):
    return Failure('mismatch', str(Signature('mismatch', prop, check, where)), summary, {'check': check, **details})

def _exact(prop, check, where, what, got, want, **details):
    diff = '' if got == want else f"{''}: {got!r} != {want!r}"
    if not diff:
        return None
    return _mismatch(prop, check, where, f'{what} differs after the load: {diff}', observed=got, expected=want, **details)

def _check_optimizer(prop, where, observations):
    for rank, obs in enumerate(observations):
        failure = _exact(prop, 'optimizer', where, f"rank {rank}'s local optimizer state (FSDP1, one layout)", _holding_elements(obs['loaded']['optimizer_local']), _holding_elements(obs['saved']['optimizer_local']), rank=rank)
        if failure is not None:
            return failure

def _holding_elements(local):
    return {name: entry for name, entry in local.items() if not any((v == [] for v in entry.values()))}
OPTIMIZER_CHECKS = ('optimizer', *RESUME_CHECKS)

def _hsdp_optimizer_load(failure):
    body = DcpBody(tree=ModuleTree(width=2, root=Block(children=(Leaf(kind=LeafKind.CONV1D, bias=False),))), source=Composition(mesh=(2, 2), wrapper=Wrapper.FSDP1_HYBRID_SHARD), target=Composition(mesh=(2, 2), wrapper=Wrapper.FSDP1_HYBRID_SHARD), entries=(DcpItem.MODEL, DcpItem.OPTIMIZER), training=Training(optimizer=Optimizer.ADAM, lr=0.01, eps=0.0001, steps=1, batch_per_rank=1, dtype=Dtype.FLOAT64, set_to_none=False), orders=((0, 1), (0, 1), (0, 1), (0, 1)))
    if failure is None or failure.kind != 'mismatch' or (not isinstance(body, DcpBody)) or (not (isinstance(body, DcpBody) and (True and 2 > 1 and (2 > 1)) and True and True and True)) or (failure.details.get('check') not in OPTIMIZER_CHECKS):
        return failure
    return dataclasses.replace(failure, signature=str(Signature('mismatch', 'dcp', where='save', tags=('fsdp1-hsdp-load_sharded_optimizer_state_dict',))))

def attempt(rank, world_size):
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import json
    body = DcpBody(tree=ModuleTree(width=2, root=Block(children=(Leaf(kind=LeafKind.CONV1D, bias=False),))), source=Composition(mesh=(2, 2), wrapper=Wrapper.FSDP1_HYBRID_SHARD), target=Composition(mesh=(2, 2), wrapper=Wrapper.FSDP1_HYBRID_SHARD), entries=(DcpItem.MODEL, DcpItem.OPTIMIZER), training=Training(optimizer=Optimizer.ADAM, lr=0.01, eps=0.0001, steps=1, batch_per_rank=1, dtype=Dtype.FLOAT64, set_to_none=False), orders=((0, 1), (0, 1), (0, 1), (0, 1)))
    t = Training(dtype=Dtype.FLOAT64)
    digest = hashlib.sha1('{"body": {"absent": false, "async_save": false, "async_saves": 0, "cache_staged": false, "checkpoint_dir": "", "convert": false, "deadlock": false, "drop": [], "empty_group": false, "entries": ["model", "optimizer"], "frozen_in_optimizer": false, "kind": "dcp", "load_cpu_offload": false, "load_full_state_dict": false, "load_planner": null, "mode": "round_trip", "module_stateful": false, "no_dist": false, "orders": [[0, 1], [0, 1], [0, 1], [0, 1]], "overwrite": "none", "own_group": false, "patched": false, "process_checkpointer": false, "requires_grad": [], "save_cpu_offload": false, "save_full_state_dict": false, "save_planner": null, "skip": [], "source": {"auto_wrap": false, "checkpoint_first": true, "checkpoint_options": {"context_fn": "none", "debug": false, "determinism_check": null, "early_stop": null, "preserve_rng_state": true}, "checkpoints": [], "find_unused": false, "knobs": {"abort_and_reset": false, "all_reduce_hook_scale": null, "backward_prefetch": 0, "custom_all_gather": false, "custom_reduce_scatter": false, "explicit_unshard": false, "force_sum_reduction": false, "forward_prefetch": 0, "gradient_divide_factor": null, "late_reshard_after_forward": null, "no_unshard_in_backward": false, "pg_allocator": false, "reduce_scatter_unused": false, "reshard_after_backward_last": false, "rs_max_buffers": 0, "separate_rs_group": false}, "mesh": [2, 2], "meta_init": false, "replicate_options": {"batched_grad_copy": false, "bucket_cap_mb": null, "bucket_cap_mb_list": [], "delay_all_reduce": false, "device_id": false, "dim": 0, "forward_sync_buffers": null, "gradient_as_bucket_view": false, "group": "default", "ignored_modules": [], "init_sync": true, "skip_all_reduce_unused_params": false, "static_graph": false}, "replicates": [], "shards": [], "spmd": false, "spmd_mse_loss": false, "tp": [], "tp_size": 1, "wrapper": "fsdp1_hybrid_shard"}, "stager": null, "steps_after": 1, "storage_objects": false, "target": {"auto_wrap": false, "checkpoint_first": true, "checkpoint_options": {"context_fn": "none", "debug": false, "determinism_check": null, "early_stop": null, "preserve_rng_state": true}, "checkpoints": [], "find_unused": false, "knobs": {"abort_and_reset": false, "all_reduce_hook_scale": null, "backward_prefetch": 0, "custom_all_gather": false, "custom_reduce_scatter": false, "explicit_unshard": false, "force_sum_reduction": false, "forward_prefetch": 0, "gradient_divide_factor": null, "late_reshard_after_forward": null, "no_unshard_in_backward": false, "pg_allocator": false, "reduce_scatter_unused": false, "reshard_after_backward_last": false, "rs_max_buffers": 0, "separate_rs_group": false}, "mesh": [2, 2], "meta_init": false, "replicate_options": {"batched_grad_copy": false, "bucket_cap_mb": null, "bucket_cap_mb_list": [], "delay_all_reduce": false, "device_id": false, "dim": 0, "forward_sync_buffers": null, "gradient_as_bucket_view": false, "group": "default", "ignored_modules": [], "init_sync": true, "skip_all_reduce_unused_params": false, "static_graph": false}, "replicates": [], "shards": [], "spmd": false, "spmd_mse_loss": false, "tp": [], "tp_size": 1, "wrapper": "fsdp1_hybrid_shard"}, "target_meta_init": false, "torch_save_reader": false, "training": {"accum_sync": "always", "batch_per_rank": 1, "compile": "none", "dtype": "float64", "eps": 0.0001, "foreach": null, "grad_accum": 1, "lr": 0.01, "momentum": 0.0, "optimizer": "adam", "param_groups": 1, "same_input": false, "set_to_none": false, "skips": [], "steps": 1, "unfreeze": []}, "tree": {"root": {"buffer": false, "children": [{"bias": false, "frozen": false, "kind": "conv1d"}], "residual": false, "scale": false}, "width": 2}, "use_collectives": true, "writer": {"per_thread_copy_ahead": 10000000, "single_file_per_rank": true, "sync_files": true, "thread_count": 1}}, "property": "dcp", "schema": 1, "seed": 0, "world_size": 4}'.encode()).hexdigest()[:12]
    path = os.path.join('/tmp/shardfuzz-dcp-3246', f'{digest}-{0}')
    training_ = replace(t)
    dtype = TORCH_DTYPES[training_.dtype]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(world_size, 2, dtype=dtype)
    y = torch.randn(world_size, 2)
    step_ = [(x[rank:rank + 1].to(torch.device('cpu')), y[rank:rank + 1].to(torch.device('cpu')))]
    comp = Composition()
    model = nn.Sequential(PointwiseConv1d(2, 2, kernel_size=1)).to(torch.float64)
    names = [n for n, __ in model.named_parameters()]
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    strategy = ShardingStrategy.HYBRID_SHARD
    wrap_out = FSDP(model, sharding_strategy=strategy, device_id=torch.device('cpu'), use_orig_params=True, device_mesh=ctx.mesh(tuple((2, 2)), ()))
    composed = Composed(model=wrap_out)
    src = Side(composed=composed, comp=comp, training=t)
    params = list(wrap_out.parameters())
    held = set()
    src.opt = torch.optim.Adam(params)
    src.param_names = {id(p): clean_name() for n__, p in wrap_out.named_parameters()}
    from torch.distributed.fsdp import ShardedOptimStateDictConfig, ShardedStateDictConfig, StateDictType
    FSDP.set_state_dict_type(wrap_out, StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig(), ShardedOptimStateDictConfig())
    data_ = [step_[0]][:1]
    x_, y_ = next(iter(data_))
    loss = F.mse_loss(wrap_out(x_).to(y_.dtype), y_)
    loss.backward()
    src.opt.step()
    out = {}
    entry = next(iter((DcpItem.OPTIMIZER,)))
    if entry is DcpItem.MODEL:
        out[entry] = wrap_out.state_dict()
    else:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP_
        osd_ = FSDP_.optim_state_dict(wrap_out, src.opt)
        out[entry] = osd_
    order = ((0, 1), (0, 1), (0, 1), (0, 1))[rank]
    state = {(DcpItem.MODEL, DcpItem.OPTIMIZER)[i].value: out[(DcpItem.MODEL, DcpItem.OPTIMIZER)[i]] for i in order if (DcpItem.MODEL, DcpItem.OPTIMIZER)[i] in out}
    import torch.distributed.checkpoint as dcp
    dcp.save(state, checkpoint_id=path)
    out_ = {}
    saved = {**observe(src), **out_}
    comp_ = Composition()
    model_ = nn.Sequential(PointwiseConv1d(2, 2, kernel_size=1)).to(torch.float64)
    names_ = [n_ for n_, ___ in model_.named_parameters()]
    strategy_ = ShardingStrategy.HYBRID_SHARD
    wrap_out_ = FSDP(model_, sharding_strategy=strategy_, device_id=torch.device('cpu'), use_orig_params=True, device_mesh=ctx.mesh(tuple((2, 2)), ()))
    composed_ = Composed(model=wrap_out_)
    tgt = Side(composed=composed_, comp=comp_, training=t)
    fresh_training_out = replace(t)
    params_ = list(wrap_out_.parameters())
    held_ = set()
    tgt.opt = torch.optim.Adam(params_)
    tgt.param_names = {id(p_): clean_name() for n___, p_ in wrap_out_.named_parameters()}
    FSDP.set_state_dict_type(wrap_out_, StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig(offload_to_cpu=False), ShardedOptimStateDictConfig(offload_to_cpu=False))
    plain = {k: v for k, v in state.items() if isinstance(v, (dict, torch.Tensor))}
    from torch.distributed.checkpoint.optimizer import load_sharded_optimizer_state_dict
    loaded = load_sharded_optimizer_state_dict(model_state_dict=wrap_out_.state_dict(), optimizer_key='optimizer', storage_reader=dcp.FileSystemReader(path))
    osd = loaded['optimizer']
    tgt.opt.load_state_dict(FSDP.optim_state_dict_to_load(wrap_out_, tgt.opt, osd))
    out__ = {}
    obs__ = {'saved': saved, 'loaded': {**observe(tgt), **out__}}
    obs = json.loads(json.dumps(obs__))
    outs = [None] * world_size
    dist.all_gather_object(outs, obs)
    if rank != 0:
        return ''
    reports = tuple((RankReport(rank=r, observation=o) for r, o in enumerate(outs)))
    body_ = DcpBody(tree=ModuleTree(width=2, root=Block(children=(Leaf(kind=LeafKind.CONV1D, bias=False),))), source=Composition(mesh=(2, 2), wrapper=Wrapper.FSDP1_HYBRID_SHARD), target=Composition(mesh=(2, 2), wrapper=Wrapper.FSDP1_HYBRID_SHARD), entries=(DcpItem.MODEL, DcpItem.OPTIMIZER), training=Training(optimizer=Optimizer.ADAM, lr=0.01, eps=0.0001, steps=1, batch_per_rank=1, dtype=Dtype.FLOAT64, set_to_none=False), orders=((0, 1), (0, 1), (0, 1), (0, 1)))
    assert isinstance(body_, DcpBody)
    prop, observations = ('dcp', [r.observation or {} for r in reports])
    shard1_out = FSDP1_HSDP_SHARD1.tag if fsdp1_shard1() else ''
    where = 'save' + shard1_out
    rank_, obs_ = next(iter(enumerate(observations)))
    failure__ = None
    failure__ = _check_optimizer(prop, where, observations)
    judge_dcp_out = failure__
    failure_ = _hsdp_optimizer_load(judge_dcp_out)
    failure = failure_ if failure_ is None or failure_.kind != 'mismatch' or (not failure_.signature.endswith(FSDP1_HSDP_SHARD1.tag)) else None
    if failure is not None and failure.signature in ['mismatch:dcp@save:fsdp1-hsdp-load_sharded_optimizer_state_dict']:
        observed = hashlib.sha256(json.dumps(outs, sort_keys=True).encode()).hexdigest()[:16]
        return f'REPRODUCED {failure.signature}: observations {observed}: {failure.summary}'
    return f'PASS or another failure: {failure and failure.signature}'

def main():
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import sys
    import torch.distributed as dist
    dist.init_process_group('gloo')
    verdict = attempt(dist.get_rank(), dist.get_world_size())
    if verdict:
        sys.stdout.write(verdict + '\n')
        sys.stdout.flush()
    os._exit(1 if verdict.startswith('REPRODUCED') else 0)
if __name__ == '__main__':
    main()
