#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=bc8ec400c405abdb sources=9d7be58e4208c9df seconds=387.7
# Reproduces shardfuzz corpus entry dcp-exception-d6daf354182c.json: exception:dcp:builtins.RuntimeError@torch/distributed/_shard/sharded_tensor/api.py:dispatch
# Known torch bug: dcp.async_save's default stager calls data_ptr() on ShardedTensors; upstream:
# none found.
# Observed: rank 0 raised builtins.RuntimeError: torch function 'data_ptr', with args:
# (ShardedTensor(ShardedTensorMetadata(shards_metadata=[ShardMetadata(shard_offsets=[0, 0], ...
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: prints REPRODUCED and exits 1 while the
# failure is there, else exits 0 (expected: no rank raises).

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
        frames = re.findall('File "([^"]+)", line \\d+, in (\\S+)', traceback.format_exc())
        path, fn = ([(p, f) for p, f in frames if '/torch/' in p and (not f.endswith('comp>'))] or [('?', '?')])[-1]
        found = f'{type(e).__module__}.{type(e).__qualname__}@torch/{path.rpartition("/torch/")[2]}:{fn}'
        if found in ['builtins.RuntimeError@torch/distributed/_shard/sharded_tensor/api.py:dispatch']:
            return f'REPRODUCED exception:dcp:builtins.RuntimeError@torch/distributed/_shard/sharded_tensor/api.py:dispatch: rank {rank} raised {found}: {e}'
        return f"FAIL (not the entry's failure): rank {rank} raised {found}: {e}"
    return 'PASS: no rank raised'

def main():
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import torch.distributed as dist
    dist.init_process_group('gloo')
    verdict = attempt(dist.get_rank(), dist.get_world_size())
    if verdict:
        print(verdict, flush=True)
    os._exit(1 if verdict.startswith('REPRODUCED') else 0)
if __name__ == '__main__':
    main()
