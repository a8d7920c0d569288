#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=891107a19cd069f6 sources=9d7be58e4208c9df seconds=77.4
# Reproduces shardfuzz corpus entry dcp-exception-e248d03a903f.json: exception:dcp:builtins.AssertionError@torch/distributed/checkpoint/state_dict.py:_load_optim_state_dict
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
    model = module.to(torch.float32)
    params = list(model.parameters())
    tgt_opt = torch.optim.SGD(params)
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
    out_optimizer = get_optimizer_state_dict(model, tgt_opt)
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict, StateDictOptions
    options = StateDictOptions(full_state_dict=True)
    set_optimizer_state_dict(model, tgt_opt, out_optimizer, options=options)

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
            print(f"REPRODUCED exception:dcp:builtins.AssertionError@torch/distributed/checkpoint/state_dict.py:_load_optim_state_dict: rank {rank} raised {found}", flush=True)
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
