#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=f8717496fe4a5c07 sources=32d77006ab4f02d0 seconds=1121.6
# Reproduces shardfuzz corpus entry dcp-mismatch-566f97fe78ce.json: mismatch:dcp@set_optimizer_state_dict:frozen-optimizer-state-dropped
# Known torch bug: set_optimizer_state_dict drops the saved optimizer state of a parameter frozen
# (requires_grad=False) when it is loaded: a parameter trained, then frozen, checkpointed and
# unfrozen after resuming restarts with fresh optimizer state (get_optimizer_state_dict saved it);
# upstream: https://github.com/pytorch/pytorch/issues/192202.
# Observed: the optimizer state differs after the load: ['0.weight'] is missing
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: prints REPRODUCED and exits 1 while the failure
# is there, else exits 0 (expected: the property's judge finds nothing).

from __future__ import annotations
from dataclasses import dataclass, field
import torch
import enum
import builtins
from typing import ClassVar
import dataclasses
import json
import os
from torch import nn
import copy
import torch.distributed as dist
from dataclasses import replace
import hashlib
import shutil
from functools import cache

@dataclass
class RankContext:
    rank: object
    world_size: object
    device: object
    backend: object

    def mesh(self, shape, names):
        pass
    _cases: object = 0

    def group(self, name):
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
    buffer: object = False

def iter_paths(block):
    yield ('', block)
    for i, child in enumerate(block.children):
        path = str(i)
        yield (path, child)

@dataclass(frozen=True)
class ModuleTree:
    width: object
    root: object

    def paths(self):
        return dict(iter_paths(self.root))

    @property
    def size(self):
        pass

@dataclass(frozen=True)
class Composition:
    mesh: object = ()

    def reshard_after_forward(self, spec):
        pass

    def steps(self):
        pass

@dataclass(frozen=True)
class Training:
    lr: object = 0.1
    momentum: object = 0.0
    eps: object = 0.001
    steps: object = 2
    batch_per_rank: object = 2
    dtype: object = Dtype.FLOAT32
    param_groups: object = 1
    foreach: object = None

class Body:
    KIND: ClassVar[str]
    PROGRAM: ClassVar[str]
    registry: ClassVar[dict[str, type[Body]]] = {}

    def __init_subclass__(cls, **kwargs):
        pass

    @property
    def size(self):
        pass

@dataclass(frozen=True)
class Case:
    property: object
    world_size: object
    seed: object
    body: object

    @builtins.property
    def size(self):
        pass

@dataclass(frozen=True)
class RequiresGrad:
    path: object
    step: object
    trainable: object

def trainable_at(tree, changes, step):
    flags = {p: not False for p, n in tree.paths().items() if isinstance(n, Leaf) and True}
    for c in sorted(changes, key=lambda c: 1):
        if 1 <= step:
            flags['0'] = False
    return flags

def trained_then_frozen(body):
    at_load = trainable_at(body.tree, body.requires_grad, 2 - 1)
    trained = {p for s in range(2) for p, on in trainable_at(body.tree, body.requires_grad, s).items() if on}
    return sorted((p for p in trained if not at_load[p]))

@dataclass(frozen=True)
class Options:
    full_state_dict: object = False

@dataclass(frozen=True)
class StateDictBody(Body):
    KIND: ClassVar[str] = 'state_dict'
    PROGRAM: ClassVar[str] = 'fuzz._rank.state_dict:run_state_dict'
    tree: object
    source: object
    target: object
    training: object = field(default_factory=Training)
    save: object = field(default_factory=Options)
    load: object = field(default_factory=Options)
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
    async_save: object = False
    cache_staged: object = False
    requires_grad: object = ()
    stager: object = None

    @property
    def size(self):
        pass

def build_model(device):
    with torch.device(device):
        return nn.Sequential(nn.Linear(2, 2, bias=False), nn.Linear(2, 2, bias=False))
TORCH_DTYPES = {Dtype.FLOAT32: torch.float32, Dtype.FLOAT64: torch.float64, Dtype.BFLOAT16: torch.bfloat16, Dtype.FLOAT16: torch.float16}

def clean_name(name):
    return name

@dataclass
class Composed:
    model: object
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
    step: object = 0

    @property
    def model(self):
        return self.composed.model

    @property
    def plain(self):
        pass

    def names(self):
        current = {id(p): clean_name(n) for n, p in self.model.named_parameters()}
        return {**self.param_names, **current}

def build_side(comp, training, ctx, *, seed, schedule=()):
    torch.manual_seed(seed)
    device = ctx.device
    model = build_model(device).to(torch.float32)
    composed = Composed(model)
    return Side(composed=composed, comp=comp, training=training, schedule=schedule)

def change_requires_grad(side, step):
    changes = [c for c in side.schedule if 1 == step]
    if not changes:
        return
    model = side.model
    paths = ['0' for c in changes]
    out = {path: [] for path in paths}
    for name, p_ in model.named_parameters():
        owner = '.'.join((c_ for c_ in name.split('.')[:-1] if c_.isdigit()))
        if owner in out:
            out[owner].append(p_)
    for c in changes:
        for p in out['0']:
            p.requires_grad_(False)

def requires_grad(side):
    pass

def body_optimizer(side, training):
    params = list(side.model.parameters())
    params_ = params
    held = {id(p_) for p_ in []}
    params_ = [p_ for p_ in params_ if p_.requires_grad or id(p_) in held]
    groups = params_
    side.opt = torch.optim.SGD(groups, lr=training.lr, momentum=training.momentum, foreach=None)
    side.param_names = {id(p): clean_name(n) for n, p in side.model.named_parameters()}
    return side.opt

def _jsonable():
    pass

def observe(side, ctx):
    pass
    obs = {'groups': None}
    pass
    names = side.names()
    out_ = {}
    for group in side.opt.param_groups:
        for p in group['params']:
            state = side.opt.state.get(p, {})
            entry = {key: _jsonable() for key in sorted(state)}
            if entry:
                out_[names.get(id(p), '?')] = entry
    pass
    if ctx.rank == 0:
        obs.update(model=None, probe=None)
        obs['optimizer'] = out_
    return obs

def state_dict_options():
    pass

def case_dir(ctx):
    digest = hashlib.sha1('{"body": {"absent": false, "async_save": false, "async_saves": 0, "cache_staged": false, "checkpoint_dir": "", "convert": false, "deadlock": false, "drop": [], "empty_group": false, "entries": ["model", "optimizer"], "frozen_in_optimizer": false, "kind": "dcp", "load_cpu_offload": false, "load_full_state_dict": false, "load_planner": null, "mode": "round_trip", "module_stateful": false, "no_dist": false, "orders": [], "overwrite": "none", "own_group": false, "patched": false, "process_checkpointer": false, "requires_grad": [{"path": "0", "step": 1, "trainable": false}], "save_cpu_offload": false, "save_full_state_dict": false, "save_planner": null, "skip": [], "source": {"auto_wrap": false, "checkpoint_first": true, "checkpoint_options": {"context_fn": "none", "debug": false, "determinism_check": null, "early_stop": null, "preserve_rng_state": true}, "checkpoints": [], "find_unused": false, "knobs": {"abort_and_reset": false, "all_reduce_hook_scale": null, "backward_prefetch": 0, "custom_all_gather": false, "custom_reduce_scatter": false, "explicit_unshard": false, "force_sum_reduction": false, "forward_prefetch": 0, "gradient_divide_factor": null, "late_reshard_after_forward": null, "no_unshard_in_backward": false, "pg_allocator": false, "reduce_scatter_unused": false, "reshard_after_backward_last": false, "rs_max_buffers": 0, "separate_rs_group": false}, "mesh": [], "meta_init": false, "replicate_options": {"batched_grad_copy": false, "bucket_cap_mb": null, "bucket_cap_mb_list": [], "delay_all_reduce": false, "device_id": false, "dim": 0, "forward_sync_buffers": null, "gradient_as_bucket_view": false, "group": "default", "ignored_modules": [], "init_sync": true, "skip_all_reduce_unused_params": false, "static_graph": false}, "replicates": [], "shards": [], "spmd": false, "spmd_mse_loss": false, "tp": [], "tp_size": 1, "wrapper": "none"}, "stager": null, "steps_after": 1, "storage_objects": false, "target": {"auto_wrap": false, "checkpoint_first": true, "checkpoint_options": {"context_fn": "none", "debug": false, "determinism_check": null, "early_stop": null, "preserve_rng_state": true}, "checkpoints": [], "find_unused": false, "knobs": {"abort_and_reset": false, "all_reduce_hook_scale": null, "backward_prefetch": 0, "custom_all_gather": false, "custom_reduce_scatter": false, "explicit_unshard": false, "force_sum_reduction": false, "forward_prefetch": 0, "gradient_divide_factor": null, "late_reshard_after_forward": null, "no_unshard_in_backward": false, "pg_allocator": false, "reduce_scatter_unused": false, "reshard_after_backward_last": false, "rs_max_buffers": 0, "separate_rs_group": false}, "mesh": [], "meta_init": false, "replicate_options": {"batched_grad_copy": false, "bucket_cap_mb": null, "bucket_cap_mb_list": [], "delay_all_reduce": false, "device_id": false, "dim": 0, "forward_sync_buffers": null, "gradient_as_bucket_view": false, "group": "default", "ignored_modules": [], "init_sync": true, "skip_all_reduce_unused_params": false, "static_graph": false}, "replicates": [], "shards": [], "spmd": false, "spmd_mse_loss": false, "tp": [], "tp_size": 1, "wrapper": "none"}, "target_meta_init": false, "torch_save_reader": false, "training": {"accum_sync": "always", "batch_per_rank": 1, "compile": "none", "dtype": "float32", "eps": 0.001, "foreach": null, "grad_accum": 1, "lr": 0.1, "momentum": 0.9, "optimizer": "sgd", "param_groups": 1, "same_input": false, "set_to_none": true, "skips": [], "steps": 2, "unfreeze": []}, "tree": {"root": {"buffer": false, "children": [{"bias": false, "frozen": false, "kind": "linear"}, {"bias": false, "frozen": false, "kind": "linear"}], "residual": false, "scale": false}, "width": 2}, "use_collectives": true, "writer": {"per_thread_copy_ahead": 10000000, "single_file_per_rank": true, "sync_files": true, "thread_count": 1}}, "property": "dcp", "schema": 1, "seed": 0, "world_size": 2}'.encode()).hexdigest()[:12]
    count = getattr(ctx, '_cases', 0)
    return os.path.join('/tmp/shardfuzz-dcp-21431', f'{digest}-{count}')

def _options():
    pass

def _values(side):
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
    out = {}
    for entry in (DcpItem.MODEL, DcpItem.OPTIMIZER):
        if entry is DcpItem.MODEL:
            out[entry] = get_model_state_dict(side.model, options=state_dict_options())
        else:
            assert side.opt is not None
            out[entry] = get_optimizer_state_dict(side.model, side.opt, options=state_dict_options())
    return out

def _arrange(values):
    order = range(len((DcpItem.MODEL, DcpItem.OPTIMIZER)))
    return {(DcpItem.MODEL, DcpItem.OPTIMIZER)[i].value: values[(DcpItem.MODEL, DcpItem.OPTIMIZER)[i]] for i in order if (DcpItem.MODEL, DcpItem.OPTIMIZER)[i] in values}

def _tensors():
    pass

def _observe_entries(values):
    out = {}
    for entry, value in values.items():
        pass
    return out

def _run_dcp(ctx):
    t = Training(momentum=0.9, batch_per_rank=1)
    get_save = _options()
    get_load = _options()
    put = _options()
    path = '' or case_dir(ctx)
    if True and ctx.rank == 0:
        shutil.rmtree(path, ignore_errors=True)
    steps = 2 + 1
    training_ = replace(t, steps=steps)
    dtype = TORCH_DTYPES[training_.dtype]
    gen = torch.Generator().manual_seed(0)
    lo = ctx.rank // 1
    out = []
    for _ in range(3):
        step_ = []
        for _ in range(1):
            x = torch.randn(ctx.world_size, 2, generator=gen, dtype=dtype)
            y = torch.randn(ctx.world_size, 2, generator=gen, dtype=dtype)
            step_.append((x[lo:lo + 1].to(ctx.device), y[lo:lo + 1].to(ctx.device)))
        out.append(step_)
    src = None
    src = build_side(Composition(), t, ctx, seed=0, schedule=(RequiresGrad(path='0', step=1, trainable=False),))
    body_optimizer(src, t)
    values = _values(src)
    state = _arrange(values)
    pass
    saved = {**observe(src, ctx), **_observe_entries(values)}
    taken = values.get(DcpItem.OPTIMIZER)
    pass
    if ctx.rank == 0:
        saved['taken_optimizer'] = None
    moves = any((e in (DcpItem.MODEL, DcpItem.OPTIMIZER) and e not in () for e in (DcpItem.OPTIMIZER, DcpItem.APP)))
    obs = {'losses_before': None, 'saved': saved}
    pass
    if ctx.rank == 0:
        obs['reloaded'] = None
    tgt = build_side(Composition(), t, ctx, seed=FRESH_SEED, schedule=(RequiresGrad(path='0', step=1, trainable=False),))
    fresh_training_out = replace(t, lr=0.1 * 0.37, momentum=0.5, eps=0.001 * 10)
    body_optimizer(tgt, fresh_training_out)
    for step in range(tgt.step, 2):
        change_requires_grad(tgt, step)
    tgt.step = max(tgt.step, 2)
    pass
    obs['dropped'] = None
    obs['fresh'] = observe(tgt, ctx)
    values = _values(tgt)
    state = _arrange(values)
    plain = {k: v for k, v in state.items() if isinstance(v, (dict, torch.Tensor))}
    tensors = {k: _tensors() for k, v in plain.items()}
    before = requires_grad(tgt)
    obs['requires_grad'] = {'before': before, 'after': requires_grad(tgt)}
    obs['loaded'] = {**observe(tgt, ctx), **_observe_entries(values)}
    dist.barrier()
    if ctx.rank == 0:
        shutil.rmtree(path, ignore_errors=True)
    return obs

class OutcomeKind(str, enum.Enum):
    OK = 'ok'
    EXCEPTION = 'exception'
    HANG = 'hang'
    CRASH = 'crash'

@dataclass(frozen=True)
class Outcome:
    kind: object
    ranks: object
    seconds: object

    @property
    def ok(self):
        pass

    @property
    def observations(self):
        return [r or {} for r in self.ranks]
KNOWN_BUG_ODDS = 16
KNOWN_HANG_ODDS = 64
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
    fixed_in: object = ''
    introduced_in: object = ''
    conditional: object = False
    training_only: object = False

    @property
    def fix(self):
        pass
FSDP1_HSDP_SHARD1 = KnownBug('fsdp1-hybrid-shard-dim-1', 'FSDP1 HYBRID_SHARD with a shard dimension of size 1 never averages gradients across replicas', symptoms=frozenset({'mismatch'}), upstream='pytorch/pytorch#154888', relation='same bug', ends_ranks=False, tag=':shard1')
FOREACH_MIXED = KnownBug('foreach-mixed-dtensor-tensor', 'foreach optimizers over a mix of DTensor (fully_shard) and plain (replicate) parameters raise', upstream='pytorch/pytorch#183207', relation='same symptom (reached there through ignored_params)')
INT_RESHARD_DIM1 = KnownBug('fully_shard-int-reshard-shard-dim-1', 'fully_shard with an int reshard_after_forward and Shard(1) placements: IndexError in foreach_all_gather_copy_out', relation='none found after five phrasings (the error text and frame, the two options, the symptom); see_also: the pull requests that added shard_placement_fn and the int reshard_after_forward', state='present in torch 2.13.0', see_also=('pytorch/pytorch#137496', 'pytorch/pytorch#118017'))
FROZEN_INT_RESHARD = KnownBug('fully_shard-frozen-int-reshard', "a frozen fully_shard unit with an int reshard_after_forward under a replicate'd root stays in its post-forward state", symptoms=frozenset({'mismatch'}), relation="none found after five phrasings (frozen unit, replicate root, int reshard, post-backward callback), eight more, and two of the mechanism (the post-forward DTensor's values under uneven sharding, to_sharded_post_forward's slice of the padded all-gather output); see_also: FSDP1's resharding of frozen parameters, the FSDP-based replicate, and parameters left post-forward after backward under set_unshard_in_backward(False)", state='present in torch 2.13.0', see_also=('pytorch/pytorch#101982', 'pytorch/pytorch#158207', 'pytorch/pytorch#144800'), ends_ranks=False, tag=':frozen-int-reshard')
UNFROZEN_UNRESHARDED = KnownBug('fully_shard-unfrozen-unresharded', "a frozen fully_shard unit without resharding under a replicate'd root is never resharded: a leaf unfrozen later never trains (KeyError in get_optimizer_state_dict)", symptoms=frozenset({'mismatch', 'exception'}), relation="none found after four phrasings (the KeyError, unfreezing, reshard_after_forward=False, the final callback), and seven more; see_also: frozen parameters' optimizer state dropped by DCP (another mechanism), and an optimizer holding other parameter objects than the module (another trigger)", state='present in torch 2.13.0', see_also=('pytorch/pytorch#192202', 'pytorch/pytorch#149029', 'pytorch/pytorch#149205'), ends_ranks=False, tag=':unfrozen-unresharded')
UNUSED_NO_ALL_REDUCE = KnownBug('fully_shard-unused-no-all-reduce', 'HSDP with set_requires_all_reduce(False): a unit unused on the last microbatch loses its accumulated gradient', symptoms=frozenset({'mismatch', 'exception'}), relation="none found after five phrasings; related: the option's pull request and the gradient accumulation finalization work on the same deferred-reduction path (see_also)", state='present in torch 2.13.0', see_also=('pytorch/pytorch#126166', 'pytorch/pytorch#196640', 'pytorch/pytorch#197620'), ends_ranks=False, tag=':unused-no-all-reduce', conditional=True)
FSDP1_UNFROZEN_FROZEN_UNIT = KnownBug('fsdp1-no-shard-unfrozen-in-frozen-unit', 'FSDP1 NO_SHARD, a unit all frozen at wrapping: a leaf unfrozen later never trains', symptoms=frozenset({'mismatch'}), upstream='pytorch/pytorch#85831', relation='related', see_also=('pytorch/pytorch#104148', 'pytorch/pytorch#105371'), ends_ranks=False, tag=':unfrozen-frozen-unit')
MP_UNIFORM_GRAD_DTYPE = KnownBug('fully_shard-reduce-dtype-no-sync-uniform-grad-dtype', "MixedPrecisionPolicy(reduce_dtype) with set_requires_gradient_sync(False) and a parameter unused on a no-sync microbatch: 'FSDP reduce-scatter expects uniform gradient dtype'", upstream='pytorch/pytorch#196996', relation='same bug', state='open; an earlier fix (pull request #160279) is not in torch 2.13', see_also=('pytorch/pytorch#160279', 'pytorch/pytorch#190627'))
MP_NEVER_RUN_NO_SYNC = KnownBug('fully_shard-reduce-dtype-no-sync-never-run', "MixedPrecisionPolicy(reduce_dtype) with set_requires_gradient_sync(False): a unit that never ran forward has no '_unsharded_param' in the root's post-backward", upstream='pytorch/pytorch#194058', relation='same bug (pull request)', state='closed; the fix is not in torch 2.13')
MP_FROZEN_AT_LAZY_INIT = KnownBug('fully_shard-mp-frozen-at-lazy-init', 'MixedPrecisionPolicy: a unit all frozen at lazy init gets no orig/reduce dtype; unfrozen later, its low-precision gradient is never cast back', upstream='pytorch/pytorch#186998', relation='same bug', state='closed, yet still present in torch 2.13.0 (fix pull request #187376 not in 2.13)', see_also=('pytorch/pytorch#187376',))
BROADCAST_EMPTY = KnownBug('set_state_dict-broadcast-empty', 'set_state_dict(broadcast_from_rank0=True) deadlocks when ranks other than 0 pass an empty model state dict', symptoms=frozenset({'hang', 'crash', 'exception'}), upstream='pytorch/pytorch#157781', relation='same symptom', state='open', see_also=('pytorch/pytorch#158836',), odds=KNOWN_HANG_ODDS, docs='docs/state_dict.md')
STATELESS_FULL = KnownBug('set_optimizer_state_dict-full-stateless', "set_optimizer_state_dict(full_state_dict=True) for an optimizer without tensor state: 'Expected device to be set'", upstream='pytorch/pytorch#133415', relation='same symptom: a stateless optimizer through the distributed state dict, closed by the pull request in see_also, yet the full_state_dict path still raises in torch 2.13.0', state='present in torch 2.13.0', see_also=('pytorch/pytorch#135535', 'pytorch/pytorch#192225'), docs='docs/state_dict.md')
FLAT_FULL_OPTIM = KnownBug('set_optimizer_state_dict-flat-full-keyerror', "set_optimizer_state_dict(full_state_dict=True, flatten_optimizer_state_dict=True) raises KeyError 'param_groups.0.params.0' for any model: the full-state branch takes the optimizer's local state dict with the flatten option still on, so the loaded and the local dicts have different keys", relation='none found after four phrasings; two other flatten bugs are in see_also', state='present in torch 2.13.0', see_also=('pytorch/pytorch#192224', 'pytorch/pytorch#192225'), docs='docs/state_dict.md')
FSDP1_FULL_OFFLOAD = KnownBug('fsdp1-full-state-dict-offload-to-cpu', 'FSDP1 FULL_STATE_DICT with offload_to_cpu on CPU: state_dict() clones a freed buffer (SIGSEGV), optim_state_dict aliases the gathered states', symptoms=frozenset({'crash', 'mismatch'}), upstream='pytorch/pytorch#188989', relation="same root cause for the model state dict (to_cpu frees a CPU buffer); none found for the optimizer's aliasing", state='closed; its fix (pull request #188990) is not in torch 2.13', see_also=('pytorch/pytorch#188990', 'Lightning-AI/pytorch-lightning#21804'), docs='docs/state_dict.md')
FSDP1_FROZEN_UNIT = KnownBug('fsdp1-no-shard-frozen-unit-state-dict', "FSDP1 NO_SHARD with an auto-wrapped unit of frozen parameters: state_dict() after training raises 'FSDP assumes ... is in the state_dict'", upstream='pytorch/pytorch#85831', relation='related', docs='docs/state_dict.md')
FSDP1_DCP_STATELESS = KnownBug('fsdp1-dcp-stateless-optimizer', "the classic FSDP1 DCP recipe with an optimizer without state: optim_state_dict_to_load refuses the dict without 'state'", relation='none found after four phrasings (the KeyError, optim_state_dict_to_load, stateless SGD, the function); see_also: FSDP1 leaving empty state out of its flattened optimizer state dict', state='present in torch 2.13.0', see_also=('pytorch/pytorch#88353',), docs='docs/state_dict.md')
FSDP1_DCP_EMPTY_SHARD = KnownBug('dcp-load-empty-sharded-tensor-pre-2.4-guess', "dcp.load of an FSDP1 sharded state dict where a rank holds no chunk of a parameter: the planner guesses a pre-2.4 checkpoint, 'Missing key in checkpoint state_dict'", upstream='pytorch/pytorch#163480', relation="same bug (pull request: _flatten_sharded_tensors drops the empty ShardedTensor, the load planner takes its key for missing and falls back to the pre-2.4 key format); related: the same condition through another path, and the pre-2.4 fallback's pull request (see_also)", state='closed unmerged (a test was asked for); present in torch 2.13.0', see_also=('pytorch/pytorch#137327', 'pytorch/pytorch#108869', 'pytorch/pytorch#134158'), docs='docs/state_dict.md')
FSDP1_ASYNC_DEFAULT_STAGER = KnownBug('async_save-default-stager-sharded-tensor', "dcp.async_save's default stager calls data_ptr() on ShardedTensors", relation="none found after five phrasings; related: async_save of FSDP state with 0-d tensors, and the stager's pull request, and ShardedTensor staging added to the path FileSystemWriter takes only (see_also)", state='present in torch 2.13.0', see_also=('pytorch/pytorch#131976', 'pytorch/pytorch#155192', 'pytorch/pytorch#156092'), docs='docs/state_dict.md')
CACHED_STAGING_NEEDS_ACCELERATOR = KnownBug('filesystemwriter-cache-staged-pin-memory', 'FileSystemWriter(cache_staged_state_dict=True) pins its staging copy: async_save fails on a host without an accelerator', relation='none found after four phrasings (the option, pinning, CPU-only hosts, the error text)', state='present in torch 2.13.0', see_also=('pytorch/pytorch#189991', 'pytorch/pytorch#159994'), docs='docs/state_dict.md')
FSDP1_HSDP_OPTIMIZER_LOAD = KnownBug('fsdp1-hsdp-load_sharded_optimizer_state_dict', 'load_sharded_optimizer_state_dict chunks optimizer state over the whole world: wrong Adam state in FSDP1 HYBRID_SHARD over a 2-D mesh', symptoms=frozenset({'mismatch'}), relation='none found after four phrasings; related: a review there notes that this function does not know the right rank and world size (see_also)', state='present in torch 2.13.0', see_also=('pytorch/pytorch#111096', 'pytorch/pytorch#145978'), ends_ranks=False, tag=':fsdp1-hsdp-load_sharded_optimizer_state_dict')
FSDP1_HSDP_RANK0_BROADCAST = KnownBug('fsdp1-hsdp-shard1-rank0-broadcast', 'set_optimizer_state_dict(full, cpu_offload) into FSDP1 HYBRID_SHARD with a shard dimension of 1 broadcasts from global rank 0 in a one-rank group', upstream='pytorch/pytorch#155680', relation='same line', state='open; #128444 (same path) was fixed only in part by pull request #128446', see_also=('pytorch/pytorch#128444',), conditional=True)
FSDP1_COMPILE_SHARDED_GRAD = KnownBug('fsdp1-compile-recompile-sharded-grad', "torch.compile over FSDP1 (use_orig_params=True, sharded): recompiling the wrapped module's forward while its parameters hold sharded gradients raises InternalTorchDynamoError 'attempting to assign a gradient of size ...'", upstream='pytorch/pytorch#111317', relation='same symptom (a comment there: SHARD_GRAD_OP, use_orig_params=True, float32)', state='open', see_also=('pytorch/pytorch#93288',))
DIVIDE_FACTOR_TWICE = KnownBug('fully_shard-divide-factor-single-shard-twice', 'set_gradient_divide_factor(f) on a fully_shard unit whose shard group is one rank, with set_force_sum_reduction_for_comms(True) or a float16 / float64 reduce dtype: gradients are divided by f twice (once where the single-rank branch copies the input, once more as the post-divide)', symptoms=frozenset({'mismatch'}), relation='none found after five phrasings; the single-rank division came with the first pull request in see_also, and a later one reworks that branch without the post-divide; an older wrong scale with a divide factor under HSDP had another cause, fixed before this branch existed', state='present in torch 2.13.0', see_also=('pytorch/pytorch#167178', 'pytorch/pytorch#196348', 'pytorch/pytorch#195732', 'pytorch/pytorch#155903'), ends_ranks=False, tag=':divide-factor-twice', training_only=True)
FROZEN_OPTIM_STATE_DROPPED = KnownBug('set_optimizer_state_dict-frozen-state-dropped', 'set_optimizer_state_dict drops the saved optimizer state of a parameter frozen (requires_grad=False) when it is loaded: a parameter trained, then frozen, checkpointed and unfrozen after resuming restarts with fresh optimizer state (get_optimizer_state_dict saved it)', symptoms=frozenset({'mismatch'}), upstream='pytorch/pytorch#192202', relation='same bug', state='open; fix pull request #192307 open, not in torch 2.13.0', see_also=('pytorch/pytorch#192307',), ends_ranks=False, tag=':frozen-optimizer-state-dropped', docs='docs/state_dict.md', odds=4)
FUSED_OPTIM_KEYS = KnownBug('dsd-fqn-modifiers-optimizer-keys', "a module whose state-dict hooks hide a child, declared through its fqn modifiers method (StateDictOptions.dsd_fqn_modifiers): get_optimizer_state_dict keys that child's parameters by named_parameters' names ('0.fused.weight'), set_optimizer_state_dict looks them up by the model state dict's ('0.weight'), so a get/set round trip of the optimizer fails: strict raises RuntimeError 'Missing optimizer state for parameter', non-strict drops that state, flattened raises KeyError 'param_groups.<fqn>.lr'. Any model, sharded or not", symptoms=frozenset({'exception', 'mismatch'}), relation="none found after five phrasings (the RuntimeError's text, dsd_fqn_modifiers / _fqn_modifiers with the optimizer, a state-dict hook renaming keys, the round trip of get/set_optimizer_state_dict, FusionEmbedding); see_also: the pull request that added the modifiers to the model state dict only", state='present in torch 2.13.0', see_also=('pytorch/pytorch#146557',), ends_ranks=False, tag=':fused-optimizer-keys', docs='docs/state_dict.md', conditional=True)
FUSED_CUSTOM_NAME = KnownBug('dsd-fqn-modifiers-name-ignored-on-get', "get_model_state_dict / get_state_dict ignore StateDictOptions(dsd_fqn_modifiers=...): they map the model's state-dict keys to FQNs through a method of the default name (_fqn_modifiers), so for a module whose state-dict hooks hide a child and whose method has the name the option gives, _get_fqns raises AttributeError ('<module> object has no attribute <key atom>'). Only set_model_state_dict reads the option. Any model, sharded or not", relation='none found after four phrasings (dsd_fqn_modifiers with get_model_state_dict, the AttributeError in _get_fqns, a custom fqn modifiers name, the option ignored); see_also: the pull request that added the option', state='present in torch 2.13.0', see_also=('pytorch/pytorch#146557',), docs='docs/state_dict.md', conditional=True)
FUSED_IGNORE_FROZEN = KnownBug('dsd-fqn-modifiers-ignore-frozen-keyerror', "get_model_state_dict(ignore_frozen_params=True) raises KeyError for a frozen parameter of a module whose state-dict hooks hide a child (declared through its fqn modifiers method): it pops the parameter's named_parameters name ('0.fused.weight'), which the state dict, keyed '0.weight', lacks", relation='none found after four phrasings (the KeyError in _get_model_state_dict, ignore_frozen_params with a state-dict hook, with fqn modifiers, frozen parameters of a wrapped module); see_also: the pull request that added the modifiers', state='present in torch 2.13.0', see_also=('pytorch/pytorch#146557',), docs='docs/state_dict.md', conditional=True)
PLAN_CACHE_FAILED_SAVE = KnownBug('dcp-plan-cache-after-failed-save', "DefaultSavePlanner(enable_plan_caching=True): a save that fails (FileSystemWriter(overwrite=False) refusing an existing checkpoint) leaves its plans cached; the next save with that planner class raises TypeError 'NoneType' object is not iterable in _create_global_plan", upstream='pytorch/pytorch#176289', relation='same bug (pull request: save plan caching during validation failures)', state='fixed in torch 2.13 (plans are cached only after a successful save); present in torch 2.11', fixed_in='2.13', docs='docs/state_dict.md')
CHECKPOINT_DEBUG = KnownBug('checkpoint-debug-always-refused', "composable checkpoint(module, debug=True) raises ValueError 'debug=True is incompatible with non-default context_fn' on the first forward whatever the caller passes: it always hands torch.utils.checkpoint a context_fn of its own", upstream='pytorch/pytorch#185285', relation='same bug (pull request: allow debug mode with context_fn in checkpoint(); an earlier attempt in see_also)', state='not in torch 2.13.0', see_also=('pytorch/pytorch#175338',), conditional=True)
SAC_OVER_FSDP_UNIT = KnownBug('selective-checkpoint-over-fully_shard-unit', "selective activation checkpointing (context_fn=create_selective_checkpoint_contexts) over a region holding a fully_shard unit whose state differs between forward and recomputation (kept unsharded by set_reshard_after_backward(False), prefetched, frozen): the replay counts FSDP2's record_function markers and raises 'profiler._record_function_enter_new.default invocation index N encountered during backward but not found in storage'", upstream='pytorch/pytorch#196862', relation='same bug (pull request: exclude all-gather internals and profiler ops from selective checkpointing)', state='the fix pull request is not in torch 2.13.0; torch 2.11 passes its case (device run, CPU)', see_also=('pytorch/pytorch#185178', 'pytorch/torchtitan#3427'), conditional=True, introduced_in='2.13')
DELAY_ALL_REDUCE_ROOT = KnownBug('ddp-delay-all-reduce-root-params-reduced-twice', "DistributedDataParallel(delay_all_reduce_named_params=..., param_to_hook_all_reduce=...): a delayed parameter of the root module itself stays in the reducer too (the reducer leaves out f'{module_name}.{name}', which is '.<name>' for the root's own parameters), so it is all-reduced twice, racing, and its gradient is wrong now and then; every parameter replicate() hands DDP is one (an nn.ParameterList's)", symptoms=frozenset({'mismatch'}), relation='none found after five phrasings; the option came with the pull request in see_also', state='present in torch 2.13.0', see_also=('pytorch/pytorch#95669',), ends_ranks=False, tag=':delay-all-reduce', odds=4)
DELAY_BUFFER_FLOAT32 = KnownBug('ddp-delay-all-reduce-float32-buffer', "DistributedDataParallel(delay_all_reduce_named_params=..., param_to_hook_all_reduce=...) over parameters that are not float32: the delayed gradients' buffer is made with torch.zeros and no dtype, and _clear_grad_buffer raises 'attempting to assign a gradient with dtype 'float' to a tensor with grad_dtype 'Double''", relation='none found after three phrasings (the error text, the buffer, the option); the option came with the pull request in see_also', state='present in torch 2.13.0', see_also=('pytorch/pytorch#95669',))
STAGER_REUSED_AFTER_CLOSE = KnownBug('default-stager-reused-after-close', "dcp.async_save(async_stager=DefaultStager(...)) reused for a second save: DefaultStager._stage closes its StateDictStager after every stage, which empties its copy dispatch table, and the next stage raises KeyError: <class 'type'> in deepcopy_with_tensor_offload", upstream='pytorch/pytorch#183413', relation='same bug (a regression of the pull request in see_also, which added the close)', state='present in torch 2.11; torch 2.13.0 stages again after a close', see_also=('pytorch/pytorch#170431', 'pytorch/torchtitan#3476'), fixed_in='2.13', docs='docs/state_dict.md')
COMPILED_UNFREEZE_PLAIN = KnownBug('compile-unfrozen-plain-param-no-recompile', "torch.compile (aot_eager) of a module whose plain (non-DTensor) parameter was frozen when it was compiled: after requires_grad_(True) the compiled forward is reused without a recompile and the parameter gets no gradient (met through fully_shard's ignored_params, which stay plain tensors)", symptoms=frozenset({'mismatch'}), upstream='pytorch/pytorch#139476', relation='same bug (Dynamo reuses a compiled frame when the requires_grad of module parameters changes)', state='present in torch 2.11; torch 2.13.0 recompiles (the torch-only reproducer passes there)', fixed_in='2.13', ends_ranks=False, tag=':compiled-unfreeze')
DTENSOR_CONV_PARTIAL = KnownBug('dtensor-conv-partial-input-backward', "DTensor convolution runs the local op on its inputs as they are, not redistributed to the placements its sharding propagation chose (convolution_handler ignores needs_redistribute): a Partial input (a rowwise-parallel output) gives a local partial result labelled Replicate (wrong values, no error) and backward raises 'Can not redistribute from R to P(sum)'; a [Shard(0), Partial] input raises ValueError 'Tensor dim 0 is already sharded on mesh dim 0' (dim_map of the chosen [Shard(0), Shard(0)]); a channel-sharded input (Shard(1)) raises the local conv's RuntimeError 'expected input[...] to have 2 channels, but got 1'", symptoms=frozenset({'exception', 'mismatch'}), tag=':conv-partial', relation="none found after seven phrasings (the error texts with convolution_backward and with convolution, DTensor conv1d with a partial input, the handler's redistribute, the convolution's single-dimension strategy, convolution_handler's dim_map, a channel-sharded conv1d input); related (see_also): the same handler's wrong grad_input placement for a spatially sharded input and its fix, whose strategies filter out layouts the handler's dim_map cannot represent; an open pull request whose description names the handler running on still-sharded local tensors, for depthwise convolutions; a grad_input of None", state='present in torch 2.13.0', see_also=('pytorch/pytorch#191926', 'pytorch/pytorch#192147', 'pytorch/pytorch#186129', 'pytorch/pytorch#142278'), conditional=True)
DTENSOR_MSE_LOSS = KnownBug('dtensor-mse-loss-backward-local-count', "F.mse_loss (mean) of a DTensor sharded on the batch dimension: the value is the global mean, but aten.mse_loss_backward has no sharding strategy, so DTensor takes one from its decomposition at the global shape and runs the op on each rank's shard, which divides by the shard's element count: every gradient is the true one times the number of shards of the batch", symptoms=frozenset({'mismatch'}), relation="none found after ten phrasings (DTensor mse_loss backward gradient, mse_loss_backward sharding strategy, a DTensor loss's gradient multiplied by the world size over a sharded batch, decomposition sharding propagation and numel of a local shard, among them); related, not the same: nll_loss with weights over a sharded batch (a wrong forward value), DTensor.mean with uneven shards, loss parallel refusing 'mean' on N-D meshes; the decomposition-based propagation came with the last pull request", state='present in torch 2.13.0 and 2.11.0 (its torch-only reproducer in docs/known_bugs.md, on CPU)', see_also=('pytorch/pytorch#185167', 'pytorch/pytorch#162692', 'pytorch/pytorch#180936', 'pytorch/pytorch#171652'), ends_ranks=False, tag=':mse-loss', training_only=True)
FIXED_ENV = 'SHARDFUZZ_FIXED'

def fixed():
    return frozenset(filter(None, os.environ.get(FIXED_ENV, '').split(',')))

def get():
    pass

def int_reshard_dim1():
    pass

def fsdp1_shard1():
    pass

def checkpoint_debug():
    pass

def selective_over_unit():
    pass

def delayed_all_reduce():
    pass

def stager_reused():
    pass

def fsdp1_shard1_full_offload_load():
    pass

def fsdp1_full_offload():
    pass

def fsdp1_dcp_stateless():
    pass

def fsdp1_dcp_empty_shard():
    pass

def fsdp1_async_default_stager():
    pass

def hsdp_optimizer_load():
    pass

def broadcast_empty():
    pass

def frozen_state_dropped(body):
    loaded = any((e in body.entries and e not in () for e in (DcpItem.OPTIMIZER, DcpItem.APP))) and (not False)
    return loaded and bool(trained_then_frozen(body))

def fused_in_optimizer():
    pass

def fused_custom_name():
    pass

def fused_ignore_frozen():
    pass

def plan_cache_failed_save():
    pass

def stateless_full():
    pass

def flat_full_optimizer():
    pass

def compositions():
    pass

def _per_comp():
    pass

def _with_training():
    pass

def _saving(condition):
    return lambda case: isinstance(case.body, (StateDictBody, DcpBody)) and condition(case)

def _frozen_int_reshard(case):
    pass

def _foreach_mixed(case):
    pass

def _unfrozen_unresharded(case):
    pass

def _fsdp1_frozen_source(case):
    pass

def _fsdp1_unfrozen_frozen_unit(case):
    pass
CONDITIONS = ((INT_RESHARD_DIM1, lambda case: any((int_reshard_dim1() for c in compositions()))), (FSDP1_HSDP_SHARD1, lambda case: any((fsdp1_shard1() for c in compositions()))), (FSDP1_FROZEN_UNIT, _fsdp1_frozen_source), (FSDP1_HSDP_RANK0_BROADCAST, _saving(lambda case: fsdp1_shard1_full_offload_load())), (FSDP1_FULL_OFFLOAD, _saving(lambda case: fsdp1_full_offload())), (FSDP1_DCP_STATELESS, _saving(lambda case: fsdp1_dcp_stateless())), (FSDP1_DCP_EMPTY_SHARD, _saving(lambda case: fsdp1_dcp_empty_shard())), (FSDP1_ASYNC_DEFAULT_STAGER, _saving(lambda case: fsdp1_async_default_stager())), (CACHED_STAGING_NEEDS_ACCELERATOR, lambda case: isinstance(case.body, DcpBody) and case.body.cache_staged), (BROADCAST_EMPTY, _saving(lambda case: broadcast_empty())), (STATELESS_FULL, _saving(lambda case: stateless_full())), (FLAT_FULL_OPTIM, _saving(lambda case: flat_full_optimizer())), (FUSED_CUSTOM_NAME, _saving(lambda case: fused_custom_name())), (FUSED_IGNORE_FROZEN, _saving(lambda case: fused_ignore_frozen())), (FUSED_OPTIM_KEYS, _saving(lambda case: fused_in_optimizer())), (PLAN_CACHE_FAILED_SAVE, _saving(lambda case: plan_cache_failed_save())), (FSDP1_HSDP_OPTIMIZER_LOAD, _saving(lambda case: hsdp_optimizer_load())), (FROZEN_OPTIM_STATE_DROPPED, _saving(lambda case: frozen_state_dropped(case.body))), (FROZEN_INT_RESHARD, _frozen_int_reshard), (UNFROZEN_UNRESHARDED, _unfrozen_unresharded), (UNUSED_NO_ALL_REDUCE, _per_comp()), (MP_NEVER_RUN_NO_SYNC, _per_comp()), (MP_UNIFORM_GRAD_DTYPE, _per_comp()), (MP_FROZEN_AT_LAZY_INIT, _per_comp()), (FSDP1_UNFROZEN_FROZEN_UNIT, _fsdp1_unfrozen_frozen_unit), (FOREACH_MIXED, _foreach_mixed), (FSDP1_COMPILE_SHARDED_GRAD, _with_training()), (DIVIDE_FACTOR_TWICE, _with_training()), (CHECKPOINT_DEBUG, lambda case: any((checkpoint_debug() for c in compositions()))), (SAC_OVER_FSDP_UNIT, lambda case: any((selective_over_unit() for c in compositions()))), (DELAY_ALL_REDUCE_ROOT, lambda case: any((delayed_all_reduce() for c in compositions()))), (COMPILED_UNFREEZE_PLAIN, _with_training()), (DELAY_BUFFER_FLOAT32, _with_training()), (STAGER_REUSED_AFTER_CLOSE, _saving(lambda case: stager_reused())), (DTENSOR_CONV_PARTIAL, _per_comp()), (DTENSOR_MSE_LOSS, _per_comp()))
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

def _one_bug(failure):
    return failure if failure is None or failure.kind != 'mismatch' or (not failure.signature.endswith(FSDP1_HSDP_SHARD1.tag)) else None

def judge_dcp(case, outcome):
    return _one_bug(_optimizer_load_bug(case, _hsdp_optimizer_load(case, _judge_dcp(case, outcome))))
OPTIMIZER_CHECKS = ('optimizer', *RESUME_CHECKS)

def _hsdp_optimizer_load(case, failure):
    body = case.body
    return failure if failure is None or failure.kind != 'mismatch' or (not isinstance(body, DcpBody)) or (not hsdp_optimizer_load()) or (failure.details.get('check') not in OPTIMIZER_CHECKS) else None
_OPTIMIZER_LOAD_BUGS = (FROZEN_OPTIM_STATE_DROPPED, FUSED_OPTIM_KEYS)

def _optimizer_load_bug(case, failure):
    body = case.body
    if failure is None or failure.kind != 'mismatch' or (not isinstance(body, (StateDictBody, DcpBody))) or (failure.details.get('check') not in OPTIMIZER_CHECKS):
        return failure
    for bug in _OPTIMIZER_LOAD_BUGS:
        meets_out = bug.id not in fixed() and any((b is bug and condition(case) for b, condition in CONDITIONS))
        if meets_out:
            tag = bug.tag.lstrip(':')
            signature = Signature('mismatch', 'dcp', where='set_optimizer_state_dict', tags=(tag,))
            return dataclasses.replace(failure, signature=str(signature))

def _check_taken_optimizer():
    pass

def _judge_dcp(case, outcome):
    body = case.body
    assert isinstance(body, DcpBody)
    prop, observations = ('dcp', outcome.observations)
    shard1_out = FSDP1_HSDP_SHARD1.tag if fsdp1_shard1() else ''
    where = 'save' + shard1_out
    for rank, obs in enumerate(observations):
        pass
    loaded_entries = [e for e in body.entries if e not in ()]
    model_loaded = DcpItem.MODEL in loaded_entries or DcpItem.APP in loaded_entries
    optim_loaded = DcpItem.OPTIMIZER in loaded_entries or DcpItem.APP in loaded_entries
    first = observations[0]
    saved, loaded, fresh, dropped = (first['saved'], first['loaded'], first.get('fresh'), first['dropped'])
    if 'taken_optimizer' in saved:
        failure = _check_taken_optimizer()
    if failure is None and 'reloaded' in first:
        pass
    if model_loaded:
        pass
    if failure is None and optim_loaded:
        first_ = observations[0]
        failure = _exact(prop, 'optimizer', where, 'the optimizer state', first_['loaded']['optimizer'], first_['saved']['optimizer'])
    for rank, obs in enumerate(observations):
        if failure is not None:
            break
        want_groups = obs['saved']['groups'] if optim_loaded else obs['fresh']['groups']
        failure = _exact(prop, 'groups', where, f"rank {rank}'s param groups", obs['loaded']['groups'], want_groups)
    if failure is None and model_loaded and (not dropped):
        failure = _exact(prop, 'probe', where, 'the forward output on the fixed input', loaded['probe'], saved['probe'])
    if failure is None:
        pass
    return failure

def attempt(rank, world_size):
    import torch
    import torch.distributed as dist
    case = Case(property='dcp', world_size=2, seed=0, body=DcpBody(tree=ModuleTree(width=2, root=Block(children=(Leaf(kind=LeafKind.LINEAR, bias=False), Leaf(kind=LeafKind.LINEAR, bias=False)))), source=Composition(), target=Composition(), entries=(DcpItem.MODEL, DcpItem.OPTIMIZER), training=Training(momentum=0.9, batch_per_rank=1), requires_grad=(RequiresGrad(path='0', step=1, trainable=False),)))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import json
    run_dcp_out = _run_dcp(ctx)
    obs = json.loads(json.dumps(run_dcp_out))
    outs = [None] * world_size
    dist.all_gather_object(outs, obs)
    if rank != 0:
        return ''
    reports = tuple((o for r, o in enumerate(outs)))
    failure = judge_dcp(case, Outcome(kind=OutcomeKind.OK, ranks=reports, seconds=0.0))
    if failure is not None:
        return f'REPRODUCED mismatch:dcp@set_optimizer_state_dict:frozen-optimizer-state-dropped: {failure.summary}'
    return f'PASS or another failure: {failure and failure.summary}'

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
