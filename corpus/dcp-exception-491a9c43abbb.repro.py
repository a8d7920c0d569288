#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=46830f01210eaf42 sources=7d6f5cb23a31c8e4 seconds=2561.4
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
import os
import torch.distributed as dist
import inspect
import shutil

def torch_kwargs(fn, kwargs):
    params = inspect.signature(fn).parameters
    return kwargs

def case_dir(ctx):
    return os.path.join('/tmp/shardfuzz-dcp-1335', '2444a900e00c-0')

def _recording_planner_class():
    from torch.distributed.checkpoint import DefaultSavePlanner

    class RecordingSavePlanner(DefaultSavePlanner):
        pass
    _RECORDING_PLANNER = RecordingSavePlanner
    return _RECORDING_PLANNER

def _save(state, path):
    import torch.distributed.checkpoint as dcp
    writer_out = dcp.FileSystemWriter(path, overwrite=False, **torch_kwargs(dcp.FileSystemWriter, {}))
    kwargs_ = {'storage_writer': writer_out}
    from torch.distributed.checkpoint import DefaultSavePlanner
    options_ = {'enable_plan_caching': True}
    cls = _recording_planner_class()
    planner = cls(**torch_kwargs(DefaultSavePlanner.__init__, options_))
    save_planner_out = {'planner': planner}
    kwargs_.update(save_planner_out)
    dcp.save(state, **kwargs_)

def _run_dcp(ctx):
    path = case_dir(ctx)
    import torch.distributed.checkpoint as dcp
    dcp.save({}, checkpoint_id=path)
    state = {}
    try:
        _save(state, path)
    except BaseException as e:
        pass
    shutil.rmtree(path, ignore_errors=True)
    _save(state, path)

def attempt(rank, world_size):
    _run_dcp(rank)

if __name__ == "__main__":
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import torch.distributed as dist
    dist.init_process_group("gloo")
    attempt(dist.get_rank(), dist.get_world_size())
    print('PASS: no rank raised', flush=True)
    os._exit(0)  # a rank must not wait for the others at exit
