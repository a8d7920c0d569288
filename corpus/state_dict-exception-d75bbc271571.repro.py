#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=af1b565e41fad220 sources=2836a7ca10136e42 seconds=433.1
# Reproduces shardfuzz corpus entry state_dict-exception-d75bbc271571.json: exception:state_dict:builtins.AssertionError@torch/distributed/checkpoint/state_dict.py:_load_optim_state_dict
# Known torch bug: set_optimizer_state_dict(full_state_dict=True) for an optimizer without tensor
# state: 'Expected device to be set'; upstream: https://github.com/pytorch/pytorch/issues/133415.
# Observed: rank 0 raised builtins.AssertionError: Expected device to be set
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: while the failure is there a rank raises
# builtins.AssertionError in torch/distributed/checkpoint/state_dict.py:_load_optim_state_dict,
# prints its traceback and REPRODUCED and exits 1; once it is gone rank 0 prints PASS and every
# rank exits 0 (expected: no rank raises); a rank exits 2 where the script cannot run (not under
# torchrun, another world size) or the case fails another way (it prints FAIL). torchrun's own
# status is 1 whenever a rank's is not 0.

from __future__ import annotations
import torch
from torch import nn

def attempt(rank, world_size):
    module = nn.Linear(2, 2)
    params = list(module.parameters())
    src_opt = torch.optim.SGD(params)
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
    msd_ = get_model_state_dict(module)
    msd, osd = (msd_, get_optimizer_state_dict(module, src_opt))
    module_ = nn.Linear(2, 2)
    params_ = list(module_.parameters())
    tgt_opt = torch.optim.SGD(params_)
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict, StateDictOptions
    options_ = StateDictOptions(full_state_dict=True)
    set_optimizer_state_dict(module_, tgt_opt, osd, options=options_)

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
        if found in ['builtins.AssertionError@torch/distributed/checkpoint/state_dict.py:_load_optim_state_dict']:
            print(f"REPRODUCED exception:state_dict:builtins.AssertionError@torch/distributed/checkpoint/state_dict.py:_load_optim_state_dict: rank {rank} raised {found}", flush=True)
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
