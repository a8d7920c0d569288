#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=f79d1e3b59a0cdd2 sources=8dc1694f16ffdb1f seconds=411.0
# Reproduces shardfuzz corpus entry state_dict-exception-b39fcc19147a.json: exception:state_dict:builtins.KeyError@torch/distributed/_state_dict_utils.py:_unflatten_state_dict
# Known torch bug: set_optimizer_state_dict(full_state_dict=True,
# flatten_optimizer_state_dict=True) raises KeyError 'param_groups.0.params.0' for any model: the
# full-state branch takes the optimizer's local state dict with the flatten option still on, so
# the loaded and the local dicts have different keys; upstream: none found.
# Observed: rank 0 raised builtins.KeyError: 'param_groups.0.params.0'
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: while the failure is there a rank raises
# builtins.KeyError in torch/distributed/_state_dict_utils.py:_unflatten_state_dict, prints its
# traceback and REPRODUCED and exits 1; once it is gone rank 0 prints PASS and every rank exits 0
# (expected: no rank raises); a rank exits 2 where the script cannot run (not under torchrun,
# another world size) or the case fails another way (it prints FAIL). torchrun's own status is 1
# whenever a rank's is not 0.

from __future__ import annotations
import torch
from torch import nn

class TreeBlock(nn.Module):

    def __init__(self, children, scale):
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(4)) if scale else None

def attempt(rank, world_size):
    build_model_out = TreeBlock([TreeBlock([], True)], False)
    params = list(build_model_out.parameters())
    groups = [{'params': params[0::2]}]
    src_opt = torch.optim.Adam(groups)
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
    msd_ = get_model_state_dict(build_model_out)
    msd, osd = (msd_, get_optimizer_state_dict(build_model_out, src_opt))
    build_model_out_ = TreeBlock([TreeBlock([], True)], False)
    params_ = list(build_model_out_.parameters())
    groups_ = [{'params': params_[0::2]}]
    tgt_opt = torch.optim.Adam(groups_)
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict, StateDictOptions
    options_ = StateDictOptions(full_state_dict=True, flatten_optimizer_state_dict=True)
    set_optimizer_state_dict(build_model_out_, tgt_opt, osd, options=options_)

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
        if found in ['builtins.KeyError@torch/distributed/_state_dict_utils.py:_unflatten_state_dict', 'builtins.KeyError@torch/optim/optimizer.py:load_state_dict']:
            print(f"REPRODUCED exception:state_dict:builtins.KeyError@torch/distributed/_state_dict_utils.py:_unflatten_state_dict: rank {rank} raised {found}", flush=True)
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
