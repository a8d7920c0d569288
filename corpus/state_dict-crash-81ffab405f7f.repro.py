#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=627b92f9c75a2fc3 sources=14c7281674c70e1f seconds=5603.2
# Reproduces shardfuzz corpus entry state_dict-crash-81ffab405f7f.json: crash:state_dict:signal SIGSEGV@torch/distributed/fsdp/_state_dict_utils.py:param_hook
# Known torch bug: FSDP1 FULL_STATE_DICT with offload_to_cpu on CPU: state_dict() clones a freed
# buffer (SIGSEGV), optim_state_dict aliases the gathered states; upstream:
# https://github.com/pytorch/pytorch/issues/188989.
# Observed: rank 0 died (signal SIGSEGV)
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: while the failure is there a rank prints
# REPRODUCED and exits 1; once it is gone rank 0 prints PASS and every rank exits 0 (expected: no
# rank dies); a rank exits 2 where the script cannot run (not under torchrun, another world size)
# or the case fails another way (it prints FAIL). torchrun's own status is 1 whenever a rank's is
# not 0.

from __future__ import annotations
from dataclasses import dataclass
import torch
import os
from torch import nn
import copy
import torch.distributed as dist

@dataclass
class RankContext:
    rank: object
    device: object

def is_plain():
    pass

class PointwiseConv1d(nn.Conv1d):

    def forward(self, x):
        pass

def build_model(device):
    with torch.device(device):
        module = PointwiseConv1d(1, 1, kernel_size=1, bias=False)
        module.requires_grad_(False)
        return nn.Sequential(PointwiseConv1d(1, 1, kernel_size=1, bias=False), module)

@dataclass
class Composed:
    model: object

def compose(model, ctx):
    names = [n for n, _ in model.named_parameters()]
    return Composed(model=_wrap(model, ctx))

def _wrap(model, ctx):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    strategy = ShardingStrategy.FULL_SHARD
    return FSDP(model, sharding_strategy=strategy, device_id=ctx.device, use_orig_params=True)

def make_optimizer(params, later=()):
    held = {id(p) for p in later}
    params = [p for p in params if p.requires_grad or id(p) in held]
    groups = params
    return torch.optim.SGD(groups, lr=0.01, momentum=0.0, foreach=None)

@dataclass
class Side:
    composed: object
    opt: object = None
    schedule: object = ()

    @property
    def model(self):
        return self.composed.model

    def names(self):
        pass

def build_side(ctx, *, schedule=()):
    torch.manual_seed(0)
    device = ctx.device
    model = build_model(device).to(torch.float32)
    composed = Composed(model) if is_plain() else compose(model, ctx)
    return Side(composed=composed, schedule=schedule)

def requires_grad():
    pass

def add_optimizer(side):
    params = list(side.model.parameters())
    frozen = []
    side.opt = make_optimizer(params, later=frozen)
    return side.opt

def body_optimizer(side):
    return add_optimizer(side)

def train_steps():
    pass

def dropped_keys():
    pass

def fsdp1_state_dict_type(side):
    from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig, StateDictType, FullyShardedDataParallel as FSDP
    FSDP.set_state_dict_type(side.model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(offload_to_cpu=True, rank0_only=False), FullOptimStateDictConfig(offload_to_cpu=True, rank0_only=False))

def fsdp1_optim_state_dict():
    pass

def _take(side):
    assert side.opt is not None
    fsdp1_state_dict_type(side)
    return (side.model.state_dict(), fsdp1_optim_state_dict())

def _put():
    pass

def run_state_dict(ctx):
    src = build_side(ctx, schedule=())
    body_optimizer(src)
    msd, osd = _take(src)
    ignored = []
    msd, osd = copy.deepcopy((msd, osd))
    dropped = sorted(set(dropped_keys()) | set(ignored))
    before = requires_grad()
    result, after = _put()
    obs = {'losses_before': train_steps(), 'dropped': dropped, 'requires_grad': {'before': before, 'after': after}}
    return obs

def attempt(rank, world_size):
    import torch
    ctx = RankContext(rank=rank, device=torch.device('cpu'))
    run_state_dict(ctx)

def torch_frame(path: str, function: str) -> str | None:
    at = path.rfind('/torch/')
    inner = path[at + 1:]
    if at < 0 or '/fuzz/' in path or '-packages/' in inner or (function in ('<listcomp>', '<dictcomp>', '<setcomp>')):
        return None
    return f'{inner}:{function}'


def main():
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import re
    import subprocess
    import sys
    if os.environ.get("WORLD_SIZE") == "2" and not os.environ.get("REPRO_CHILD"):
        env = {**os.environ, "REPRO_CHILD": "1"}
        child = subprocess.run([sys.executable, __file__], env=env, stderr=subprocess.PIPE, text=True)
        sys.stderr.write(child.stderr)
        frames = [torch_frame(p, f) for p, f in re.findall(r'File "([^"]+)", line \d+,? in (\S+)', child.stderr)]
        found = f"signal {child.returncode}@{([f for f in frames if f] or ['?'])[0]}"
        if found in ['signal -11@torch/distributed/fsdp/_state_dict_utils.py:param_hook']:
            print(f"REPRODUCED crash:state_dict:signal SIGSEGV@torch/distributed/fsdp/_state_dict_utils.py:param_hook: rank {os.environ['RANK']} died: {found}", flush=True)
            sys.exit(1)
        if child.returncode != 0:
            print(f"FAIL (not the entry's failure): rank {os.environ['RANK']}: {found}", flush=True)
            sys.exit(2)
        import torch.distributed as dist
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
        store.add("repro-passed", 1)
        until = time.monotonic() + 60
        while store.add("repro-passed", 0) < world_size:
            if time.monotonic() > until:
                print(f"FAIL (not the entry's failure): rank {rank} finished, another rank did not", flush=True)
                os._exit(2)
            time.sleep(0.05)
        if rank == 0:
            print('PASS: no rank died', flush=True)
        os._exit(0)  # a rank must not wait for the others at exit
    import faulthandler
    faulthandler.enable()
    import sys
    import time
    if os.environ.get("WORLD_SIZE") != "2":
        print("run it with: torchrun --nproc-per-node 2 " + sys.argv[0], file=sys.stderr)
        sys.exit(2)
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    attempt(rank, world_size)
    os._exit(0)


if __name__ == "__main__":
    main()
