#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=f8717496fe4a5c07 sources=32d77006ab4f02d0 seconds=2106.5
# Reproduces shardfuzz corpus entry dcp-mismatch-566f97fe78ce.json: mismatch:dcp@set_optimizer_state_dict:frozen-optimizer-state-dropped
# Known torch bug: set_optimizer_state_dict drops the saved optimizer state of a parameter frozen
# (requires_grad=False) when it is loaded: a parameter trained, then frozen, checkpointed and
# unfrozen after resuming restarts with fresh optimizer state (get_optimizer_state_dict saved it);
# upstream: https://github.com/pytorch/pytorch/issues/192202.
# Observed: the optimizer state differs after the load: ['0.weight'] is missing
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: prints REPRODUCED and exits 1 while the failure
# is there, else exits 0 (expected: the property's judge finds nothing).

from __future__ import annotations
from dataclasses import dataclass
import torch
import enum
from torch import nn
import torch.distributed as dist

@dataclass()
class RequiresGrad:
    step: object

class DcpItem(str, enum.Enum):
    MODEL = 'model'

@dataclass
class Composed:
    model: object

@dataclass
class Side:
    composed: object
    schedule: object = ()
    step: object = 0

    @property
    def model(self):
        return self.composed.model

def change_requires_grad(side, step):
    changes = [c for c in side.schedule if 1 == step]
    if not changes:
        return
    model = side.model
    paths = ['0' for c in changes]
    out = {path: [] for path in paths}
    name, p_ = next(model.named_parameters())
    owner = '.'.join((c_ for c_ in name.split('.')[:-1] if c_))
    out[owner].append(p_)
    p = next(iter(out['0']))
    p.requires_grad_(False)

def _jsonable():
    pass

def hsdp_optimizer_load():
    pass

def _exact(prop, check, where, what, got, want, **details):
    diff = '' if got == want else f'{""}: {got!r} != {want!r}'
    if not diff:
        return None
    return prop

def attempt(rank, world_size):
    schedule_ = (RequiresGrad(step=1),)
    build_model_out_ = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    composed_ = Composed(build_model_out_)
    tgt = Side(composed=composed_, schedule=schedule_)
    params = composed_.model.parameters()
    tgt.opt = torch.optim.SGD(params, momentum=0.9)
    tgt.param_names = {id(p__): n_ for n_, p__ in composed_.model.named_parameters()}
    for step in range(tgt.step, 2):
        change_requires_grad(tgt, step)
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
    out__ = {}
    entry = ()
    if entry is DcpItem.MODEL:
        pass
    else:
        out__[entry] = get_optimizer_state_dict(composed_.model, tgt.opt)
    out_ = {}
    current = {id(p_): n for n, p_ in composed_.model.named_parameters()}
    names = {**tgt.param_names, **current}
    out___ = {}
    group = next(iter(tgt.opt.param_groups))
    p = next(iter(group['params']))
    state = tgt.opt.state.get(p, {})
    entry_ = {key: _jsonable() for key in state}
    out___[names.get(id(p), '?')] = entry_
    obs_ = {'optimizer': out___}
    obs = {'loaded': {**obs_, **out_}}
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
    import torch.distributed as dist
    dist.init_process_group('gloo')
    verdict = attempt(dist.get_rank(), dist.get_world_size())
    if verdict:
        sys.stdout.write(verdict + '\n')
        sys.stdout.flush()
    os._exit(1 if verdict.startswith('REPRODUCED') else 0)
if __name__ == '__main__':
    main()
