#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=8a961ec26fda3260 sources=1ee5b339ab4179e7 seconds=322.8
"""Reproduces shardfuzz corpus entry state_dict-exception-ab49bbd468b0.json: exception:state_dict:builtins.AssertionError@torch/distributed/fsdp/_state_dict_utils.py:_common_unshard_post_state_dict_hook
Known torch bug: FSDP1 NO_SHARD with an auto-wrapped unit of frozen parameters: state_dict()
after training raises 'FSDP assumes ... is in the state_dict'; upstream:
https://github.com/pytorch/pytorch/issues/85831.
Observed: rank 0 raised builtins.AssertionError: FSDP assumes 0.weight is in the state_dict but
the state_dict only has odict_keys(['1.0.weight', '1.0.bias']). prefix=, module_name=0., ...
Run: torchrun --nproc-per-node 2 THIS_FILE.py: prints REPRODUCED and exits 1 while the
failure is there, else exits 0 (expected: no rank raises).
"""

from __future__ import annotations
import torch
from torch import nn
import torch.nn.functional as F

def attempt(rank, world_size):
    ctx_device = torch.device('cpu')
    import re
    import traceback
    try:
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
        kwargs = {'sharding_strategy': strategy, 'device_id': ctx_device, 'use_orig_params': True}
        kwargs['auto_wrap_policy'] = ModuleWrapPolicy({nn.Sequential})
        wrap_out = FSDP(build_model_out, **kwargs)
        data_ = [step_[0]][:2]
        x_, y_ = next(iter(data_))
        loss = F.mse_loss(wrap_out(x_), y_)
        loss.backward()
        msd, osd = (wrap_out.state_dict(), None)
    except BaseException as e:
        frames = re.findall('File "([^"]+)", line \\d+, in (\\S+)', traceback.format_exc())
        at = [f'torch/{p.rpartition("/torch/")[2]}:{f}' for p, f in frames if '/torch/' in p and 'comp>' not in f]
        found = f'{type(e).__module__}.{type(e).__qualname__}@{(at or ["torch/?:?"])[-1]}'
        if found in ['builtins.AssertionError@torch/distributed/fsdp/_state_dict_utils.py:_common_unshard_post_state_dict_hook'] and at[0] == 'torch/nn/modules/module.py:state_dict' and (re.sub('\\d+(?:\\.\\d+)*', '#', str(e).partition('\n')[0]) == "FSDP assumes #.weight is in the state_dict but the state_dict only has odict_keys(['#.weight', '#.bias']). prefix=, module_name=#., param_name=weight rank=#."):
            return f'REPRODUCED exception:state_dict:builtins.AssertionError@torch/distributed/fsdp/_state_dict_utils.py:_common_unshard_post_state_dict_hook: rank {rank} raised {found}: {e}'
        return f"FAIL (not the entry's failure): rank {rank} raised {found}: {e}"
    return 'PASS: no rank raised'

def main():
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import sys
    import torch.distributed as dist
    dist.init_process_group('gloo')
    verdict = attempt(dist.get_rank(), dist.get_world_size())
    if verdict:
        sys.stdout.write(verdict + '\n')
        sys.stdout.flush()
    os._exit(1 if verdict.startswith('REPRODUCED') else 0)
if __name__ == '__main__':
    main()
