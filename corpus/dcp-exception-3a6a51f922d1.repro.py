#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=24cba4b5d3ca2075 sources=4cc18416ea30ea14 seconds=810.5
# Reproduces shardfuzz corpus entry dcp-exception-3a6a51f922d1.json: exception:dcp:builtins.ValueError@torch/distributed/fsdp/_optim_utils.py:_flatten_optim_state_dict
# Known torch bug: the classic FSDP1 DCP recipe with an optimizer without state:
# optim_state_dict_to_load refuses the dict without 'state'; upstream: none found.
# Observed: rank 0 raised builtins.ValueError: `optim_state_dict` must have the keys "state"to be
# a valid optimizer state dict
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: while the failure is there a rank raises
# builtins.ValueError in torch/distributed/fsdp/_optim_utils.py:_flatten_optim_state_dict and
# torchrun exits 1; else every rank prints PASS and it exits 0.

from __future__ import annotations
import torch
import enum
import os
from torch import nn
from dataclasses import dataclass
import hashlib

@dataclass
class RankContext:
    rank: object
    world_size: object
    device: object
    backend: object

class DcpItem(str, enum.Enum):
    OPTIMIZER = 'optimizer'

class TreeBlock(nn.Module):

    def __init__(self, children, scale):
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(4)) if scale else None

def attempt(rank, world_size):
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    digest = hashlib.sha1('{"body": {"absent": false, "async_save": false, "async_saves": 0, "cache_staged": false, "checkpoint_dir": "", "convert": false, "deadlock": false, "drop": [], "empty_group": false, "entries": ["model", "optimizer"], "frozen_in_optimizer": false, "kind": "dcp", "load_cpu_offload": false, "load_full_state_dict": false, "load_planner": null, "mode": "round_trip", "module_stateful": false, "no_dist": false, "orders": [], "overwrite": "none", "own_group": false, "patched": false, "process_checkpointer": false, "requires_grad": [], "save_cpu_offload": false, "save_full_state_dict": false, "save_planner": null, "skip": [], "source": {"auto_wrap": false, "checkpoint_first": true, "checkpoint_options": {"context_fn": "none", "debug": false, "determinism_check": null, "early_stop": null, "preserve_rng_state": true}, "checkpoints": [], "find_unused": false, "knobs": {"abort_and_reset": false, "all_reduce_hook_scale": null, "backward_prefetch": 0, "custom_all_gather": false, "custom_reduce_scatter": false, "explicit_unshard": false, "force_sum_reduction": false, "forward_prefetch": 0, "gradient_divide_factor": null, "late_reshard_after_forward": null, "no_unshard_in_backward": false, "pg_allocator": false, "reduce_scatter_unused": false, "reshard_after_backward_last": false, "rs_max_buffers": 0, "separate_rs_group": false}, "mesh": [], "meta_init": false, "replicate_options": {"batched_grad_copy": false, "bucket_cap_mb": null, "bucket_cap_mb_list": [], "delay_all_reduce": false, "device_id": false, "dim": 0, "forward_sync_buffers": null, "gradient_as_bucket_view": false, "group": "default", "ignored_modules": [], "init_sync": true, "skip_all_reduce_unused_params": false, "static_graph": false}, "replicates": [], "shards": [], "spmd": false, "tp": [], "tp_size": 1, "wrapper": "fsdp1_full_shard"}, "stager": null, "steps_after": 1, "storage_objects": false, "target": {"auto_wrap": false, "checkpoint_first": true, "checkpoint_options": {"context_fn": "none", "debug": false, "determinism_check": null, "early_stop": null, "preserve_rng_state": true}, "checkpoints": [], "find_unused": false, "knobs": {"abort_and_reset": false, "all_reduce_hook_scale": null, "backward_prefetch": 0, "custom_all_gather": false, "custom_reduce_scatter": false, "explicit_unshard": false, "force_sum_reduction": false, "forward_prefetch": 0, "gradient_divide_factor": null, "late_reshard_after_forward": null, "no_unshard_in_backward": false, "pg_allocator": false, "reduce_scatter_unused": false, "reshard_after_backward_last": false, "rs_max_buffers": 0, "separate_rs_group": false}, "mesh": [], "meta_init": false, "replicate_options": {"batched_grad_copy": false, "bucket_cap_mb": null, "bucket_cap_mb_list": [], "delay_all_reduce": false, "device_id": false, "dim": 0, "forward_sync_buffers": null, "gradient_as_bucket_view": false, "group": "default", "ignored_modules": [], "init_sync": true, "skip_all_reduce_unused_params": false, "static_graph": false}, "replicates": [], "shards": [], "spmd": false, "tp": [], "tp_size": 1, "wrapper": "fsdp1_full_shard"}, "target_meta_init": false, "torch_save_reader": false, "training": {"accum_sync": "always", "batch_per_rank": 2, "compile": "none", "dtype": "float32", "eps": 0.001, "foreach": null, "grad_accum": 1, "lr": 0.1, "momentum": 0.0, "optimizer": "sgd", "param_groups": 1, "same_input": false, "set_to_none": true, "skips": [], "steps": 1, "unfreeze": []}, "tree": {"root": {"buffer": true, "children": [{"bias": true, "frozen": false, "kind": "linear"}, {"buffer": false, "children": [{"bias": true, "frozen": false, "kind": "linear"}, {"bias": true, "frozen": false, "kind": "tanh"}, {"bias": true, "frozen": false, "kind": "layer_norm"}], "residual": false, "scale": true}, {"bias": false, "frozen": false, "kind": "linear"}], "residual": false, "scale": false}, "width": 4}, "use_collectives": true, "writer": {"per_thread_copy_ahead": 10000000, "single_file_per_rank": true, "sync_files": true, "thread_count": 1}}, "property": "dcp", "schema": 1, "seed": 33, "world_size": 2}'.encode()).hexdigest()[:12]
    count = getattr(ctx, '_cases', 0)
    path = os.path.join('/tmp/shardfuzz-dcp-5990', f'{digest}-{count}')
    build_model_out = TreeBlock([TreeBlock([], True)], False)
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP__
    wrap_out = FSDP__(build_model_out, device_id=torch.device('cpu'))
    params = list(wrap_out.parameters())
    src_opt = torch.optim.SGD(params)
    out = {}
    osd_ = FSDP__.optim_state_dict(wrap_out, src_opt)
    out[DcpItem.OPTIMIZER] = osd_
    order = range(1)
    state = {(DcpItem.OPTIMIZER,)[i].value: out[DcpItem.OPTIMIZER] for i in order if (DcpItem.OPTIMIZER,)[i] in out}
    import torch.distributed.checkpoint as dcp
    dcp.save(state, checkpoint_id=path)
    build_model_out_ = TreeBlock([TreeBlock([], True)], False)
    wrap_out_ = FSDP__(build_model_out_, device_id=torch.device('cpu'))
    params_ = list(wrap_out_.parameters())
    tgt_opt = torch.optim.SGD(params_)
    from torch.distributed.checkpoint.optimizer import load_sharded_optimizer_state_dict
    loaded = load_sharded_optimizer_state_dict(model_state_dict=wrap_out_.state_dict(), optimizer_key='optimizer', storage_reader=dcp.FileSystemReader(path))
    osd = loaded['optimizer']
    tgt_opt.load_state_dict(FSDP__.optim_state_dict_to_load(wrap_out_, tgt_opt, osd))

if __name__ == "__main__":
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import torch.distributed as dist
    dist.init_process_group("gloo")
    attempt(dist.get_rank(), dist.get_world_size())
    print('PASS: no rank raised', flush=True)
    os._exit(0)  # a rank must not wait for the others at exit
