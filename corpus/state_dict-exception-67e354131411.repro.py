#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=3602c42a89141394 sources=5c3a8b0f263890d1 seconds=716.2
# Reproduces shardfuzz corpus entry state_dict-exception-67e354131411.json: exception:state_dict:builtins.KeyError@torch/distributed/checkpoint/state_dict.py:_get_model_state_dict
# Known torch bug: get_model_state_dict(ignore_frozen_params=True) raises KeyError for a frozen
# parameter of a module whose state-dict hooks hide a child (declared through its fqn modifiers
# method): it pops the parameter's named_parameters name ('0.fused.weight'), which the state dict,
# keyed '0.weight', lacks; upstream: none found.
# Observed: rank 0 raised builtins.KeyError: '0.1.0.fused.weight'
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: while the failure is there a rank raises
# builtins.KeyError in torch/distributed/checkpoint/state_dict.py:_get_model_state_dict, prints
# its traceback and REPRODUCED and exits 1; once it is gone rank 0 prints PASS and every rank
# exits 0 (expected: no rank raises); a rank exits 2 where the script cannot run (not under
# torchrun, another world size) or the case fails another way (it prints FAIL). torchrun's own
# status is 1 whenever a rank's is not 0.

from __future__ import annotations
import torch
from torch import nn
DEFAULT_FQN_MODIFIERS = '_fqn_modifiers'

class PointwiseConv1d(nn.Conv1d):
    pass
FUSED_CHILD = 'fused'

class FusedLeaf(nn.Module):

    def __init__(self, leaf, method=DEFAULT_FQN_MODIFIERS):
        super().__init__()
        self.add_module(FUSED_CHILD, leaf)
        self._atoms = [n for n, _ in leaf.named_parameters()]
        object.__setattr__(self, method, self.key_modifiers)
        self.register_state_dict_post_hook(FusedLeaf._hide)

    def key_modifiers(self):
        return {atom: FUSED_CHILD for atom in self._atoms}

    @staticmethod
    def _hide(module, state_dict, prefix, local_metadata):
        atom = next(iter(module.key_modifiers()))
        key = f'{prefix}{FUSED_CHILD}.{atom}'
        state_dict[f'{prefix}{atom}'] = state_dict.pop(key)

def attempt(rank, world_size):
    module = PointwiseConv1d(1, 1, kernel_size=1)
    module_ = PointwiseConv1d(1, 1, kernel_size=1, bias=False)
    module_.requires_grad_(False)
    build_model_out = nn.Sequential(nn.Sequential(module, nn.Sequential(module_)))
    owner = build_model_out.get_submodule('0.1')
    owner.add_module('0', FusedLeaf(owner.get_submodule('0'), DEFAULT_FQN_MODIFIERS))
    params = list(build_model_out.parameters())
    src_opt = torch.optim.AdamW(params)
    from torch.distributed.checkpoint.state_dict import get_state_dict, StateDictOptions
    options = StateDictOptions(ignore_frozen_params=True)
    msd, osd = get_state_dict(build_model_out, src_opt, options=options)

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
        if found in ['builtins.KeyError@torch/distributed/checkpoint/state_dict.py:_get_model_state_dict']:
            print(f"REPRODUCED exception:state_dict:builtins.KeyError@torch/distributed/checkpoint/state_dict.py:_get_model_state_dict: rank {rank} raised {found}", flush=True)
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
