#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=46830f01210eaf42 sources=7d6f5cb23a31c8e4 seconds=1333.5
# Reproduces shardfuzz corpus entry dcp-exception-491a9c43abbb.json: exception:dcp:torch.distributed.checkpoint.api.CheckpointException@torch/distributed/checkpoint/default_planner.py:_create_global_plan
# Known torch bug: DefaultSavePlanner(enable_plan_caching=True): a save that fails
# (FileSystemWriter(overwrite=False) refusing an existing checkpoint) leaves its plans cached; the
# next save with that planner class raises TypeError 'NoneType' object is not iterable in
# _create_global_plan; upstream: https://github.com/pytorch/pytorch/issues/176289.
# Observed: rank 0 raised torch.distributed.checkpoint.api.CheckpointException:
# CheckpointException ranks:dict_keys([0])
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: while the failure is there a rank raises
# torch.distributed.checkpoint.api.CheckpointException in
# torch/distributed/checkpoint/default_planner.py:_create_global_plan and torchrun exits 1; else
# every rank prints PASS and it exits 0.

from __future__ import annotations
from dataclasses import dataclass, field
import torch
import enum
from dataclasses import dataclass
from dataclasses import dataclass, field, fields
from typing import ClassVar
import os
from typing import ClassVar
import torch.distributed as dist
import inspect
from dataclasses import dataclass, field
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

@dataclass(frozen=True)
class ModuleTree:
    width: object
    root: object

@dataclass(frozen=True)
class Composition:

    def steps(self):
        pass

class Optimizer(str, enum.Enum):
    SGD = 'sgd'
    ADAM = 'adam'
    ADAMW = 'adamw'

@dataclass(frozen=True)
class Training:
    optimizer: object = Optimizer.SGD
    steps: object = 2
    batch_per_rank: object = 2

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

class Overwrite(str, enum.Enum):
    NONE = 'none'
    TRUE = 'true'
    FALSE = 'false'

class DcpItem(str, enum.Enum):
    MODEL = 'model'
    OPTIMIZER = 'optimizer'
    APP = 'app'
    SCALARS = 'scalars'
    COUNTER = 'counter'
    EXTRA = 'extra'

@dataclass(frozen=True)
class WriterOptions:

    def changed(self):
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != f.default}

@dataclass(frozen=True)
class SavePlannerOptions:
    flatten_sharded_tensors: object = True
    dedup_save_to_lowest_rank: object = False
    enable_plan_caching: object = False

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
    storage_objects: object = False
    overwrite: object = Overwrite.NONE
    save_planner: object = None

def build_side():
    pass

def torch_kwargs(fn, kwargs):
    params = inspect.signature(fn).parameters
    missing = sorted((k for k in kwargs if k not in params))
    return kwargs

def case_dir(ctx):
    digest = hashlib.sha1('{"body": {"absent": false, "async_save": false, "async_saves": 0, "cache_staged": false, "checkpoint_dir": "", "convert": false, "deadlock": false, "drop": [], "empty_group": false, "entries": ["model"], "frozen_in_optimizer": false, "kind": "dcp", "load_cpu_offload": false, "load_full_state_dict": false, "load_planner": null, "mode": "round_trip", "module_stateful": false, "no_dist": false, "orders": [], "overwrite": "false", "own_group": false, "patched": false, "process_checkpointer": false, "requires_grad": [], "save_cpu_offload": false, "save_full_state_dict": false, "save_planner": {"dedup_save_to_lowest_rank": false, "enable_plan_caching": true, "flatten_sharded_tensors": true}, "skip": [], "source": {"auto_wrap": false, "checkpoint_first": true, "checkpoint_options": {"context_fn": "none", "debug": false, "determinism_check": null, "early_stop": null, "preserve_rng_state": true}, "checkpoints": [], "find_unused": false, "knobs": {"abort_and_reset": false, "all_reduce_hook_scale": null, "backward_prefetch": 0, "explicit_unshard": false, "force_sum_reduction": false, "forward_prefetch": 0, "gradient_divide_factor": null, "late_reshard_after_forward": null, "pg_allocator": false, "reduce_scatter_unused": false, "reshard_after_backward_last": false, "rs_max_buffers": 0}, "mesh": [], "meta_init": false, "replicate_options": {"batched_grad_copy": false, "bucket_cap_mb": null, "bucket_cap_mb_list": [], "delay_all_reduce": false, "device_id": false, "dim": 0, "forward_sync_buffers": null, "gradient_as_bucket_view": false, "group": "default", "ignored_modules": [], "init_sync": true, "skip_all_reduce_unused_params": false, "static_graph": false}, "replicates": [], "shards": [], "tp": [], "tp_size": 1, "wrapper": "none"}, "stager": null, "steps_after": 1, "storage_objects": true, "target": {"auto_wrap": false, "checkpoint_first": true, "checkpoint_options": {"context_fn": "none", "debug": false, "determinism_check": null, "early_stop": null, "preserve_rng_state": true}, "checkpoints": [], "find_unused": false, "knobs": {"abort_and_reset": false, "all_reduce_hook_scale": null, "backward_prefetch": 0, "explicit_unshard": false, "force_sum_reduction": false, "forward_prefetch": 0, "gradient_divide_factor": null, "late_reshard_after_forward": null, "pg_allocator": false, "reduce_scatter_unused": false, "reshard_after_backward_last": false, "rs_max_buffers": 0}, "mesh": [], "meta_init": false, "replicate_options": {"batched_grad_copy": false, "bucket_cap_mb": null, "bucket_cap_mb_list": [], "delay_all_reduce": false, "device_id": false, "dim": 0, "forward_sync_buffers": null, "gradient_as_bucket_view": false, "group": "default", "ignored_modules": [], "init_sync": true, "skip_all_reduce_unused_params": false, "static_graph": false}, "replicates": [], "shards": [], "tp": [], "tp_size": 1, "wrapper": "none"}, "target_meta_init": false, "torch_save_reader": false, "training": {"accum_sync": "always", "batch_per_rank": 1, "compile": "none", "dtype": "float32", "eps": 0.001, "foreach": null, "grad_accum": 1, "lr": 0.1, "momentum": 0.0, "optimizer": "adam", "param_groups": 1, "same_input": false, "set_to_none": true, "skips": [], "steps": 1, "unfreeze": []}, "tree": {"root": {"buffer": false, "children": [{"bias": false, "frozen": false, "kind": "linear"}], "residual": false, "scale": false}, "width": 2}, "use_collectives": true, "writer": {"per_thread_copy_ahead": 10000000, "single_file_per_rank": true, "sync_files": true, "thread_count": 1}}, "property": "dcp", "schema": 1, "seed": 0, "world_size": 2}'.encode()).hexdigest()[:12]
    count = getattr(ctx, '_cases', 0)
    return os.path.join('/tmp/shardfuzz-dcp-1335', f'{digest}-{count}')

def _options():
    pass

def _values(fresh, skip):
    out = {}
    return out

def _arrange(body, values, ctx):
    order = range(len((DcpItem.MODEL,)))
    return {'model': values[(DcpItem.MODEL,)[i]] for i in order if (DcpItem.MODEL,)[i] in values}

def _writer(body, path, **options):
    import torch.distributed.checkpoint as dcp
    return dcp.FileSystemWriter(path, **options, **torch_kwargs(dcp.FileSystemWriter, WriterOptions().changed()))
_RECORDING_PLANNER = None

def _recording_planner_class():
    global _RECORDING_PLANNER
    if _RECORDING_PLANNER is None:
        from torch.distributed.checkpoint import DefaultSavePlanner

        class RecordingSavePlanner(DefaultSavePlanner):
            local_items: object = []

            def create_local_plan(self):
                plan = super().create_local_plan()
                return plan
        _RECORDING_PLANNER = RecordingSavePlanner
    return _RECORDING_PLANNER

def _save_planner(body):
    from torch.distributed.checkpoint import DefaultSavePlanner
    options = {k: v for k, v in (('flatten_sharded_tensors', True), ('dedup_save_to_lowest_rank', False), ('enable_plan_caching', True)) if v != (k == 'flatten_sharded_tensors')}
    cls = _recording_planner_class()
    planner = cls(**torch_kwargs(DefaultSavePlanner.__init__, options))
    return {'planner': planner}

def _writer_kwargs(body, path, overwrite=None):
    kwargs = {'storage_writer': _writer(body, path, overwrite=overwrite)}
    kwargs.update(_save_planner(body))
    return kwargs

def _save(body, state, path, overwrite=None):
    import torch.distributed.checkpoint as dcp
    kwargs = _writer_kwargs(body, path, overwrite)
    dcp.save(state, **kwargs)

def _earlier_checkpoint(body, case, ctx, path, get, put):
    t = Training(optimizer=Optimizer.ADAM, steps=1, batch_per_rank=1)
    decoy = build_side()
    values = _values(fresh=True, skip=())
    import torch.distributed.checkpoint as dcp
    dcp.save(_arrange(body, values, ctx), checkpoint_id=path)

def _save_over(body, state, path, ctx):
    dist.barrier()
    try:
        _save(body, state, path, overwrite=False)
    except BaseException as e:
        refusal = {'type': f'{type(e).__module__}.{type(e).__qualname__}', 'message': str(e)[:2000]}
    dist.barrier()
    if ctx.rank == 0:
        shutil.rmtree(path, ignore_errors=True)
    dist.barrier()
    _save(body, state, path, overwrite=False)

def run_dcp(case, body, ctx):
    return _run_dcp(case, body, ctx)

def _run_dcp(case, body, ctx):
    t = Training(optimizer=Optimizer.ADAM, steps=1, batch_per_rank=1)
    get_save = _options()
    get_load = _options()
    put = _options()
    path = '' or case_dir(ctx)
    if True and ctx.rank == 0:
        shutil.rmtree(path, ignore_errors=True)
    src = build_side()
    _earlier_checkpoint(body, case, ctx, path, get_save, put)
    values = _values(fresh=False, skip=())
    state = _arrange(body, values, ctx)
    obs_overwrite = _save_over(body, state, path, ctx)

def attempt(rank, world_size):
    import torch
    import torch.distributed as dist
    case = Case(property='dcp', world_size=2, seed=0, body=DcpBody(tree=ModuleTree(width=2, root=Block(children=(Leaf(kind=LeafKind.LINEAR, bias=False),))), source=Composition(), target=Composition(), entries=(DcpItem.MODEL,), training=Training(optimizer=Optimizer.ADAM, steps=1, batch_per_rank=1), storage_objects=True, overwrite=Overwrite.FALSE, save_planner=SavePlannerOptions(enable_plan_caching=True)))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    run_dcp(case, DcpBody(tree=ModuleTree(width=2, root=Block(children=(Leaf(kind=LeafKind.LINEAR, bias=False),))), source=Composition(), target=Composition(), entries=(DcpItem.MODEL,), training=Training(optimizer=Optimizer.ADAM, steps=1, batch_per_rank=1), storage_objects=True, overwrite=Overwrite.FALSE, save_planner=SavePlannerOptions(enable_plan_caching=True)), ctx)

if __name__ == "__main__":
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import torch.distributed as dist
    dist.init_process_group("gloo")
    attempt(dist.get_rank(), dist.get_world_size())
    print('PASS: no rank raised', flush=True)
    os._exit(0)  # a rank must not wait for the others at exit
