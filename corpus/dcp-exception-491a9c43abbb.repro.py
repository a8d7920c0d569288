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
# torch/distributed/checkpoint/default_planner.py:_create_global_plan, prints its traceback and
# REPRODUCED and exits 1; once it is gone rank 0 prints PASS and every rank exits 0 (expected: no
# rank raises); a rank exits 2 where the script cannot run (not under torchrun, another world
# size) or the case fails another way (it prints FAIL). torchrun's own status is 1 whenever a
# rank's is not 0.

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
        if found in ['torch.distributed.checkpoint.api.CheckpointException@torch/distributed/checkpoint/default_planner.py:_create_global_plan']:
            print(f"REPRODUCED exception:dcp:torch.distributed.checkpoint.api.CheckpointException@torch/distributed/checkpoint/default_planner.py:_create_global_plan: rank {rank} raised {found}", flush=True)
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
