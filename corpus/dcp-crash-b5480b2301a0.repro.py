#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=4da2f48d2fa30bb5 sources=3ebb4d52c9cda72d seconds=9313.0
# Reproduces shardfuzz corpus entry dcp-crash-b5480b2301a0.json: crash:dcp:signal SIGSEGV@torch/distributed/fsdp/_state_dict_utils.py:param_hook
# Known torch bug: FSDP1 FULL_STATE_DICT with offload_to_cpu on CPU: state_dict() clones a freed
# buffer (SIGSEGV), optim_state_dict aliases the gathered states; upstream:
# https://github.com/pytorch/pytorch/issues/188989.
# Observed: rank 0 died (signal SIGSEGV)
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: while the failure is there a rank prints
# REPRODUCED and exits 1; once it is gone rank 0 prints PASS and every rank exits 0 (expected: no
# rank dies); a rank exits 2 where the script cannot run (not under torchrun, another world size)
# or the case fails another way (it prints FAIL). torchrun's own status is 1 whenever a rank's is
# not 0.

from __future__ import annotations
from dataclasses import dataclass
import torch
import enum
import os
from torch import nn
import inspect
import hashlib

@dataclass
class RankContext:
    rank: object
    world_size: object
    device: object

class DcpItem(str, enum.Enum):
    MODEL = 'model'
    OPTIMIZER = 'optimizer'

class TreeBlock(nn.Module):

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(1))

def case_dir(ctx):
    digest = hashlib.sha1('{"body": {"absent": false, "async_save": false, "async_saves": 0, "cache_staged": false, "checkpoint_dir": "", "convert": false, "deadlock": false, "drop": [], "empty_group": false, "entries": ["model", "optimizer"], "frozen_in_optimizer": false, "kind": "dcp", "load_cpu_offload": true, "load_full_state_dict": true, "load_planner": null, "mode": "round_trip", "module_stateful": false, "no_dist": false, "orders": [[0, 1], [0, 1]], "overwrite": "none", "own_group": false, "patched": true, "process_checkpointer": false, "requires_grad": [], "save_cpu_offload": false, "save_full_state_dict": false, "save_planner": null, "skip": [], "source": {"auto_wrap": false, "checkpoint_first": false, "checkpoint_options": {"context_fn": "none", "debug": false, "determinism_check": null, "early_stop": null, "preserve_rng_state": true}, "checkpoints": [], "find_unused": false, "knobs": {"abort_and_reset": false, "all_reduce_hook_scale": null, "backward_prefetch": 0, "custom_all_gather": false, "custom_reduce_scatter": false, "explicit_unshard": false, "force_sum_reduction": false, "forward_prefetch": 0, "gradient_divide_factor": null, "late_reshard_after_forward": null, "no_unshard_in_backward": false, "pg_allocator": false, "reduce_scatter_unused": false, "reshard_after_backward_last": false, "rs_max_buffers": 0, "separate_rs_group": false}, "mesh": [], "meta_init": false, "replicate_options": {"batched_grad_copy": false, "bucket_cap_mb": null, "bucket_cap_mb_list": [], "delay_all_reduce": false, "device_id": false, "dim": 0, "forward_sync_buffers": null, "gradient_as_bucket_view": false, "group": "default", "ignored_modules": [], "init_sync": true, "skip_all_reduce_unused_params": false, "static_graph": false}, "replicates": [], "shards": [{"group": [], "ignored": [], "mixed_precision": null, "offload": false, "path": "", "reshard_after_forward": false, "shard_dim": 0}], "tp": [], "tp_size": 1, "wrapper": "none"}, "stager": null, "steps_after": 1, "storage_objects": false, "target": {"auto_wrap": false, "checkpoint_first": true, "checkpoint_options": {"context_fn": "none", "debug": false, "determinism_check": null, "early_stop": null, "preserve_rng_state": true}, "checkpoints": [], "find_unused": false, "knobs": {"abort_and_reset": false, "all_reduce_hook_scale": null, "backward_prefetch": 0, "custom_all_gather": false, "custom_reduce_scatter": false, "explicit_unshard": false, "force_sum_reduction": false, "forward_prefetch": 0, "gradient_divide_factor": null, "late_reshard_after_forward": null, "no_unshard_in_backward": false, "pg_allocator": false, "reduce_scatter_unused": false, "reshard_after_backward_last": false, "rs_max_buffers": 0, "separate_rs_group": false}, "mesh": [], "meta_init": false, "replicate_options": {"batched_grad_copy": false, "bucket_cap_mb": null, "bucket_cap_mb_list": [], "delay_all_reduce": false, "device_id": false, "dim": 0, "forward_sync_buffers": null, "gradient_as_bucket_view": false, "group": "default", "ignored_modules": [], "init_sync": true, "skip_all_reduce_unused_params": false, "static_graph": false}, "replicates": [], "shards": [], "tp": [], "tp_size": 1, "wrapper": "fsdp1_full_shard"}, "target_meta_init": false, "torch_save_reader": false, "training": {"accum_sync": "always", "batch_per_rank": 1, "compile": "none", "dtype": "float32", "eps": 0.0001, "foreach": null, "grad_accum": 1, "lr": 0.01, "momentum": 0.0, "optimizer": "sgd", "param_groups": 1, "same_input": false, "set_to_none": false, "skips": [], "steps": 1, "unfreeze": []}, "tree": {"root": {"buffer": false, "children": [{"bias": true, "frozen": false, "kind": "relu"}], "residual": false, "scale": true}, "width": 1}, "use_collectives": true, "writer": {"per_thread_copy_ahead": 10000000, "single_file_per_rank": true, "sync_files": true, "thread_count": 1}}, "property": "dcp", "schema": 1, "seed": 0, "world_size": 2}'.encode()).hexdigest()[:12]
    return f'{digest}-{ctx}'

def _run_dcp(ctx):
    path = case_dir(ctx)
    build_model_out = TreeBlock()
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    build_model_out_ = TreeBlock()
    wrap_out_ = FSDP(build_model_out_, device_id=ctx.device, use_orig_params=True)
    from torch.distributed.checkpoint.state_dict import _patch_model_state_dict, StateDictOptions
    params = inspect.signature(StateDictOptions).parameters
    state_dict_options_out = StateDictOptions(full_state_dict=True, cpu_offload=True)
    _patch_model_state_dict(wrap_out_, options=state_dict_options_out)
    out_ = {}
    out_[DcpItem.MODEL] = wrap_out_
    order_ = ((0,), (0,))[ctx.rank]
    state = {(DcpItem.OPTIMIZER,)[i_].value: out_[(DcpItem.MODEL,)[i_]] for i_ in order_ if (DcpItem.MODEL,)[i_] in out_}
    import torch.distributed.checkpoint as dcp
    dcp.load(state, checkpoint_id=path)

def attempt(rank, world_size):
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'))
    _run_dcp(ctx)

def torch_frame(path: str, function: str) -> str | None:
    at = path.rfind('/torch/')
    inner = path[at + 1:]
    if at < 0 or '/fuzz/' in path or '-packages/' in inner or (function in ('<listcomp>', '<dictcomp>', '<setcomp>')):
        return None
    return f'{inner}:{function}'


def main():
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import re
    import subprocess
    import sys
    if os.environ.get("WORLD_SIZE") == "2" and not os.environ.get("REPRO_CHILD"):
        env = {**os.environ, "REPRO_CHILD": "1"}
        child = subprocess.run([sys.executable, __file__], env=env, stderr=subprocess.PIPE, text=True)
        sys.stderr.write(child.stderr)
        frames = [torch_frame(p, f) for p, f in re.findall(r'File "([^"]+)", line \d+,? in (\S+)', child.stderr)]
        found = f"signal {child.returncode}@{([f for f in frames if f] or ['?'])[0]}"
        if found in ['signal -11@torch/distributed/fsdp/_state_dict_utils.py:param_hook']:
            print(f"REPRODUCED crash:dcp:signal SIGSEGV@torch/distributed/fsdp/_state_dict_utils.py:param_hook: rank {os.environ['RANK']} died: {found}", flush=True)
            sys.exit(1)
        if child.returncode != 0:
            print(f"FAIL (not the entry's failure): rank {os.environ['RANK']}: {found}", flush=True)
            sys.exit(2)
        import torch.distributed as dist
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
        store.add("repro-passed", 1)
        until = time.monotonic() + 60
        while store.add("repro-passed", 0) < world_size:
            if time.monotonic() > until:
                print(f"FAIL (not the entry's failure): rank {rank} finished, another rank did not", flush=True)
                os._exit(2)
            time.sleep(0.05)
        if rank == 0:
            print('PASS: no rank died', flush=True)
        os._exit(0)  # a rank must not wait for the others at exit
    import faulthandler
    faulthandler.enable()
    import sys
    import time
    if os.environ.get("WORLD_SIZE") != "2":
        print("run it with: torchrun --nproc-per-node 2 " + sys.argv[0], file=sys.stderr)
        sys.exit(2)
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    attempt(rank, world_size)
    os._exit(0)


if __name__ == "__main__":
    main()
