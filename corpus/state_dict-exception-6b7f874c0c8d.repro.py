#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=a7670fbac300d246 sources=2836a7ca10136e42 seconds=209.5
# Reproduces shardfuzz corpus entry state_dict-exception-6b7f874c0c8d.json: exception:state_dict:builtins.ValueError@torch/distributed/distributed_c10d.py:get_group_rank
# Known torch bug: set_optimizer_state_dict(full, cpu_offload) into FSDP1 HYBRID_SHARD with a
# shard dimension of 1 broadcasts from global rank 0 in a one-rank group; upstream:
# https://github.com/pytorch/pytorch/issues/155680.
# Observed: rank 1 raised builtins.ValueError: Global rank 0 is not part of group
# <torch.distributed.distributed_c10d.ProcessGroup object at 0x7f56a40e0bf0>
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: while the failure is there a rank prints
# REPRODUCED and exits 1; once it is gone rank 0 prints PASS and every rank exits 0 (expected: no
# rank raises); a rank exits 2 where the script cannot run (not under torchrun, another world
# size) or the case fails another way (it prints FAIL). torchrun's own status is 1 whenever a
# rank's is not 0.

from __future__ import annotations
import torch
from torch import nn

class PointwiseConv1d(nn.Conv1d):
    pass

def attempt(rank, world_size):
    ctx_device = torch.device('cpu')
    ctx__meshes = {}
    import re
    import traceback
    try:
        module = PointwiseConv1d(1, 1, kernel_size=1)
        model = module.to(torch.float32)
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
        strategy = ShardingStrategy.HYBRID_SHARD
        kwargs = {'sharding_strategy': strategy, 'device_id': torch.device('cpu')}
        shape = (2, 1)
        from torch.distributed.device_mesh import init_device_mesh
        key = ()
        ctx__meshes[key] = init_device_mesh(ctx_device.type, shape)
        kwargs['device_mesh'] = ctx__meshes[key]
        wrap_out = FSDP(model, **kwargs)
        params = list(wrap_out.parameters())
        src_opt = torch.optim.SGD(params)
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
        msd_ = get_model_state_dict(wrap_out)
        msd, osd = (msd_, get_optimizer_state_dict(wrap_out, src_opt))
    except BaseException as e:
        frames = [f for f in (torch_frame(p, f) for p, f in re.findall('File "([^"]+)", line \\d+,? in (\\S+)', traceback.format_exc())) if f]
        found = f"{type(e).__module__}.{type(e).__qualname__}@{(frames or ['torch/?:?'])[-1]}"
        if found in ['builtins.ValueError@torch/distributed/distributed_c10d.py:get_group_rank']:
            return f'REPRODUCED exception:state_dict:builtins.ValueError@torch/distributed/distributed_c10d.py:get_group_rank: rank {rank} raised {found}: {e}'
        return f"FAIL (not the entry's failure): rank {rank} raised {found}: {e}"
    return 'PASS: no rank raised'

def torch_frame(path: str, function: str) -> str | None:
    at = path.rfind('/torch/')
    inner = path[at + 1:]
    if at < 0 or '/fuzz/' in path or '-packages/' in inner or (function in ('<listcomp>', '<dictcomp>', '<setcomp>')):
        return None
    return f'{inner}:{function}'

def main():
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
    verdict = attempt(rank, world_size)
    if verdict and verdict not in ['PASS or another failure: None', 'PASS: every loss, gradient and parameter agrees', 'PASS: every rank finished', 'PASS: no rank died', 'PASS: no rank raised']:
        sys.stdout.write(verdict + "\n")  # one write: the ranks share torchrun's output
        sys.stdout.flush()
        os._exit(1 if verdict.startswith("REPRODUCED") else 2)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
    store.add("repro-passed", 1)
    until = time.monotonic() + 60
    while store.add("repro-passed", 0) < world_size:
        if time.monotonic() > until:
            print(f"FAIL (not the entry's failure): rank {rank} finished, another rank did not", flush=True)
            os._exit(2)
        time.sleep(0.05)
    if rank == 0:
        print(verdict or 'PASS: no rank raised', flush=True)
    os._exit(0)  # a rank must not wait for the others at exit


if __name__ == "__main__":
    main()
