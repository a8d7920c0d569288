#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=bc8ec400c405abdb sources=9d7be58e4208c9df seconds=387.7
# Reproduces shardfuzz corpus entry dcp-exception-d6daf354182c.json: exception:dcp:builtins.RuntimeError@torch/distributed/_shard/sharded_tensor/api.py:dispatch
# Known torch bug: dcp.async_save's default stager calls data_ptr() on ShardedTensors; upstream:
# none found.
# Observed: rank 0 raised builtins.RuntimeError: torch function 'data_ptr', with args:
# (ShardedTensor(ShardedTensorMetadata(shards_metadata=[ShardMetadata(shard_offsets=[0, 0], ...
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: while the failure is there a rank prints
# REPRODUCED and exits 1; once it is gone rank 0 prints PASS and every rank exits 0 (expected: no
# rank raises); a rank exits 2 where the script cannot run (not under torchrun, another world
# size) or the case fails another way (it prints FAIL). torchrun's own status is 1 whenever a
# rank's is not 0.

from __future__ import annotations
import torch
import enum
from torch import nn

class DcpItem(str, enum.Enum):
    MODEL = 'model'

class TreeBlock(nn.Module):

    def __init__(self, children, scale):
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(4)) if scale else None

def attempt(rank, world_size):
    ctx_device = torch.device('cpu')
    import re
    import traceback
    try:
        build_model_out = TreeBlock([TreeBlock([], True)], False)
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        wrap_out = FSDP(build_model_out, device_id=ctx_device)
        from torch.distributed.fsdp import ShardedOptimStateDictConfig, ShardedStateDictConfig, StateDictType, FullyShardedDataParallel as FSDP_
        FSDP_.set_state_dict_type(wrap_out, StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig(), ShardedOptimStateDictConfig())
        out = {}
        out[DcpItem.MODEL] = wrap_out
        order = range(1)
        state = {'model': out[DcpItem.MODEL] for i in order if (DcpItem.MODEL,)[i] in out}
        import torch.distributed.checkpoint as dcp
        result = dcp.async_save(state)
    except BaseException as e:
        frames = [f for f in (torch_frame(p, f) for p, f in re.findall('File "([^"]+)", line \\d+,? in (\\S+)', traceback.format_exc())) if f]
        found = f"{type(e).__module__}.{type(e).__qualname__}@{(frames or ['torch/?:?'])[-1]}"
        if found in ['builtins.RuntimeError@torch/distributed/_shard/sharded_tensor/api.py:dispatch']:
            return f'REPRODUCED exception:dcp:builtins.RuntimeError@torch/distributed/_shard/sharded_tensor/api.py:dispatch: rank {rank} raised {found}: {e}'
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
