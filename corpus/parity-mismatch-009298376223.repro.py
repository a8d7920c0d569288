#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=d9f2fe49f54e84bd sources=83fa50b93cab1e70 seconds=2015.7
# Reproduces shardfuzz corpus entry parity-mismatch-009298376223.json: mismatch:parity@fsdp2:shard1:divide-factor-twice
# Known torch bug: set_gradient_divide_factor(f) on a fully_shard unit whose shard group is one
# rank, with set_force_sum_reduction_for_comms(True) or a float16 / float64 reduce dtype:
# gradients are divided by f twice (once where the single-rank branch copies the input, once more
# as the post-divide); upstream: none found.
# Observed: rank 0 gradient norm at step 0 is 1.7529385089874268, expected 3.5058770179748535
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: while the failure is there a rank prints
# REPRODUCED and exits 1; once it is gone rank 0 prints PASS and every rank exits 0 (expected: the
# property's judge finds nothing); a rank exits 2 where the script cannot run (not under torchrun,
# another world size) or the case fails another way (it prints FAIL). torchrun's own status is 1
# whenever a rank's is not 0.

from __future__ import annotations
import torch
from torch import nn
import torch.nn.functional as F
import torch.distributed as dist

class KnobState:

    def __init__(self, model):
        model.set_force_sum_reduction_for_comms(True)
        model.set_gradient_divide_factor(2.0)

class PointwiseConv1d(nn.Conv1d):
    pass

def _mismatch(prop, check, api, summary, **details):
    return summary

def attempt(rank, world_size):
    torch.manual_seed(0)
    module = PointwiseConv1d(1, 1, kernel_size=1)
    from torch.distributed.device_mesh import init_device_mesh
    ctx__meshes_empty = init_device_mesh(torch.device('cpu').type, (2, 1), mesh_dim_names=('replicate', 'shard'))
    from torch.distributed.fsdp import fully_shard
    fully_shard(module, mesh=ctx__meshes_empty)
    compose_out_knobs = KnobState(module)
    x_ = torch.randn(world_size, 1)
    y_ = torch.randn(world_size, 1)
    step_ = [(x_[rank:rank + 1], y_[rank:rank + 1])]
    i__, (x, y) = next(enumerate(step_))
    out = module(x)
    loss = F.mse_loss(out, y)
    loss.backward()
    from torch.distributed.tensor import DTensor
    total = torch.zeros(())
    p_____ = next(module.parameters())
    g_ = p_____.grad.full_tensor() if DTensor else p_____.grad
    total += g_.sum()
    grad_norm_out = total
    grad_norms = [grad_norm_out]
    obs___ = {'grad_norms': grad_norms}
    run_parity_out = {**obs___}
    outs = [None, None]
    dist.all_gather_object(outs, run_parity_out)
    if rank != 0:
        return ''
    reports = (o for r, o in enumerate(outs))
    obs_ = [r for r in reports]
    rank_, obs__ = obs_
    norms = [(i, g, w) for i, (g, w) in enumerate(zip(obs__['grad_norms'][:None], [-1.10770845413208]))]
    step, got_norm, want_norm = next(iter(norms))
    actual = [got_norm]
    expected = [-1.10770845413208]
    worst = None
    i_, (a, e) = next(enumerate(zip(actual, expected)))
    err = a - e
    if not err <= 1.2077084541320802e-05:
        worst = e
    bad = worst
    failure_ = _mismatch('parity', 'grad', 'fsdp2:shard1:divide-factor-twice', 'rank 0 gradient norm at step 0 is -0.55385422706604, expected -1.10770845413208') if bad is not None else None
    if failure_ is not None:
        return f'REPRODUCED mismatch:parity@fsdp2:shard1:divide-factor-twice: {failure_}'
    return f'PASS or another failure: {failure_ and failure_}'

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
    if verdict and verdict not in ['PASS or another failure: None', 'PASS: every rank finished', 'PASS: no rank died', 'PASS: no rank raised']:
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
