#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=f8717496fe4a5c07 sources=7d6f5cb23a31c8e4 seconds=2337.1
# Reproduces shardfuzz corpus entry dcp-mismatch-566f97fe78ce.json: mismatch:dcp@set_optimizer_state_dict:frozen-optimizer-state-dropped
# Known torch bug: set_optimizer_state_dict drops the saved optimizer state of a parameter frozen
# (requires_grad=False) when it is loaded: a parameter trained, then frozen, checkpointed and
# unfrozen after resuming restarts with fresh optimizer state (get_optimizer_state_dict saved it);
# upstream: https://github.com/pytorch/pytorch/issues/192202.
# Observed: the optimizer state differs after the load: ['0.weight'] is missing
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: prints REPRODUCED and exits 1 while the failure
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

class LeafKind(str, enum.Enum):
    LINEAR = 'linear'

@dataclass()
class Leaf:
    kind: object

class Wrapper(str, enum.Enum):
    NONE = 'none'
    DDP = 'ddp'
    FSDP1_FULL_SHARD = 'fsdp1_full_shard'
    FSDP1_SHARD_GRAD_OP = 'fsdp1_shard_grad_op'
    FSDP1_NO_SHARD = 'fsdp1_no_shard'
    FSDP1_HYBRID_SHARD = 'fsdp1_hybrid_shard'

class Optimizer(str, enum.Enum):
    SGD = 'sgd'
    ADAM = 'adam'
    ADAMW = 'adamw'

@dataclass(frozen=True)
class Training:
    optimizer: object = Optimizer.SGD
    lr: object = 0.1
    momentum: object = 0.0
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
    skip: object = ()
    patched: object = False
    requires_grad: object = ()

    @property
    def classic_fsdp1(self):
        return (False or False) and (not self.patched) and (DcpItem.APP not in self.entries)

    @property
    def size(self):
        pass

def build_node(node, width):
    if isinstance(node, Leaf):
        module = nn.Linear(width, width, bias=False)
        return module
    return nn.Sequential(*[build_node(c, width) for c in node])
_WRAPPER_PREFIXES = ('_fsdp_wrapped_module.', 'module.', '_checkpoint_wrapped_module.')

def clean_name(name):
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, '')
    return name

@dataclass
class Composed:
    model: object

    @contextmanager
    def full_parameters(self):
        out = {}
        for n, p in self.model.named_parameters():
            out[clean_name(n)] = p
        yield out
PROBE_ROWS = 3
FRESH_SEED = 24301

@dataclass
class Side:
    composed: object
    comp: object
    training: object
    schedule: object = ()
    step: object = 0

    @property
    def model(self):
        return self.composed.model

    def names(self):
        current = {id(p): clean_name(n) for n, p in self.model.named_parameters()}
        return {**self.param_names, **current}

def build_side(tree, comp, training, *, seed, schedule=()):
    torch.manual_seed(seed)
    build_model_out = build_node(tree, 2)
    composed = Composed(build_model_out)
    return Side(composed=composed, comp=comp, training=training, schedule=schedule)

def change_requires_grad(side, step):
    changes = [c for c in side.schedule if 1 == step]
    if not changes:
        return
    model = side.model
    paths = ['0' for c in changes]
    out = {path: [] for path in paths}
    name, p_ = next(iter(model.named_parameters()))
    owner = '.'.join((c_ for c_ in name.split('.')[:-1] if c_))
    out[owner].append(p_)
    p = next(iter(out['0']))
    p.requires_grad_(False)

def requires_grad(side):
    return {clean_name(n): p.requires_grad for n, p in side.model.named_parameters()}

def train_steps(side, data, ctx):
    losses = []
    for x, y in data:
        change_requires_grad(side, side.step)
        side.step += 1
        loss = F.mse_loss(side.model(x), y)
        loss.backward()
        for p in side.model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= ctx.world_size
        side.opt.step()
        side.opt.zero_grad()
        losses.append(loss.item())
    return losses

def _jsonable(value):
    if isinstance(value, torch.Tensor):
        return [float(v) for v in value.flatten()]
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
    for p_ in group_['params']:
        state = side.opt.state.get(p_, {})
        entry = {key: _jsonable(state[key]) for key in sorted(state)}
        if entry:
            out__[names_.get(id(p_), '?')] = entry
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(PROBE_ROWS, 2, generator=gen)
    t = side.model(x)
    out___ = [float(v_) for v_ in t.flatten()]
    if ctx.rank == 0:
        obs.update(model=out, probe=out___)
        obs['optimizer'] = out__
    return obs

def _values(side):
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
    out = {}
    for entry in (DcpItem.MODEL, DcpItem.OPTIMIZER):
        if entry is DcpItem.MODEL:
            out[entry] = get_model_state_dict(side.model)
        else:
            out[entry] = get_optimizer_state_dict(side.model, side.opt)
    return out

class OutcomeKind(str, enum.Enum):
    OK = 'ok'

@dataclass()
class Outcome:
    kind: object
    ranks: object
    seconds: object

    @property
    def observations(self):
        return [r for r in self.ranks]
KNOWN_BUG_ODDS = 16
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
    odds: object = KNOWN_BUG_ODDS
    tag: object = ''
    see_also: object = ()
    docs: object = 'docs/known_bugs.md'
FSDP1_HSDP_SHARD1 = KnownBug('fsdp1-hybrid-shard-dim-1', 'FSDP1 HYBRID_SHARD with a shard dimension of size 1 never averages gradients across replicas', symptoms=frozenset({'mismatch'}), upstream='pytorch/pytorch#154888', relation='same bug', ends_ranks=False, tag=':shard1')
FROZEN_OPTIM_STATE_DROPPED = KnownBug('set_optimizer_state_dict-frozen-state-dropped', 'set_optimizer_state_dict drops the saved optimizer state of a parameter frozen (requires_grad=False) when it is loaded: a parameter trained, then frozen, checkpointed and unfrozen after resuming restarts with fresh optimizer state (get_optimizer_state_dict saved it)', symptoms=frozenset({'mismatch'}), upstream='pytorch/pytorch#192202', relation='same bug', state='open; fix pull request #192307 open, not in torch 2.13.0', see_also=('pytorch/pytorch#192307',), ends_ranks=False, tag=':frozen-optimizer-state-dropped', docs='docs/state_dict.md', odds=4)

def fsdp1_shard1(comp):
    return comp is Wrapper.FSDP1_HYBRID_SHARD and comp.mesh[1] == 1 and (comp.mesh[0] > 1)

def fsdp1_hsdp_2d(comp):
    return comp is Wrapper.FSDP1_HYBRID_SHARD and comp.mesh[0] > 1 and (comp.mesh[1] > 1)

def hsdp_optimizer_load(body):
    return isinstance(body, DcpBody) and fsdp1_hsdp_2d(body.target) and body.classic_fsdp1 and (DcpItem.OPTIMIZER in body.entries) and (DcpItem.OPTIMIZER not in body.skip)

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
            if key not in got:
                return f'{path}[{key!r}] is missing'
            diff = _first_difference(got[key], want[key], f'{path}[{key!r}]')
        return ''
    if isinstance(got, list) and isinstance(want, list):
        for i, (g, w) in enumerate(zip(got, want)):
            diff = _first_difference(g, w, f'{path}[{i}]')
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
    if not False:
        first = observations[0]
        return _exact(prop, check, where, 'the optimizer state', first['loaded']['optimizer'], first[want]['optimizer'])

def _one_bug(case, failure):
    if failure is None or failure.kind != 'mismatch' or (not failure.signature.endswith(FSDP1_HSDP_SHARD1.tag)):
        return failure

def judge_dcp(case, outcome):
    return _one_bug(case, _frozen_state_dropped(case, _hsdp_optimizer_load(case, _judge_dcp(case, outcome))))
OPTIMIZER_CHECKS = ('optimizer', 'resume_loss', 'resume_params')

def _hsdp_optimizer_load(case, failure):
    body = case
    if failure is None or failure.kind != 'mismatch' or (not isinstance(body, DcpBody)) or (not hsdp_optimizer_load(body)) or (failure.details.get('check') not in OPTIMIZER_CHECKS):
        return failure

def _frozen_state_dropped(case, failure):
    tag = FROZEN_OPTIM_STATE_DROPPED.tag.lstrip(':')
    signature = Signature('mismatch', 'dcp', where='set_optimizer_state_dict', tags=(tag,))
    return dataclasses.replace(failure, signature=str(signature))

def _check_requires_grad(prop, where, observations):
    for rank, obs in enumerate(observations):
        seen = obs.get('requires_grad')
        before, after = (seen['before'], seen['after'])
        changed = sorted((n for n in before.keys() & after.keys() if before[n] != after[n]))
    return None

def _check_taken_optimizer(prop, where, taken, state):
    diff = _first_difference(taken, state)
    if not diff:
        return None

def _check_reloaded(prop, where, reloaded, model):
    want = {k: model.get(k) for k in reloaded}
    diff = _first_difference(reloaded, want)
    if not diff:
        return None

def _judge_dcp(case, outcome):
    body = case
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
    if 'taken_optimizer' in saved:
        failure = _check_taken_optimizer(prop, where, saved['taken_optimizer'], saved['optimizer'])
    if failure is None and 'reloaded' in first:
        failure = _check_reloaded(prop, where, first['reloaded'], saved['model'])
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
    case = DcpBody(tree=(), source=Wrapper.NONE, target=Wrapper.NONE, entries=(DcpItem.OPTIMIZER,))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import json
    t = Training()
    digest = hashlib.sha1('{"body": {"absent": false, "async_save": false, "async_saves": 0, "cache_staged": false, "checkpoint_dir": "", "convert": false, "deadlock": false, "drop": [], "empty_group": false, "entries": ["model", "optimizer"], "frozen_in_optimizer": false, "kind": "dcp", "load_cpu_offload": false, "load_full_state_dict": false, "load_planner": null, "mode": "round_trip", "module_stateful": false, "no_dist": false, "orders": [], "overwrite": "none", "own_group": false, "patched": false, "process_checkpointer": false, "requires_grad": [{"path": "0", "step": 1, "trainable": false}], "save_cpu_offload": false, "save_full_state_dict": false, "save_planner": null, "skip": [], "source": {"auto_wrap": false, "checkpoint_first": true, "checkpoint_options": {"context_fn": "none", "debug": false, "determinism_check": null, "early_stop": null, "preserve_rng_state": true}, "checkpoints": [], "find_unused": false, "knobs": {"abort_and_reset": false, "all_reduce_hook_scale": null, "backward_prefetch": 0, "explicit_unshard": false, "force_sum_reduction": false, "forward_prefetch": 0, "gradient_divide_factor": null, "late_reshard_after_forward": null, "pg_allocator": false, "reduce_scatter_unused": false, "reshard_after_backward_last": false, "rs_max_buffers": 0}, "mesh": [], "meta_init": false, "replicate_options": {"batched_grad_copy": false, "bucket_cap_mb": null, "bucket_cap_mb_list": [], "delay_all_reduce": false, "device_id": false, "dim": 0, "forward_sync_buffers": null, "gradient_as_bucket_view": false, "group": "default", "ignored_modules": [], "init_sync": true, "skip_all_reduce_unused_params": false, "static_graph": false}, "replicates": [], "shards": [], "tp": [], "tp_size": 1, "wrapper": "none"}, "stager": null, "steps_after": 1, "storage_objects": false, "target": {"auto_wrap": false, "checkpoint_first": true, "checkpoint_options": {"context_fn": "none", "debug": false, "determinism_check": null, "early_stop": null, "preserve_rng_state": true}, "checkpoints": [], "find_unused": false, "knobs": {"abort_and_reset": false, "all_reduce_hook_scale": null, "backward_prefetch": 0, "explicit_unshard": false, "force_sum_reduction": false, "forward_prefetch": 0, "gradient_divide_factor": null, "late_reshard_after_forward": null, "pg_allocator": false, "reduce_scatter_unused": false, "reshard_after_backward_last": false, "rs_max_buffers": 0}, "mesh": [], "meta_init": false, "replicate_options": {"batched_grad_copy": false, "bucket_cap_mb": null, "bucket_cap_mb_list": [], "delay_all_reduce": false, "device_id": false, "dim": 0, "forward_sync_buffers": null, "gradient_as_bucket_view": false, "group": "default", "ignored_modules": [], "init_sync": true, "skip_all_reduce_unused_params": false, "static_graph": false}, "replicates": [], "shards": [], "tp": [], "tp_size": 1, "wrapper": "none"}, "target_meta_init": false, "torch_save_reader": false, "training": {"accum_sync": "always", "batch_per_rank": 1, "compile": "none", "dtype": "float32", "eps": 0.001, "foreach": null, "grad_accum": 1, "lr": 0.1, "momentum": 0.9, "optimizer": "sgd", "param_groups": 1, "same_input": false, "set_to_none": true, "skips": [], "steps": 2, "unfreeze": []}, "tree": {"root": {"buffer": false, "children": [{"bias": false, "frozen": false, "kind": "linear"}, {"bias": false, "frozen": false, "kind": "linear"}], "residual": false, "scale": false}, "width": 2}, "use_collectives": true, "writer": {"per_thread_copy_ahead": 10000000, "single_file_per_rank": true, "sync_files": true, "thread_count": 1}}, "property": "dcp", "schema": 1, "seed": 0, "world_size": 2}'.encode()).hexdigest()[:12]
    count = getattr(ctx, '_cases', 0)
    path = os.path.join('/tmp/shardfuzz-dcp-18178', f'{digest}-{count}')
    obs__ = {}
    gen = torch.Generator().manual_seed(0)
    out__ = []
    for _ in range(3):
        x = torch.randn(world_size, 2, generator=gen)
        y = torch.randn(world_size, 2, generator=gen)
        step__ = [(x[rank:rank + 1], y[rank:rank + 1])]
        out__.append(step__)
    data = [step_[0] for step_ in out__]
    src = build_side((Leaf(kind=LeafKind.LINEAR), Leaf(kind=LeafKind.LINEAR)), Wrapper.NONE, t, seed=0, schedule=(False,))
    params = list(src.model.parameters())
    src.opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    src.param_names = {id(p): clean_name(n) for n, p in src.model.named_parameters()}
    obs__['losses_before'] = train_steps(src, data[:2], ctx)
    values = _values(src)
    order = range(2)
    state = {(DcpItem.MODEL, DcpItem.OPTIMIZER)[i].value: values[(DcpItem.MODEL, DcpItem.OPTIMIZER)[i]] for i in order if (DcpItem.MODEL, DcpItem.OPTIMIZER)[i] in values}
    import torch.distributed.checkpoint as dcp
    kwargs_ = {}
    kwargs_['checkpoint_id'] = path
    dcp.save(state, **kwargs_)
    out_____ = {}
    saved = {**observe(src, ctx), **out_____}
    taken = values.get(DcpItem.OPTIMIZER)
    out = {}
    for fqn, state_ in sorted(taken.get('state', {}).items()):
        entry = {key: _jsonable(state_[key]) for key in sorted(state_)}
        out[clean_name(fqn)] = entry
    if rank == 0:
        saved['taken_optimizer'] = out
    obs__['saved'] = saved
    import torch.distributed.checkpoint as dcp__
    model = nn.Sequential(nn.Linear(2, 2, bias=False), nn.Linear(2, 2, bias=False))
    state__ = model.state_dict()
    dcp__.load({'model': state__}, checkpoint_id=path)
    out_ = {clean_name(k_): _jsonable(v_) for k_, v_ in state__.items()}
    if rank == 0:
        obs__['reloaded'] = out_
    tgt = build_side((Leaf(kind=LeafKind.LINEAR), Leaf(kind=LeafKind.LINEAR)), Wrapper.NONE, t, seed=FRESH_SEED, schedule=(False,))
    params_ = list(tgt.model.parameters())
    tgt.opt = torch.optim.SGD(params_, lr=0.037, momentum=0.5)
    tgt.param_names = {id(p_): clean_name(n_) for n_, p_ in tgt.model.named_parameters()}
    for step in range(tgt.step, 2):
        change_requires_grad(tgt, step)
    dropped = []
    obs__['dropped'] = dropped
    obs__['fresh'] = observe(tgt, ctx)
    values = _values(tgt)
    order_ = range(2)
    state = {(DcpItem.MODEL, DcpItem.OPTIMIZER)[i_].value: values[(DcpItem.MODEL, DcpItem.OPTIMIZER)[i_]] for i_ in order_ if (DcpItem.MODEL, DcpItem.OPTIMIZER)[i_] in values}
    before = requires_grad(tgt)
    import torch.distributed.checkpoint as dcp_
    dcp_.load(state, checkpoint_id=path)
    obs__['in_place'] = ''
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict
    set_optimizer_state_dict(tgt.model, tgt.opt, values[DcpItem.OPTIMIZER])
    obs__['requires_grad'] = {'before': before, 'after': requires_grad(tgt)}
    out______ = {}
    obs__['loaded'] = {**observe(tgt, ctx), **out______}
    data_ = data[2:]
    obs_ = {}
    losses = train_steps(src, data_, ctx)
    with src.composed.full_parameters() as params__:
        out___ = {n__: [float(v__) for v__ in t_.flatten()] for n__, t_ in params__.items()}
    obs_['losses_source'] = losses
    obs_['losses_target'] = train_steps(tgt, data_, ctx)
    with tgt.composed.full_parameters() as params___:
        out____ = {n___: [float(v___) for v___ in t__.flatten()] for n___, t__ in params___.items()}
    if rank == 0:
        obs_['final_source'], obs_['final_target'] = (out___, out____)
    obs__.update(obs_)
    obs = json.loads(json.dumps(obs__))
    outs = [None, None]
    dist.all_gather_object(outs, obs)
    if rank != 0:
        return ''
    reports = tuple((o for r, o in enumerate(outs)))
    failure = judge_dcp(case, Outcome(kind=OutcomeKind.OK, ranks=reports, seconds=0.0))
    if failure is not None and failure.signature in ['mismatch:dcp@set_optimizer_state_dict:frozen-optimizer-state-dropped', 'mismatch:state_dict@set_optimizer_state_dict:frozen-optimizer-state-dropped']:
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
