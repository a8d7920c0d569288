#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=71d9601af2884473 sources=c819ef517160c7c9 seconds=364.9
"""Reproduces shardfuzz corpus entry parity-exception-3e90c3cc368a.json: exception:parity:builtins.ValueError@torch/utils/checkpoint.py:_checkpoint_without_reentrant_generator
Known torch bug: composable checkpoint(module, debug=True) raises ValueError 'debug=True is
incompatible with non-default context_fn' on the first forward whatever the caller passes: it
always hands torch.utils.checkpoint a context_fn of its own; upstream:
https://github.com/pytorch/pytorch/issues/185285.
Observed: composable checkpoint(debug=True) always raises ValueError 'debug=True is incompatible
with non-default context_fn' (it passes torch.utils.checkpoint a context_fn of its own); met ...
Run: torchrun --nproc-per-node 2 THIS_FILE.py: prints REPRODUCED and exits 1 while the
failure is there, else exits 0 (expected: no rank raises).
"""

from __future__ import annotations
import torch
from torch import nn

def attempt(rank, world_size):
    import re
    import traceback
    try:
        build_model_out = nn.Sequential(nn.Linear(4, 4))
        from torch.distributed._composable import checkpoint
        kwargs = {}
        kwargs['debug'] = True
        checkpoint(build_model_out, **kwargs)
        lo = rank * 2
        x_ = torch.randn(4, 4)
        y_ = torch.randn(4, 4)
        step_ = [(x_[lo:lo + 2], y_[lo:lo + 2])]
        i, (x, y) = next(iter(enumerate(step_)))
        out = build_model_out(x)
    except BaseException as e:
        frames = re.findall('File "([^"]+)", line \\d+, in (\\S+)', traceback.format_exc())
        path, fn = ([(p, f) for p, f in frames if '/torch/' in p and (not f.endswith('comp>'))] or [('?', '?')])[-1]
        found = f'{type(e).__module__}.{type(e).__qualname__}@torch/{path.rpartition("/torch/")[2]}:{fn}'
        if found in ['builtins.ValueError@torch/utils/checkpoint.py:_checkpoint_without_reentrant_generator']:
            return f'REPRODUCED exception:parity:builtins.ValueError@torch/utils/checkpoint.py:_checkpoint_without_reentrant_generator: rank {rank} raised {found}: {e}'
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
