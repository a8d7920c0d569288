#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=e7955ea402b7e752 sources=7d6f5cb23a31c8e4 seconds=3763.9
# Reproduces shardfuzz corpus entry dcp-exception-75d538f69398.json: exception:dcp:builtins.KeyError@torch/distributed/checkpoint/_state_dict_stager.py:deepcopy_with_tensor_offload
# Known torch bug: dcp.async_save(async_stager=DefaultStager(...)) reused for a second save:
# DefaultStager._stage closes its StateDictStager after every stage, which empties its copy
# dispatch table, and the next stage raises KeyError: <class 'type'> in
# deepcopy_with_tensor_offload; upstream: https://github.com/pytorch/pytorch/issues/183413.
# Observed: async_save with an explicit DefaultStager reused for a later save: DefaultStager
# closes its StateDictStager after each stage and the next one raises KeyError: <class 'type'> ...
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: while the failure is there a rank raises
# builtins.KeyError in
# torch/distributed/checkpoint/_state_dict_stager.py:deepcopy_with_tensor_offload, prints its
# traceback and REPRODUCED and exits 1; once it is gone rank 0 prints PASS and every rank exits 0
# (expected: no rank raises); a rank exits 2 where the script cannot run (not under torchrun,
# another world size) or the case fails another way (it prints FAIL). torchrun's own status is 1
# whenever a rank's is not 0.

from __future__ import annotations
from dataclasses import dataclass
import torch
import enum
import os
from torch import nn
from dataclasses import replace
import hashlib

@dataclass
class RankContext:
    rank: object
    world_size: object
    device: object

class Dtype(str, enum.Enum):
    FLOAT32 = 'float32'
    FLOAT64 = 'float64'
    BFLOAT16 = 'bfloat16'
    FLOAT16 = 'float16'

@dataclass(frozen=True)
class Composition:

    def steps(self):
        pass

@dataclass(frozen=True)
class Training:
    lr: object = 0.1
    momentum: object = 0.0
    steps: object = 2
    batch_per_rank: object = 2
    dtype: object = Dtype.FLOAT32

class DcpItem(str, enum.Enum):
    MODEL = 'model'
    OPTIMIZER = 'optimizer'
    APP = 'app'
    SCALARS = 'scalars'
    COUNTER = 'counter'
    EXTRA = 'extra'

class TreeBlock(nn.Module):

    def __init__(self, children):
        super().__init__()
        i, child = next(iter(enumerate(children)))
        self.add_module(str(i), child)
        self.skipped: frozenset[str] = frozenset()

    def forward(self, x):
        pass

@dataclass
class Composed:
    model: object

def case_dir(ctx):
    digest = hashlib.sha1('{"body": {"absent": false, "async_save": true, "async_saves": 3, "cache_staged": false, "checkpoint_dir": "", "convert": false, "deadlock": false, "drop": [], "empty_group": true, "entries": ["scalars", "app"], "frozen_in_optimizer": true, "kind": "dcp", "load_cpu_offload": false, "load_full_state_dict": true, "load_planner": {"allow_partial_load": true, "flatten_sharded_tensors": true}, "mode": "round_trip", "module_stateful": false, "no_dist": false, "orders": [], "overwrite": "none", "own_group": false, "patched": false, "process_checkpointer": false, "requires_grad": [{"path": "0", "step": 1, "trainable": true}], "save_cpu_offload": true, "save_full_state_dict": true, "save_planner": {"dedup_save_to_lowest_rank": true, "enable_plan_caching": false, "flatten_sharded_tensors": true}, "skip": [], "source": {"auto_wrap": false, "checkpoint_first": true, "checkpoint_options": {"context_fn": "none", "debug": false, "determinism_check": null, "early_stop": null, "preserve_rng_state": true}, "checkpoints": [], "find_unused": false, "knobs": {"abort_and_reset": false, "all_reduce_hook_scale": null, "backward_prefetch": 0, "explicit_unshard": false, "force_sum_reduction": false, "forward_prefetch": 0, "gradient_divide_factor": null, "late_reshard_after_forward": null, "pg_allocator": false, "reduce_scatter_unused": false, "reshard_after_backward_last": false, "rs_max_buffers": 0}, "mesh": [], "meta_init": false, "replicate_options": {"batched_grad_copy": false, "bucket_cap_mb": null, "bucket_cap_mb_list": [], "delay_all_reduce": false, "device_id": false, "dim": 0, "forward_sync_buffers": null, "gradient_as_bucket_view": false, "group": "default", "ignored_modules": [], "init_sync": true, "skip_all_reduce_unused_params": false, "static_graph": false}, "replicates": [], "shards": [], "tp": [], "tp_size": 1, "wrapper": "none"}, "stager": {"use_async_staging": false, "use_non_blocking_copy": false, "use_pinned_memory": false, "use_shared_memory": false}, "steps_after": 2, "storage_objects": false, "target": {"auto_wrap": false, "checkpoint_first": true, "checkpoint_options": {"context_fn": "none", "debug": false, "determinism_check": null, "early_stop": null, "preserve_rng_state": true}, "checkpoints": [], "find_unused": false, "knobs": {"abort_and_reset": false, "all_reduce_hook_scale": null, "backward_prefetch": 0, "explicit_unshard": false, "force_sum_reduction": false, "forward_prefetch": 0, "gradient_divide_factor": null, "late_reshard_after_forward": null, "pg_allocator": false, "reduce_scatter_unused": false, "reshard_after_backward_last": false, "rs_max_buffers": 0}, "mesh": [], "meta_init": false, "replicate_options": {"batched_grad_copy": false, "bucket_cap_mb": null, "bucket_cap_mb_list": [], "delay_all_reduce": false, "device_id": false, "dim": 0, "forward_sync_buffers": null, "gradient_as_bucket_view": false, "group": "default", "ignored_modules": [], "init_sync": true, "skip_all_reduce_unused_params": false, "static_graph": false}, "replicates": [], "shards": [], "tp": [], "tp_size": 1, "wrapper": "none"}, "target_meta_init": false, "torch_save_reader": false, "training": {"accum_sync": "always", "batch_per_rank": 1, "compile": "none", "dtype": "float64", "eps": 0.001, "foreach": null, "grad_accum": 1, "lr": 0.01, "momentum": 0.9, "optimizer": "sgd", "param_groups": 1, "same_input": false, "set_to_none": true, "skips": [], "steps": 3, "unfreeze": []}, "tree": {"root": {"buffer": true, "children": [{"bias": true, "frozen": true, "kind": "conv1d"}], "residual": false, "scale": true}, "width": 1}, "use_collectives": true, "writer": {"per_thread_copy_ahead": 10000000, "single_file_per_rank": true, "sync_files": true, "thread_count": 1}}, "property": "dcp", "schema": 1, "seed": 406121, "world_size": 2}'.encode()).hexdigest()[:12]
    count = getattr(ctx, '_cases', 0)
    return os.path.join('/tmp/shardfuzz-dcp-9721', f'{digest}-{count}')

def _run_dcp(ctx):
    t = Training(lr=0.01, momentum=0.9, steps=3, batch_per_rank=1, dtype=Dtype.FLOAT64)
    path = '' or case_dir(ctx)
    obs = {}
    training_ = replace(t, steps=5)
    gen = torch.Generator().manual_seed(406121)
    out = []
    _ = next(iter(range(5)))
    step_ = []
    _ = next(iter(range(1)))
    out.append(step_)
    comp = Composition()
    torch.manual_seed(406121)
    build_model_out = TreeBlock([None])
    model = build_model_out.to(torch.float64)
    composed = Composed(model)
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    stager = DefaultStager(StagingOptions(use_pinned_memory=False, use_shared_memory=False, use_async_staging=False, use_non_blocking_copy=False))
    import torch.distributed.checkpoint as dcp
    t__, n_ = (Training(lr=0.01, momentum=0.9, steps=3, batch_per_rank=1, dtype=Dtype.FLOAT64), 3)
    for k in range(n_):
        where = os.path.join(path, f'early-{k}')
        out_ = {}
        entry = next(iter((DcpItem.SCALARS, DcpItem.APP)))
        pass
        values = out_
        order = range(2)
        state = {(DcpItem.SCALARS, DcpItem.APP)[i].value: values[(DcpItem.SCALARS, DcpItem.APP)[i]] for i in order if (DcpItem.SCALARS, DcpItem.APP)[i] in values}
        kwargs_ = {'checkpoint_id': where}
        kwargs = kwargs_
        kwargs['process_group'] = None
        kwargs__ = {'async_stager': stager}
        async_kwargs_out = kwargs__
        result = dcp.async_save(state, **kwargs, **async_kwargs_out)
    pass
    obs.update(None)

def attempt(rank, world_size):
    import torch
    import torch.distributed as dist
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'))
    _run_dcp(ctx)

def torch_frame(path: str, function: str) -> str | None:
    at = path.rfind('/torch/')
    inner = path[at + 1:]
    if at < 0 or '/fuzz/' in path or '-packages/' in inner or (function in ('<listcomp>', '<dictcomp>', '<setcomp>')):
        return None
    return f'{inner}:{function}'


if __name__ == "__main__":
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import sys
    import time
    if os.environ.get("WORLD_SIZE") != "2":
        print("run it with: torchrun --nproc-per-node 2 " + sys.argv[0], file=sys.stderr)
        sys.exit(2)
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    import re
    import traceback
    try:
        attempt(rank, world_size)
    except BaseException as e:  # torch's CheckpointException is a BaseException
        text = traceback.format_exc()
        sys.stderr.write("".join(f"[rank{rank}]: {line}\n" for line in text.splitlines()))
        frames = [f for f in (torch_frame(p, f) for p, f in re.findall(r'File "([^"]+)", line \d+,? in (\S+)', text)) if f]
        found = f"{type(e).__module__}.{type(e).__qualname__}@{(frames or ['torch/?:?'])[-1]}"
        if found in ['builtins.KeyError@torch/distributed/checkpoint/_state_dict_stager.py:deepcopy_with_tensor_offload']:
            print(f"REPRODUCED exception:dcp:builtins.KeyError@torch/distributed/checkpoint/_state_dict_stager.py:deepcopy_with_tensor_offload: rank {rank} raised {found}", flush=True)
            os._exit(1)
        print(f"FAIL (not the entry's failure): rank {rank} raised {found}", flush=True)
        os._exit(2)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
    store.add("repro-passed", 1)
    until = time.monotonic() + 60
    while store.add("repro-passed", 0) < world_size:
        if time.monotonic() > until:
            print(f"FAIL (not the entry's failure): rank {rank} finished, another rank did not", flush=True)
            os._exit(2)
        time.sleep(0.05)
    if rank == 0:
        print('PASS: no rank raised', flush=True)
    os._exit(0)  # a rank must not wait for the others at exit
