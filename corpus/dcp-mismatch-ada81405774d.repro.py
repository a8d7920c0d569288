#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=63e5b277ec033028 sources=3ebb4d52c9cda72d seconds=2303.2
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
from typing import ClassVar
from torch import nn
from contextlib import contextmanager
import torch.distributed as dist
import torch.nn.functional as F
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

@dataclass()
class Block:
    children: object

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

class Optimizer(str, enum.Enum):
    SGD = 'sgd'
    ADAM = 'adam'
    ADAMW = 'adamw'

@dataclass(frozen=True)
class Training:
    optimizer: object = Optimizer.SGD
    lr: object = 0.1
    eps: object = 0.001
    dtype: object = Dtype.FLOAT32
    param_groups: object = 1

class Body:
    KIND: ClassVar[str]
    PROGRAM: ClassVar[str]
    registry: ClassVar[dict[str, type[Body]]] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        Body.registry[cls.KIND] = cls

    @property
    def size(self):
        pass

@dataclass()
class Case:
    property: object
    world_size: object
    seed: object
    body: object

def trained_then_frozen(body):
    pass

@dataclass(frozen=True)
class Options:
    pass

@dataclass(frozen=True)
class StateDictBody(Body):
    KIND: ClassVar[str] = 'state_dict'
    PROGRAM: ClassVar[str] = 'fuzz._rank.state_dict:run_state_dict'
    tree: object
    source: object
    target: object
    training: object = field(default_factory=Training)
    save: object = field(default_factory=Options)
    requires_grad: object = ()

    @property
    def size(self):
        pass

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
    requires_grad: object = ()

    @property
    def size(self):
        pass

class PointwiseConv1d(nn.Conv1d):

    def forward(self, x):
        return super().forward(x.unsqueeze(-1)).squeeze(-1)

def build_node(node, width):
    if isinstance(node, Leaf):
        module = PointwiseConv1d(width, width, kernel_size=1, bias=False)
        return module
    return nn.Sequential(*[build_node(c, width) for c in node.children])
TORCH_DTYPES = {Dtype.FLOAT64: torch.float64}
_WRAPPER_PREFIXES = ('_fsdp_wrapped_module.', 'module.', '_checkpoint_wrapped_module.')

def clean_name(name):
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, '')
    return name

@dataclass
class Composed:
    model: object
    param_names: object = field()

    @contextmanager
    def full_parameters(self):
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        modules = {clean_name(n): m for n, m in self.model.named_modules()}
        with FSDP.summon_full_params(self.model):
            out = {}
            name = next(iter(self.param_names))
            owner, _, attr = name.rpartition('.')
            out[name] = getattr(modules[owner], attr)
            yield out
PROBE_ROWS = 3
FRESH_SEED = 24301

@dataclass
class Side:
    composed: object
    comp: object
    training: object

    @property
    def model(self):
        return self.composed.model

    def names(self):
        current = {id(p): clean_name(n) for n, p in self.model.named_parameters()}
        return {**self.param_names, **current}

def build_side(tree, comp, training, ctx, *, seed):
    torch.manual_seed(seed)
    build_model_out = build_node(tree.root, 2)
    model = build_model_out.to(torch.float64)
    names = [n for n, _ in model.named_parameters()]
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    strategy = ShardingStrategy.HYBRID_SHARD
    kwargs = {'sharding_strategy': strategy, 'device_id': ctx.device, 'use_orig_params': True}
    kwargs['device_mesh'] = ctx.mesh((2, 2), ())
    wrap_out = FSDP(model, **kwargs)
    composed = Composed(model=wrap_out, param_names=names)
    return Side(composed=composed, comp=comp, training=training)

def requires_grad(side):
    return {clean_name(n): p.requires_grad for n, p in side.model.named_parameters()}

def body_optimizer(side, training):
    params = list(side.model.parameters())
    side.opt = torch.optim.Adam(params, lr=training.lr, eps=training.eps)
    side.param_names = {id(p): clean_name(n) for n, p in side.model.named_parameters()}

def train_steps(side, data):
    x, y = next(iter(data))
    loss = F.mse_loss(side.model(x), y)
    loss.backward()
    side.opt.step()
    side.opt.zero_grad()
    losses = [loss.item()]
    return losses

def _jsonable(value):
    if isinstance(value, torch.Tensor):
        return [float(v_) for v_ in value.flatten()]
    return value

def observe(side, ctx):
    names = side.names()
    group = next(iter(side.opt.param_groups))
    item = {k: _jsonable(v) for k, v in sorted(group.items()) if k != 'params'}
    item['params'] = [names.get(id(p), '?') for p in group['params']]
    out_ = [item]
    obs = {'groups': out_}
    with side.composed.full_parameters() as params_:
        out = {n: [float(v__) for v__ in t_.flatten()] for n, t_ in params_.items()}
    names_ = side.names()
    out__ = {}
    group_ = next(iter(side.opt.param_groups))
    p_ = next(iter(group_['params']))
    state = side.opt.state.get(p_, {})
    entry = {key: _jsonable(state[key]) for key in sorted(state)}
    if entry:
        out__[names_.get(id(p_), '?')] = entry
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(PROBE_ROWS, 2, generator=gen, dtype=TORCH_DTYPES[side.training.dtype])
    t = side.model(x)
    out___ = [float(v_) for v_ in t.flatten()]
    obs['optimizer_local'] = out__
    if ctx.rank == 0:
        obs.update(model=out, probe=out___)
    return obs

class OutcomeKind(str, enum.Enum):
    OK = 'ok'

@dataclass()
class RankReport:
    rank: object
    observation: object = None

@dataclass()
class Outcome:
    kind: object
    ranks: object
    seconds: object

    @property
    def observations(self):
        return [r.observation for r in self.ranks]
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
FSDP1_HSDP_OPTIMIZER_LOAD = KnownBug('fsdp1-hsdp-load_sharded_optimizer_state_dict', 'load_sharded_optimizer_state_dict chunks optimizer state over the whole world: wrong Adam state in FSDP1 HYBRID_SHARD over a 2-D mesh', symptoms=frozenset({'mismatch'}), see_also=('pytorch/pytorch#111096',), ends_ranks=False, tag=':fsdp1-hsdp-load_sharded_optimizer_state_dict')

def fsdp1_shard1(comp):
    return comp.wrapper is Wrapper.FSDP1_HYBRID_SHARD and (2, 2)[1] == 1 and (comp.mesh[0] > 1)

def frozen_state_dropped(body):
    loaded = any((e in body.entries and e not in () for e in (DcpItem.OPTIMIZER, DcpItem.APP))) and (not True)
    return loaded and bool(trained_then_frozen(body))

def ends_ranks(case):
    pass

@dataclass(frozen=True)
class Signature:
    kind: object
    property: object
    check: object = ''
    where: object = ''
    tags: object = ()

    def __str__(self):
        text = f'{self.kind}:{self.property}'
        if self.check:
            text += f':{self.check}'
        if self.where:
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

def _first_difference(got, want, path=''):
    if isinstance(got, dict) and isinstance(want, dict):
        for key in sorted(set(got) | set(want), key=str):
            diff = _first_difference(got[key], want[key], f'{path}[{key!r}]')
            if diff:
                return diff
        return ''
    if isinstance(got, list) and isinstance(want, list):
        for i, (g, w) in enumerate(zip(got, want)):
            diff = _first_difference(g, w, f'{path}[{i}]')
            if diff:
                return diff
        return ''
    return '' if got == want else f'{path}: {got!r} != {want!r}'

def _exact(prop, check, where, what, got, want, **details):
    diff = _first_difference(got, want)
    if not diff:
        return None
    return _mismatch(prop, check, where, f'{what} differs after the load: {diff}', observed=got, expected=want, **details)

def _shard1(source, target):
    return FSDP1_HSDP_SHARD1.tag if fsdp1_shard1(source) or fsdp1_shard1(target) else ''

def _check_model(prop, where, saved, loaded, fresh, dropped):
    want = dict(saved['model'])
    return _exact(prop, 'model', where, 'the model (parameters and buffers)', loaded['model'], want, dropped=dropped)

def _check_optimizer(prop, where, source, target, observations, want, check='optimizer'):
    for rank, obs in enumerate(observations):
        failure = _exact(prop, check, where, f"rank {rank}'s local optimizer state (FSDP1, one layout)", _holding_elements(obs['loaded']['optimizer_local']), _holding_elements(obs[want]['optimizer_local']), rank=rank)
        if failure is not None:
            return failure

def _holding_elements(local):
    return {name: entry for name, entry in local.items() if not any((v == [] for v in entry.values()))}

def _one_bug(case, failure):
    if failure is None or failure.kind != 'mismatch' or (not failure.signature.endswith(FSDP1_HSDP_SHARD1.tag)):
        return failure

def judge_dcp(case, outcome):
    return _one_bug(case, _frozen_state_dropped(case, _hsdp_optimizer_load(case, _judge_dcp(case, outcome))))
OPTIMIZER_CHECKS = ('optimizer', 'resume_loss', 'resume_params')

def _hsdp_optimizer_load(case, failure):
    tag = FSDP1_HSDP_OPTIMIZER_LOAD.tag.lstrip(':')
    return dataclasses.replace(failure, signature=str(Signature('mismatch', 'dcp', where='save', tags=(tag,))))

def _frozen_state_dropped(case, failure):
    body = case.body
    if failure is None or failure.kind != 'mismatch' or (not isinstance(body, (StateDictBody, DcpBody))) or (not frozen_state_dropped(body)) or (failure.details.get('check') not in OPTIMIZER_CHECKS):
        return failure

def _check_requires_grad(prop, where, observations):
    for rank, obs in enumerate(observations):
        seen = obs.get('requires_grad')
        before, after = (seen['before'], seen['after'])
        changed = sorted((n for n in before.keys() & after.keys() if before[n] != after[n]))
    return None

def _judge_dcp(case, outcome):
    body = case.body
    assert isinstance(body, DcpBody)
    prop, observations = ('dcp', outcome.observations)
    where = 'save' + _shard1(body.source, body.target)
    for rank, obs in enumerate(observations):
        pass
    failure = _check_dcp_options(prop, where, body, observations) or _check_requires_grad(prop, where, observations)
    loaded_entries = [e for e in body.entries if e not in ()]
    model_loaded = DcpItem.MODEL in loaded_entries or DcpItem.APP in loaded_entries
    optim_loaded = DcpItem.OPTIMIZER in loaded_entries or DcpItem.APP in loaded_entries
    first = observations[0]
    saved, loaded, fresh, dropped = (first['saved'], first['loaded'], first.get('fresh'), first['dropped'])
    if model_loaded:
        failure = _check_model(prop, where, saved, loaded, fresh, dropped)
    if failure is None and optim_loaded:
        failure = _check_optimizer(prop, where, body.source, body.target, observations, 'saved')
    for rank, obs in enumerate(observations):
        if failure is not None:
            break
    return failure

def _check_dcp_options(prop, where, body, observations):
    return None

def attempt(rank, world_size):
    case = Case(property='dcp', world_size=4, seed=0, body=DcpBody(tree=ModuleTree(width=2, root=Block(children=())), source=Composition(), target=Composition(), entries=(DcpItem.OPTIMIZER,)))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import json
    t = Training(lr=0.01, eps=0.0001, dtype=Dtype.FLOAT64)
    digest = hashlib.sha1('{"body": {"absent": false, "async_save": false, "async_saves": 0, "cache_staged": false, "checkpoint_dir": "", "convert": false, "deadlock": false, "drop": [], "empty_group": false, "entries": ["model", "optimizer"], "frozen_in_optimizer": false, "kind": "dcp", "load_cpu_offload": false, "load_full_state_dict": false, "load_planner": null, "mode": "round_trip", "module_stateful": false, "no_dist": false, "orders": [[0, 1], [0, 1], [0, 1], [0, 1]], "overwrite": "none", "own_group": false, "patched": false, "process_checkpointer": false, "requires_grad": [], "save_cpu_offload": false, "save_full_state_dict": false, "save_planner": null, "skip": [], "source": {"auto_wrap": false, "checkpoint_first": true, "checkpoint_options": {"context_fn": "none", "debug": false, "determinism_check": null, "early_stop": null, "preserve_rng_state": true}, "checkpoints": [], "find_unused": false, "knobs": {"abort_and_reset": false, "all_reduce_hook_scale": null, "backward_prefetch": 0, "custom_all_gather": false, "custom_reduce_scatter": false, "explicit_unshard": false, "force_sum_reduction": false, "forward_prefetch": 0, "gradient_divide_factor": null, "late_reshard_after_forward": null, "no_unshard_in_backward": false, "pg_allocator": false, "reduce_scatter_unused": false, "reshard_after_backward_last": false, "rs_max_buffers": 0, "separate_rs_group": false}, "mesh": [2, 2], "meta_init": false, "replicate_options": {"batched_grad_copy": false, "bucket_cap_mb": null, "bucket_cap_mb_list": [], "delay_all_reduce": false, "device_id": false, "dim": 0, "forward_sync_buffers": null, "gradient_as_bucket_view": false, "group": "default", "ignored_modules": [], "init_sync": true, "skip_all_reduce_unused_params": false, "static_graph": false}, "replicates": [], "shards": [], "tp": [], "tp_size": 1, "wrapper": "fsdp1_hybrid_shard"}, "stager": null, "steps_after": 1, "storage_objects": false, "target": {"auto_wrap": false, "checkpoint_first": true, "checkpoint_options": {"context_fn": "none", "debug": false, "determinism_check": null, "early_stop": null, "preserve_rng_state": true}, "checkpoints": [], "find_unused": false, "knobs": {"abort_and_reset": false, "all_reduce_hook_scale": null, "backward_prefetch": 0, "custom_all_gather": false, "custom_reduce_scatter": false, "explicit_unshard": false, "force_sum_reduction": false, "forward_prefetch": 0, "gradient_divide_factor": null, "late_reshard_after_forward": null, "no_unshard_in_backward": false, "pg_allocator": false, "reduce_scatter_unused": false, "reshard_after_backward_last": false, "rs_max_buffers": 0, "separate_rs_group": false}, "mesh": [2, 2], "meta_init": false, "replicate_options": {"batched_grad_copy": false, "bucket_cap_mb": null, "bucket_cap_mb_list": [], "delay_all_reduce": false, "device_id": false, "dim": 0, "forward_sync_buffers": null, "gradient_as_bucket_view": false, "group": "default", "ignored_modules": [], "init_sync": true, "skip_all_reduce_unused_params": false, "static_graph": false}, "replicates": [], "shards": [], "tp": [], "tp_size": 1, "wrapper": "fsdp1_hybrid_shard"}, "target_meta_init": false, "torch_save_reader": false, "training": {"accum_sync": "always", "batch_per_rank": 1, "compile": "none", "dtype": "float64", "eps": 0.0001, "foreach": null, "grad_accum": 1, "lr": 0.01, "momentum": 0.0, "optimizer": "adam", "param_groups": 1, "same_input": false, "set_to_none": false, "skips": [], "steps": 1, "unfreeze": []}, "tree": {"root": {"buffer": false, "children": [{"bias": false, "frozen": false, "kind": "conv1d"}], "residual": false, "scale": false}, "width": 2}, "use_collectives": true, "writer": {"per_thread_copy_ahead": 10000000, "single_file_per_rank": true, "sync_files": true, "thread_count": 1}}, "property": "dcp", "schema": 1, "seed": 0, "world_size": 4}'.encode()).hexdigest()[:12]
    count = getattr(ctx, '_cases', 0)
    path = os.path.join('/tmp/shardfuzz-dcp-1645', f'{digest}-{count}')
    obs__ = {}
    gen = torch.Generator().manual_seed(0)
    out = []
    for _ in range(2):
        x = torch.randn(world_size, 2, generator=gen, dtype=torch.float64)
        y = torch.randn(world_size, 2, generator=gen, dtype=torch.float64)
        step_ = [(x[rank:rank + 1], y[rank:rank + 1])]
        out.append(step_)
    data = [step[0] for step in out]
    src = build_side(ModuleTree(width=2, root=Block(children=(Leaf(kind=LeafKind.CONV1D),))), Composition(), t, ctx, seed=0)
    body_optimizer(src, t)
    from torch.distributed.fsdp import ShardedOptimStateDictConfig, ShardedStateDictConfig, StateDictType, FullyShardedDataParallel as FSDP_
    FSDP_.set_state_dict_type(src.model, StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig(), ShardedOptimStateDictConfig())
    obs__['losses_before'] = train_steps(src, data[:1])
    out_____ = {}
    for entry in (DcpItem.MODEL, DcpItem.OPTIMIZER):
        if entry is DcpItem.MODEL:
            out_____[entry] = src.model.state_dict()
        else:
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP___
            osd_ = FSDP___.optim_state_dict(src.model, src.opt)
            out_____[entry] = osd_
    state = {(DcpItem.MODEL, DcpItem.OPTIMIZER)[i].value: out_____[DcpItem.OPTIMIZER] for i in (1,) if (DcpItem.MODEL, DcpItem.OPTIMIZER)[i] in out_____}
    import torch.distributed.checkpoint as dcp
    kwargs_ = {}
    kwargs_['checkpoint_id'] = path
    dcp.save(state, **kwargs_)
    out___ = {}
    saved = {**observe(src, ctx), **out___}
    obs__['saved'] = saved
    tgt = build_side(ModuleTree(width=2, root=Block(children=(Leaf(kind=LeafKind.CONV1D),))), Composition(), t, ctx, seed=FRESH_SEED)
    fresh_training_out = replace(t, lr=0.0037, eps=0.001)
    body_optimizer(tgt, fresh_training_out)
    from torch.distributed.fsdp import ShardedOptimStateDictConfig as ShardedOptimStateDictConfig_, ShardedStateDictConfig as ShardedStateDictConfig_, StateDictType as StateDictType_, FullyShardedDataParallel as FSDP__
    FSDP__.set_state_dict_type(tgt.model, StateDictType_.SHARDED_STATE_DICT, ShardedStateDictConfig_(), ShardedOptimStateDictConfig_())
    dropped = []
    obs__['dropped'] = dropped
    obs__['fresh'] = observe(tgt, ctx)
    before = requires_grad(tgt)
    obs__['in_place'] = ''
    import torch.distributed.checkpoint as dcp__
    from torch.distributed.checkpoint.optimizer import load_sharded_optimizer_state_dict
    tgt.model.load_state_dict(out_____[DcpItem.MODEL])
    loaded = load_sharded_optimizer_state_dict(model_state_dict=tgt.model.state_dict(), optimizer_key='optimizer', storage_reader=dcp__.FileSystemReader(path))
    osd = loaded['optimizer']
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    tgt.opt.load_state_dict(FSDP.optim_state_dict_to_load(tgt.model, tgt.opt, osd))
    obs__['requires_grad'] = {'before': before, 'after': requires_grad(tgt)}
    out____ = {}
    obs__['loaded'] = {**observe(tgt, ctx), **out____}
    data_ = data[1:]
    obs_ = {}
    losses = train_steps(src, data_)
    with src.composed.full_parameters() as params:
        out_ = {n: [float(v_) for v_ in t_.flatten()] for n, t_ in params.items()}
    obs_['losses_source'] = losses
    obs_['losses_target'] = train_steps(tgt, data_)
    with tgt.composed.full_parameters() as params_:
        out__ = {n_: [float(v__) for v__ in t__.flatten()] for n_, t__ in params_.items()}
    if rank == 0:
        obs_['final_source'], obs_['final_target'] = (out_, out__)
    obs__.update(obs_)
    obs = json.loads(json.dumps(obs__))
    outs = [None, None, None, None]
    dist.all_gather_object(outs, obs)
    if rank != 0:
        return ''
    reports = tuple((RankReport(rank=r, observation=o) for r, o in enumerate(outs)))
    failure = judge_dcp(case, Outcome(kind=OutcomeKind.OK, ranks=reports, seconds=0.0))
    if failure is not None and failure.signature in ['mismatch:dcp@save:fsdp1-hsdp-load_sharded_optimizer_state_dict']:
        observed = hashlib.sha256(json.dumps(outs, sort_keys=True).encode()).hexdigest()[:16]
        return f'REPRODUCED {failure.signature}: observations {observed}: {failure.summary}'
    return f'PASS or another failure: {failure and failure.signature}'

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
