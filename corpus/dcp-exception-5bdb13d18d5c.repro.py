#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=93f443fd28251a3e sources=7d6f5cb23a31c8e4 seconds=1324.3
# Reproduces shardfuzz corpus entry dcp-exception-5bdb13d18d5c.json: exception:dcp:builtins.RuntimeError@torch/distributed/_state_dict_utils.py:tensor_func
# Known torch bug: FileSystemWriter(cache_staged_state_dict=True) pins its staging copy:
# async_save fails on a host without an accelerator; upstream: none found.
# Observed: rank 0 raised builtins.RuntimeError: Cannot access accelerator device when none is
# available.
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: while the failure is there a rank raises
# builtins.RuntimeError in torch/distributed/_state_dict_utils.py:tensor_func, prints its
# traceback and REPRODUCED and exits 1; once it is gone rank 0 prints PASS and every rank exits 0
# (expected: no rank raises); a rank exits 2 where the script cannot run (not under torchrun,
# another world size) or the case fails another way (it prints FAIL). torchrun's own status is 1
# whenever a rank's is not 0.

from __future__ import annotations
import torch
import enum
from dataclasses import dataclass
import os
from torch import nn
import hashlib

@dataclass
class RankContext:
    rank: object
    world_size: object
    device: object
    backend: object

class DcpItem(str, enum.Enum):
    OPTIMIZER = 'optimizer'

class PointwiseConv1d(nn.Conv1d):
    pass

def attempt(rank, world_size):
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    digest = hashlib.sha1('{"body": {"absent": false, "async_save": true, "async_saves": 2, "cache_staged": true, "checkpoint_dir": "", "convert": false, "deadlock": false, "drop": [], "empty_group": false, "entries": ["model", "optimizer"], "frozen_in_optimizer": false, "kind": "dcp", "load_cpu_offload": false, "load_full_state_dict": false, "load_planner": null, "mode": "round_trip", "module_stateful": false, "no_dist": false, "orders": [[0, 1], [0, 1]], "overwrite": "none", "own_group": false, "patched": false, "process_checkpointer": false, "requires_grad": [], "save_cpu_offload": false, "save_full_state_dict": false, "save_planner": null, "skip": [], "source": {"auto_wrap": false, "checkpoint_first": true, "checkpoint_options": {"context_fn": "none", "debug": false, "determinism_check": null, "early_stop": null, "preserve_rng_state": true}, "checkpoints": [], "find_unused": false, "knobs": {"abort_and_reset": false, "all_reduce_hook_scale": null, "backward_prefetch": 0, "explicit_unshard": false, "force_sum_reduction": false, "forward_prefetch": 0, "gradient_divide_factor": null, "late_reshard_after_forward": null, "pg_allocator": false, "reduce_scatter_unused": false, "reshard_after_backward_last": false, "rs_max_buffers": 0}, "mesh": [], "meta_init": false, "replicate_options": {"batched_grad_copy": false, "bucket_cap_mb": null, "bucket_cap_mb_list": [], "delay_all_reduce": false, "device_id": false, "dim": 0, "forward_sync_buffers": null, "gradient_as_bucket_view": false, "group": "default", "ignored_modules": [], "init_sync": true, "skip_all_reduce_unused_params": false, "static_graph": false}, "replicates": [], "shards": [], "tp": [], "tp_size": 1, "wrapper": "fsdp1_full_shard"}, "stager": null, "steps_after": 1, "storage_objects": true, "target": {"auto_wrap": false, "checkpoint_first": true, "checkpoint_options": {"context_fn": "none", "debug": false, "determinism_check": null, "early_stop": null, "preserve_rng_state": true}, "checkpoints": [], "find_unused": false, "knobs": {"abort_and_reset": false, "all_reduce_hook_scale": null, "backward_prefetch": 0, "explicit_unshard": false, "force_sum_reduction": false, "forward_prefetch": 0, "gradient_divide_factor": null, "late_reshard_after_forward": null, "pg_allocator": false, "reduce_scatter_unused": false, "reshard_after_backward_last": false, "rs_max_buffers": 0}, "mesh": [], "meta_init": false, "replicate_options": {"batched_grad_copy": false, "bucket_cap_mb": null, "bucket_cap_mb_list": [], "delay_all_reduce": false, "device_id": false, "dim": 0, "forward_sync_buffers": null, "gradient_as_bucket_view": false, "group": "default", "ignored_modules": [], "init_sync": true, "skip_all_reduce_unused_params": false, "static_graph": false}, "replicates": [], "shards": [], "tp": [], "tp_size": 1, "wrapper": "fsdp1_full_shard"}, "target_meta_init": false, "torch_save_reader": false, "training": {"accum_sync": "always", "batch_per_rank": 1, "compile": "none", "dtype": "float64", "eps": 0.0001, "foreach": null, "grad_accum": 1, "lr": 0.01, "momentum": 0.0, "optimizer": "adam", "param_groups": 1, "same_input": false, "set_to_none": false, "skips": [], "steps": 2, "unfreeze": []}, "tree": {"root": {"buffer": false, "children": [{"bias": false, "frozen": false, "kind": "conv1d"}], "residual": false, "scale": false}, "width": 1}, "use_collectives": true, "writer": {"per_thread_copy_ahead": 10000000, "single_file_per_rank": true, "sync_files": true, "thread_count": 1}}, "property": "dcp", "schema": 1, "seed": 0, "world_size": 2}'.encode()).hexdigest()[:12]
    count = getattr(ctx, '_cases', 0)
    path_ = os.path.join('/tmp/shardfuzz-dcp-1819', f'{digest}-{count}')
    module = PointwiseConv1d(1, 1, kernel_size=1)
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    kwargs = {'device_id': torch.device('cpu')}
    wrap_out = FSDP(module, **kwargs)
    import torch.distributed.checkpoint as dcp_
    writer = dcp_.FileSystemWriter(path_, cache_staged_state_dict=True)
    import torch.distributed.checkpoint as dcp
    out = {}
    out[DcpItem.OPTIMIZER] = wrap_out
    order = range(1)
    state = {(DcpItem.OPTIMIZER,)[i].value: out[DcpItem.OPTIMIZER] for i in order if (DcpItem.OPTIMIZER,)[i] in out}
    save_planner_out = {}
    kwargs__ = {'storage_writer': writer, **save_planner_out}
    result = dcp.async_save(state, **kwargs__)

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
        if found in ['builtins.RuntimeError@torch/distributed/_state_dict_utils.py:tensor_func']:
            print(f"REPRODUCED exception:dcp:builtins.RuntimeError@torch/distributed/_state_dict_utils.py:tensor_func: rank {rank} raised {found}", flush=True)
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
