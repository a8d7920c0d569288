#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=f8717496fe4a5c07 sources=32d77006ab4f02d0 seconds=1732.7
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
import os
from torch import nn
import torch.distributed as dist
from dataclasses import replace

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
    bias: object = True

@dataclass()
class Block:
    children: object

@dataclass()
class ModuleTree:
    width: object
    root: object

@dataclass()
class Composition:
    pass

@dataclass()
class Training:
    momentum: object = 0.0
    batch_per_rank: object = 2

class Body:
    pass

@dataclass()
class Case:
    property: object
    world_size: object
    seed: object
    body: object

@dataclass()
class RequiresGrad:
    path: object
    step: object
    trainable: object

class DcpItem(str, enum.Enum):
    MODEL = 'model'
    OPTIMIZER = 'optimizer'
    APP = 'app'

@dataclass()
class DcpBody(Body):
    tree: object
    source: object
    target: object
    entries: object
    training: object = field()
    requires_grad: object = ()

def build_model(device):
    return nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))

@dataclass
class Composed:
    model: object
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
        current = {id(p): n for n, p in self.model.named_parameters()}
        return {**self.param_names, **current}

def build_side(comp, training, ctx, *, seed, schedule=()):
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
    name, p_ = next(iter(model.named_parameters()))
    owner = '.'.join((c_ for c_ in name.split('.')[:-1] if c_.isdigit()))
    out[owner].append(p_)
    p = next(iter(out['0']))
    p.requires_grad_(False)

def requires_grad(side):
    pass

def body_optimizer(side, training):
    params = list(side.model.parameters())
    held = set()
    side.opt = torch.optim.SGD(params, momentum=training.momentum)
    side.param_names = {id(p): n for n, p in side.model.named_parameters()}

def _jsonable():
    pass

def observe(side, ctx):
    obs = {}
    names = side.names()
    out_ = {}
    group = next(iter(side.opt.param_groups))
    p = next(iter(group['params']))
    state = side.opt.state.get(p, {})
    entry = {key: _jsonable() for key in sorted(state)}
    if entry:
        out_[names.get(id(p), '?')] = entry
    obs['optimizer'] = out_
    return obs

def case_dir():
    pass

def _values(side):
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
    out = {}
    for entry in (DcpItem.OPTIMIZER,):
        if entry is DcpItem.MODEL:
            pass
        else:
            out[entry] = get_optimizer_state_dict(side.model, side.opt)
    return out

def _observe_entries(values):
    out = {}
    return out

def _run_dcp(ctx):
    t = Training(momentum=0.9)
    path = case_dir()
    training_ = replace(t)
    gen = torch.Generator().manual_seed(0)
    src = None
    src = build_side(Composition(), t, ctx, seed=0)
    body_optimizer(src, t)
    values = _values(src)
    order = range(len(()))
    saved = {**observe(src, ctx), **_observe_entries(values)}
    taken = values.get(DcpItem.OPTIMIZER)
    obs = {'saved': saved}
    tgt = build_side(Composition(), t, ctx, seed=FRESH_SEED, schedule=(RequiresGrad(path='0', step=1, trainable=False),))
    fresh_training_out = replace(t)
    body_optimizer(tgt, fresh_training_out)
    for step in range(tgt.step, 2):
        change_requires_grad(tgt, step)
    obs['dropped'] = None
    values = _values(tgt)
    order_ = range(len(()))
    before = requires_grad(tgt)
    obs['loaded'] = {**observe(tgt, ctx), **_observe_entries(values)}
    return obs

@dataclass()
class KnownBug:
    id: object
    title: object
    state: object = ''
    ends_ranks: object = True
    tag: object = ''
    see_also: object = ()
    training_only: object = False
FSDP1_HSDP_SHARD1 = KnownBug('fsdp1-hybrid-shard-dim-1', 'FSDP1 HYBRID_SHARD with a shard dimension of size 1 never averages gradients across replicas', tag=':shard1')
FOREACH_MIXED = KnownBug('foreach-mixed-dtensor-tensor', 'foreach optimizers over a mix of DTensor (fully_shard) and plain (replicate) parameters raise')
INT_RESHARD_DIM1 = KnownBug('fully_shard-int-reshard-shard-dim-1', 'fully_shard with an int reshard_after_forward and Shard(1) placements: IndexError in foreach_all_gather_copy_out')
FROZEN_INT_RESHARD = KnownBug('fully_shard-frozen-int-reshard', "a frozen fully_shard unit with an int reshard_after_forward under a replicate'd root stays in its post-forward state")
UNFROZEN_UNRESHARDED = KnownBug('fully_shard-unfrozen-unresharded', "a frozen fully_shard unit without resharding under a replicate'd root is never resharded: a leaf unfrozen later never trains (KeyError in get_optimizer_state_dict)")
UNUSED_NO_ALL_REDUCE = KnownBug('fully_shard-unused-no-all-reduce', 'HSDP with set_requires_all_reduce(False): a unit unused on the last microbatch loses its accumulated gradient')
FSDP1_UNFROZEN_FROZEN_UNIT = KnownBug('fsdp1-no-shard-unfrozen-in-frozen-unit', 'FSDP1 NO_SHARD, a unit all frozen at wrapping: a leaf unfrozen later never trains')
MP_UNIFORM_GRAD_DTYPE = KnownBug('fully_shard-reduce-dtype-no-sync-uniform-grad-dtype', "MixedPrecisionPolicy(reduce_dtype) with set_requires_gradient_sync(False) and a parameter unused on a no-sync microbatch: 'FSDP reduce-scatter expects uniform gradient dtype'")
MP_NEVER_RUN_NO_SYNC = KnownBug('fully_shard-reduce-dtype-no-sync-never-run', "MixedPrecisionPolicy(reduce_dtype) with set_requires_gradient_sync(False): a unit that never ran forward has no '_unsharded_param' in the root's post-backward")
MP_FROZEN_AT_LAZY_INIT = KnownBug('fully_shard-mp-frozen-at-lazy-init', 'MixedPrecisionPolicy: a unit all frozen at lazy init gets no orig/reduce dtype; unfrozen later, its low-precision gradient is never cast back')
BROADCAST_EMPTY = KnownBug('set_state_dict-broadcast-empty', 'set_state_dict(broadcast_from_rank0=True) deadlocks when ranks other than 0 pass an empty model state dict')
STATELESS_FULL = KnownBug('set_optimizer_state_dict-full-stateless', "set_optimizer_state_dict(full_state_dict=True) for an optimizer without tensor state: 'Expected device to be set'")
FLAT_FULL_OPTIM = KnownBug('set_optimizer_state_dict-flat-full-keyerror', "set_optimizer_state_dict(full_state_dict=True, flatten_optimizer_state_dict=True) raises KeyError 'param_groups.0.params.0' for any model: the full-state branch takes the optimizer's local state dict with the flatten option still on, so the loaded and the local dicts have different keys")
FSDP1_FULL_OFFLOAD = KnownBug('fsdp1-full-state-dict-offload-to-cpu', 'FSDP1 FULL_STATE_DICT with offload_to_cpu on CPU: state_dict() clones a freed buffer (SIGSEGV), optim_state_dict aliases the gathered states')
FSDP1_FROZEN_UNIT = KnownBug('fsdp1-no-shard-frozen-unit-state-dict', "FSDP1 NO_SHARD with an auto-wrapped unit of frozen parameters: state_dict() after training raises 'FSDP assumes ... is in the state_dict'")
FSDP1_DCP_STATELESS = KnownBug('fsdp1-dcp-stateless-optimizer', "the classic FSDP1 DCP recipe with an optimizer without state: optim_state_dict_to_load refuses the dict without 'state'")
FSDP1_DCP_EMPTY_SHARD = KnownBug('dcp-load-empty-sharded-tensor-pre-2.4-guess', "dcp.load of an FSDP1 sharded state dict where a rank holds no chunk of a parameter: the planner guesses a pre-2.4 checkpoint, 'Missing key in checkpoint state_dict'")
FSDP1_ASYNC_DEFAULT_STAGER = KnownBug('async_save-default-stager-sharded-tensor', "dcp.async_save's default stager calls data_ptr() on ShardedTensors")
CACHED_STAGING_NEEDS_ACCELERATOR = KnownBug('filesystemwriter-cache-staged-pin-memory', 'FileSystemWriter(cache_staged_state_dict=True) pins its staging copy: async_save fails on a host without an accelerator')
FSDP1_HSDP_OPTIMIZER_LOAD = KnownBug('fsdp1-hsdp-load_sharded_optimizer_state_dict', 'load_sharded_optimizer_state_dict chunks optimizer state over the whole world: wrong Adam state in FSDP1 HYBRID_SHARD over a 2-D mesh')
FSDP1_HSDP_RANK0_BROADCAST = KnownBug('fsdp1-hsdp-shard1-rank0-broadcast', 'set_optimizer_state_dict(full, cpu_offload) into FSDP1 HYBRID_SHARD with a shard dimension of 1 broadcasts from global rank 0 in a one-rank group')
FSDP1_COMPILE_SHARDED_GRAD = KnownBug('fsdp1-compile-recompile-sharded-grad', "torch.compile over FSDP1 (use_orig_params=True, sharded): recompiling the wrapped module's forward while its parameters hold sharded gradients raises InternalTorchDynamoError 'attempting to assign a gradient of size ...'")
DIVIDE_FACTOR_TWICE = KnownBug('fully_shard-divide-factor-single-shard-twice', 'set_gradient_divide_factor(f) on a fully_shard unit whose shard group is one rank, with set_force_sum_reduction_for_comms(True) or a float16 / float64 reduce dtype: gradients are divided by f twice (once where the single-rank branch copies the input, once more as the post-divide)')
FROZEN_OPTIM_STATE_DROPPED = KnownBug('set_optimizer_state_dict-frozen-state-dropped', 'set_optimizer_state_dict drops the saved optimizer state of a parameter frozen (requires_grad=False) when it is loaded: a parameter trained, then frozen, checkpointed and unfrozen after resuming restarts with fresh optimizer state (get_optimizer_state_dict saved it)')
FUSED_OPTIM_KEYS = KnownBug('dsd-fqn-modifiers-optimizer-keys', "a module whose state-dict hooks hide a child, declared through its fqn modifiers method (StateDictOptions.dsd_fqn_modifiers): get_optimizer_state_dict keys that child's parameters by named_parameters' names ('0.fused.weight'), set_optimizer_state_dict looks them up by the model state dict's ('0.weight'), so a get/set round trip of the optimizer fails: strict raises RuntimeError 'Missing optimizer state for parameter', non-strict drops that state, flattened raises KeyError 'param_groups.<fqn>.lr'. Any model, sharded or not")
FUSED_CUSTOM_NAME = KnownBug('dsd-fqn-modifiers-name-ignored-on-get', "get_model_state_dict / get_state_dict ignore StateDictOptions(dsd_fqn_modifiers=...): they map the model's state-dict keys to FQNs through a method of the default name (_fqn_modifiers), so for a module whose state-dict hooks hide a child and whose method has the name the option gives, _get_fqns raises AttributeError ('<module> object has no attribute <key atom>'). Only set_model_state_dict reads the option. Any model, sharded or not")
FUSED_IGNORE_FROZEN = KnownBug('dsd-fqn-modifiers-ignore-frozen-keyerror', "get_model_state_dict(ignore_frozen_params=True) raises KeyError for a frozen parameter of a module whose state-dict hooks hide a child (declared through its fqn modifiers method): it pops the parameter's named_parameters name ('0.fused.weight'), which the state dict, keyed '0.weight', lacks")
PLAN_CACHE_FAILED_SAVE = KnownBug('dcp-plan-cache-after-failed-save', "DefaultSavePlanner(enable_plan_caching=True): a save that fails (FileSystemWriter(overwrite=False) refusing an existing checkpoint) leaves its plans cached; the next save with that planner class raises TypeError 'NoneType' object is not iterable in _create_global_plan")
CHECKPOINT_DEBUG = KnownBug('checkpoint-debug-always-refused', "composable checkpoint(module, debug=True) raises ValueError 'debug=True is incompatible with non-default context_fn' on the first forward whatever the caller passes: it always hands torch.utils.checkpoint a context_fn of its own")
SAC_OVER_FSDP_UNIT = KnownBug('selective-checkpoint-over-fully_shard-unit', "selective activation checkpointing (context_fn=create_selective_checkpoint_contexts) over a region holding a fully_shard unit whose state differs between forward and recomputation (kept unsharded by set_reshard_after_backward(False), prefetched, frozen): the replay counts FSDP2's record_function markers and raises 'profiler._record_function_enter_new.default invocation index N encountered during backward but not found in storage'")
DELAY_ALL_REDUCE_ROOT = KnownBug('ddp-delay-all-reduce-root-params-reduced-twice', "DistributedDataParallel(delay_all_reduce_named_params=..., param_to_hook_all_reduce=...): a delayed parameter of the root module itself stays in the reducer too (the reducer leaves out f'{module_name}.{name}', which is '.<name>' for the root's own parameters), so it is all-reduced twice, racing, and its gradient is wrong now and then; every parameter replicate() hands DDP is one (an nn.ParameterList's)")
DELAY_BUFFER_FLOAT32 = KnownBug('ddp-delay-all-reduce-float32-buffer', "DistributedDataParallel(delay_all_reduce_named_params=..., param_to_hook_all_reduce=...) over parameters that are not float32: the delayed gradients' buffer is made with torch.zeros and no dtype, and _clear_grad_buffer raises 'attempting to assign a gradient with dtype 'float' to a tensor with grad_dtype 'Double''")
STAGER_REUSED_AFTER_CLOSE = KnownBug('default-stager-reused-after-close', "dcp.async_save(async_stager=DefaultStager(...)) reused for a second save: DefaultStager._stage closes its StateDictStager after every stage, which empties its copy dispatch table, and the next stage raises KeyError: <class 'type'> in deepcopy_with_tensor_offload")
COMPILED_UNFREEZE_PLAIN = KnownBug('compile-unfrozen-plain-param-no-recompile', "torch.compile (aot_eager) of a module whose plain (non-DTensor) parameter was frozen when it was compiled: after requires_grad_(True) the compiled forward is reused without a recompile and the parameter gets no gradient (met through fully_shard's ignored_params, which stay plain tensors)")
DTENSOR_CONV_PARTIAL = KnownBug('dtensor-conv-partial-input-backward', "DTensor convolution runs the local op on its inputs as they are, not redistributed to the placements its sharding propagation chose (convolution_handler ignores needs_redistribute): a Partial input (a rowwise-parallel output) gives a local partial result labelled Replicate (wrong values, no error) and backward raises 'Can not redistribute from R to P(sum)'; a [Shard(0), Partial] input raises ValueError 'Tensor dim 0 is already sharded on mesh dim 0' (dim_map of the chosen [Shard(0), Shard(0)]); a channel-sharded input (Shard(1)) raises the local conv's RuntimeError 'expected input[...] to have 2 channels, but got 1'")
DTENSOR_MSE_LOSS = KnownBug('dtensor-mse-loss-backward-local-count', "F.mse_loss (mean) of a DTensor sharded on the batch dimension: the value is the global mean, but aten.mse_loss_backward has no sharding strategy, so DTensor takes one from its decomposition at the global shape and runs the op on each rank's shard, which divides by the shard's element count: every gradient is the true one times the number of shards of the batch", see_also=('pytorch/pytorch#185167', 'pytorch/pytorch#162692', 'pytorch/pytorch#180936', 'pytorch/pytorch#171652'), ends_ranks=False, tag=':mse-loss', training_only=True)

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
    pass

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
    pass

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

@dataclass(frozen=True)
class Failure:
    kind: object
    signature: object
    summary: object
    details: object = field(default_factory=dict)

def _mismatch(prop, check, where, summary, **details):
    return Failure('mismatch', str(Signature('mismatch', prop, check, where)), summary, {'check': check, **details})

def _first_difference(got, want, path=''):
    return '' if got == want else f'{path}: {got!r} != {want!r}'

def _exact(prop, check, where, what, got, want, **details):
    diff = _first_difference(got, want)
    if not diff:
        return None
    return _mismatch(prop, check, where, f'{what} differs after the load: {diff}', observed=got, expected=want, **details)
OPTIMIZER_CHECKS = ('optimizer', *RESUME_CHECKS)
_OPTIMIZER_LOAD_BUGS = (FROZEN_OPTIM_STATE_DROPPED, FUSED_OPTIM_KEYS)

def _optimizer_load_bug(case, failure):
    return failure
    bug = next(iter(_OPTIMIZER_LOAD_BUGS))

def attempt(rank, world_size):
    import torch
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
    prop, observations = ('dcp', [r or {} for r in reports])
    shard1_out = FSDP1_HSDP_SHARD1.tag if fsdp1_shard1() else ''
    where = 'save' + shard1_out
    failure___ = None
    first_ = observations[0]
    failure___ = _exact(prop, 'optimizer', where, 'the optimizer state', first_['loaded']['optimizer'], first_['saved']['optimizer'])
    failure__ = failure___
    body = DcpBody(tree=ModuleTree(width=2, root=Block(children=(Leaf(kind=LeafKind.LINEAR, bias=False), Leaf(kind=LeafKind.LINEAR, bias=False)))), source=Composition(), target=Composition(), entries=(DcpItem.MODEL, DcpItem.OPTIMIZER), training=Training(momentum=0.9, batch_per_rank=1), requires_grad=(RequiresGrad(path='0', step=1, trainable=False),))
    hsdp_optimizer_load_out = failure__ if failure__ is None or failure__.kind != 'mismatch' or (not isinstance(body, DcpBody)) or (not hsdp_optimizer_load()) or (failure__.details.get('check') not in OPTIMIZER_CHECKS) else None
    failure_ = _optimizer_load_bug(case, hsdp_optimizer_load_out)
    failure = failure_ if failure_ is None or failure_.kind != 'mismatch' or (not failure_.signature.endswith(FSDP1_HSDP_SHARD1.tag)) else None
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
