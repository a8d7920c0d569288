#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=4b45c2168641062c sources=9d7be58e4208c9df seconds=707.6
# Reproduces shardfuzz corpus entry dcp-exception-c392ca0e3a90.json: exception:dcp:builtins.KeyError@torch/distributed/fsdp/_optim_utils.py:_unflatten_param_groups
# Known torch bug: FSDP1 NO_SHARD with an auto-wrapped unit of frozen parameters: state_dict()
# after training raises 'FSDP assumes ... is in the state_dict'; upstream:
# https://github.com/pytorch/pytorch/issues/85831.
# Observed: rank 0 raised builtins.KeyError: Parameter containing: tensor([[[-0.3736], ...]],
# dtype=torch.float64)
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: while the failure is there a rank raises
# builtins.KeyError in torch/distributed/fsdp/_optim_utils.py:_unflatten_param_groups, prints its
# traceback and REPRODUCED and exits 1; once it is gone rank 0 prints PASS and every rank exits 0
# (expected: no rank raises); a rank exits 2 where the script cannot run (not under torchrun,
# another world size) or the case fails another way (it prints FAIL). torchrun's own status is 1
# whenever a rank's is not 0.

from __future__ import annotations
import torch
from torch import nn
import torch.nn.functional as F

def attempt(rank, world_size):
    ctx_device = torch.device('cpu')
    x = torch.randn(world_size, 4, dtype=torch.float64)
    y = torch.randn(world_size, 4)
    step_ = [(x[0:1], y[0:1])]
    module = nn.LayerNorm(4)
    module.requires_grad_(False)
    build_model_out = nn.Sequential(module, nn.Sequential(nn.LayerNorm(4)))
    model = build_model_out.to(torch.float64)
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    strategy = ShardingStrategy.NO_SHARD
    kwargs = {'sharding_strategy': strategy, 'device_id': ctx_device, 'use_orig_params': True, 'auto_wrap_policy': ModuleWrapPolicy({nn.Sequential})}
    wrap_out = FSDP(model, **kwargs)
    params = list(wrap_out.parameters())
    groups = [{'params': params[1::2]}]
    src_opt = torch.optim.SGD(groups)
    data_ = [step_[0]][:1]
    x_, y_ = next(iter(data_))
    loss = F.mse_loss(wrap_out(x_).to(y_.dtype), y_)
    loss.backward()
    osd = FSDP.optim_state_dict(wrap_out, src_opt)

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
        if found in ['builtins.KeyError@torch/distributed/fsdp/_optim_utils.py:_unflatten_param_groups']:
            print(f"REPRODUCED exception:dcp:builtins.KeyError@torch/distributed/fsdp/_optim_utils.py:_unflatten_param_groups: rank {rank} raised {found}", flush=True)
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
