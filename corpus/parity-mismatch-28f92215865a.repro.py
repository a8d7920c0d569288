#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=075f93630193a507 sources=d923905269ac869f seconds=597.4
# Reproduces shardfuzz corpus entry parity-mismatch-28f92215865a.json: mismatch:parity:contract-delay-all-reduce
# Known torch bug: DistributedDataParallel(delay_all_reduce_named_params=...,
# param_to_hook_all_reduce=...): a delayed parameter of the root module itself stays in the
# reducer too (the reducer leaves out f'{module_name}.{name}', which is '.<name>' for the root's
# own parameters), so it is registered twice; with static_graph=True it is all-reduced twice,
# racing, and its gradient is wrong now and then; every parameter replicate() hands DDP is one (an
# nn.ParameterList's); upstream: none found.
# Observed: replicate with delay_all_reduce_named_params / param_to_hook_all_reduce: DDP keeps the
# delayed parameters (all the root's own under replicate) in its reducer as well, which the ...
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: while the failure is there a rank prints
# REPRODUCED and exits 1; once it is gone rank 0 prints PASS and every rank exits 0 (expected: the
# property's judge finds nothing); a rank exits 2 where the script cannot run (not under torchrun,
# another world size) or the case fails another way (it prints FAIL). torchrun's own status is 1
# whenever a rank's is not 0.

from __future__ import annotations
import torch
from torch import nn

def check_contracts(contracts):
    delayed = contracts.get('delayed')
    if delayed:
        summary = delayed[0]
        return summary

def attempt(rank, world_size):
    import torch.distributed as dist
    model_ = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4))
    from torch.distributed._composable import replicate
    hook, delayed = ('0', ())
    replicate(model_, param_to_hook_all_reduce=model_.get_submodule(hook).get_parameter('weight'), delay_all_reduce_named_params=[(str(i__), model_.get_submodule(p__).get_parameter(name)) for i__, (p__, name) in enumerate([('0', 'weight')])])
    lo = rank * 2
    x_ = torch.randn(4, 4)
    y_ = torch.randn(4, 4)
    step_ = [(x_[lo:lo + 2], y_[lo:lo + 2])]
    s, step = next(enumerate([step_]))
    i, (x, y) = next(enumerate(step))
    out = model_(x)
    obs = {'contracts': {}}
    problems = []
    ddp = getattr(replicate.state(model_), '_ddp', None)
    reduced = {id(p_) for p_ in ddp._build_params_for_reducer()[0]}
    held = [i_ for i_, p_ in enumerate(ddp._delay_all_reduce_params) if id(p_) in reduced]
    if held:
        problems.append(f"replicate({''!r}): {held} of {ddp._delay_all_reduce_params} delayed parameters are also in DDP's reducer (all-reduced twice)")
    obs['contracts']['delayed'] = problems
    run_parity_out = {**obs}
    outs = [None, None]
    dist.all_gather_object(outs, run_parity_out)
    if rank != 0:
        return ''
    reports = (o for r, o in enumerate(outs))
    obs_ = [r for r in reports]
    contracts = obs_[0].get('contracts')
    failure = check_contracts(contracts) if contracts is not None else None
    if failure is not None:
        return f'REPRODUCED mismatch:parity:contract-delay-all-reduce: {failure}'
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
