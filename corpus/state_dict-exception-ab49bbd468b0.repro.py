#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=8a961ec26fda3260 sources=1ee5b339ab4179e7 seconds=480.0
# Reproduces shardfuzz corpus entry state_dict-exception-ab49bbd468b0.json: exception:state_dict:builtins.AssertionError@torch/distributed/fsdp/_state_dict_utils.py:_common_unshard_post_state_dict_hook
# Known torch bug: FSDP1 NO_SHARD with an auto-wrapped unit of frozen parameters: state_dict()
# after training raises 'FSDP assumes ... is in the state_dict'; upstream:
# https://github.com/pytorch/pytorch/issues/85831.
# Observed: rank 0 raised builtins.AssertionError: FSDP assumes 0.weight is in the state_dict but
# the state_dict only has odict_keys(['1.0.weight', '1.0.bias']). prefix=, module_name=0., ...
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: while the failure is there a rank raises
# builtins.AssertionError in
# torch/distributed/fsdp/_state_dict_utils.py:_common_unshard_post_state_dict_hook, prints its
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
    lo = rank * 2
    x = torch.randn(4, 2)
    y = torch.randn(4, 2)
    step_ = [(x[lo:lo + 2], y[lo:lo + 2])]
    module = nn.Linear(2, 2)
    module.requires_grad_(False)
    build_model_out = nn.Sequential(module, nn.Sequential(nn.Linear(2, 2)))
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    strategy = ShardingStrategy.NO_SHARD
    wrap_out = FSDP(build_model_out, sharding_strategy=strategy, device_id=ctx_device, use_orig_params=True, auto_wrap_policy=ModuleWrapPolicy({nn.Sequential}))
    data_ = [step_[0]][:2]
    x_, y_ = next(iter(data_))
    loss = F.mse_loss(wrap_out(x_), y_)
    loss.backward()
    msd, osd = (wrap_out.state_dict(), None)

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
        if found in ['builtins.AssertionError@torch/distributed/fsdp/_state_dict_utils.py:_common_unshard_post_state_dict_hook']:
            print(f"REPRODUCED exception:state_dict:builtins.AssertionError@torch/distributed/fsdp/_state_dict_utils.py:_common_unshard_post_state_dict_hook: rank {rank} raised {found}", flush=True)
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
