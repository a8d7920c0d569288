#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=c572371c336f35cd sources=5c3a8b0f263890d1 seconds=703.0
# Reproduces shardfuzz corpus entry state_dict-exception-d4322b68deab.json: exception:state_dict:builtins.AttributeError@torch/nn/modules/module.py:__getattr__
# Known torch bug: get_model_state_dict / get_state_dict ignore
# StateDictOptions(dsd_fqn_modifiers=...): they map the model's state-dict keys to FQNs through a
# method of the default name (_fqn_modifiers), so for a module whose state-dict hooks hide a child
# and whose method has the name the option gives, _get_fqns raises AttributeError ('<module>
# object has no attribute <key atom>'). Only set_model_state_dict reads the option. Any model,
# sharded or not; upstream: none found.
# Observed: rank 0 raised builtins.AttributeError: 'FusedLeaf' object has no attribute 'weight'
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: while the failure is there a rank raises
# builtins.AttributeError in torch/nn/modules/module.py:__getattr__, prints its traceback and
# REPRODUCED and exits 1; once it is gone rank 0 prints PASS and every rank exits 0 (expected: no
# rank raises); a rank exits 2 where the script cannot run (not under torchrun, another world
# size) or the case fails another way (it prints FAIL). torchrun's own status is 1 whenever a
# rank's is not 0.

from __future__ import annotations
from torch import nn

class PointwiseConv1d(nn.Conv1d):
    pass
FUSED_CHILD = 'fused'

class FusedLeaf(nn.Module):

    def __init__(self, leaf):
        super().__init__()
        self.add_module(FUSED_CHILD, leaf)
        self._atoms = [n for n, _ in leaf.named_parameters()]
        object.__setattr__(self, 'hidden_children', self.key_modifiers)
        self.register_state_dict_post_hook(FusedLeaf._hide)

    def key_modifiers(self):
        return {atom: FUSED_CHILD for atom in self._atoms}

    @staticmethod
    def _hide(module, state_dict, prefix, local_metadata):
        atom = next(iter(module.key_modifiers()))
        state_dict[f'{prefix}{atom}'] = state_dict

def attempt(rank, world_size):
    build_model_out = nn.Sequential(PointwiseConv1d(1, 1, kernel_size=1))
    build_model_out.add_module('0', FusedLeaf(build_model_out.get_submodule('0')))
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, StateDictOptions
    options = StateDictOptions(dsd_fqn_modifiers='hidden_children')
    msd_ = get_model_state_dict(build_model_out, options=options)

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
        if found in ['builtins.AttributeError@torch/nn/modules/module.py:__getattr__']:
            print(f"REPRODUCED exception:state_dict:builtins.AttributeError@torch/nn/modules/module.py:__getattr__: rank {rank} raised {found}", flush=True)
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
