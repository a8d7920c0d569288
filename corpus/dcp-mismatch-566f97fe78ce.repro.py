#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=f8717496fe4a5c07 sources=32d77006ab4f02d0 seconds=2348.5
# Reproduces shardfuzz corpus entry dcp-mismatch-566f97fe78ce.json: mismatch:dcp@set_optimizer_state_dict:frozen-optimizer-state-dropped
# Known torch bug: set_optimizer_state_dict drops the saved optimizer state of a parameter frozen
# (requires_grad=False) when it is loaded: a parameter trained, then frozen, checkpointed and
# unfrozen after resuming restarts with fresh optimizer state (get_optimizer_state_dict saved it);
# upstream: https://github.com/pytorch/pytorch/issues/192202.
# Observed: the optimizer state differs after the load: ['0.weight'] is missing
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: while the failure is there a rank prints
# REPRODUCED and exits 1; once it is gone rank 0 prints PASS and every rank exits 0 (expected: the
# property's judge finds nothing); a rank exits 2 where the script cannot run (not under torchrun,
# another world size) or the case fails another way (it prints FAIL). torchrun's own status is 1
# whenever a rank's is not 0.

from __future__ import annotations
import torch
from torch import nn
import torch.distributed as dist

def _jsonable():
    pass

def hsdp_optimizer_load():
    pass

def _exact(prop, check, where, what, got, want, **details):
    diff = '' if got == want else f"{''}: {got!r} != {want!r}"
    if not diff:
        return None
    return prop

def attempt(rank, world_size):
    build_model_out_ = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    params = build_model_out_.parameters()
    tgt_opt = torch.optim.SGD(params, momentum=0.9)
    tgt_param_names = {id(p__): n_ for n_, p__ in build_model_out_.named_parameters()}
    out = {'0': []}
    name, p____ = next(build_model_out_.named_parameters())
    owner = '.'.join((c_ for c_ in name.split('.')[:-1]))
    out[owner].append(p____)
    p___ = next(iter(out['0']))
    p___.requires_grad_(False)
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
    out___empty = get_optimizer_state_dict(build_model_out_, tgt_opt)
    current = {id(p_): n for n, p_ in build_model_out_.named_parameters()}
    names = {**tgt_param_names, **current}
    out___ = {}
    group = next(iter(tgt_opt.param_groups))
    p = next(iter(group['params']))
    state = tgt_opt.state.get(p, {})
    entry_ = {key: _jsonable() for key in state}
    out___[names.get(id(p), '?')] = entry_
    obs_ = {'optimizer': out___}
    obs = {'loaded': {**obs_}}
    outs = [None, None]
    dist.all_gather_object(outs, obs)
    if rank != 0:
        return ''
    reports = (o for r, o in enumerate(outs))
    prop, observations = ('dcp', [r for r in reports])
    first_ = observations[0]
    failure___ = _exact(prop, 'optimizer', 'save', 'the optimizer state', first_['loaded']['optimizer'], {'0.weight': {'momentum_buffer': None}})
    hsdp_optimizer_load_out = failure___ if not hsdp_optimizer_load() else None
    failure = hsdp_optimizer_load_out if hsdp_optimizer_load_out != 'mismatch' else None
    if failure is not None:
        return f'REPRODUCED mismatch:dcp@set_optimizer_state_dict:frozen-optimizer-state-dropped: {failure}'
    return f'PASS or another failure: {failure and failure}'


def main():
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import sys
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
    if verdict:
        print(verdict, flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
