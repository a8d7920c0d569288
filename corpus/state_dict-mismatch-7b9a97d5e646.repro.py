#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=e9797d40ebc65ba7 sources=23436965d888924f seconds=2462.5
# Reproduces shardfuzz corpus entry state_dict-mismatch-7b9a97d5e646.json: mismatch:state_dict@fsdp1_optim_state_dict:shard1
# Known torch bug: FSDP1 HYBRID_SHARD with a shard dimension of size 1 never averages gradients
# across replicas; upstream: https://github.com/pytorch/pytorch/issues/154888.
# Observed: FSDP1 HYBRID_SHARD with a shard dimension of size 1 never averages gradients across
# replicas; met here while resuming after an FSDP1 state-dict load. (0.weight[14] is ...
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: while the failure is there a rank prints
# REPRODUCED and exits 1; once it is gone rank 0 prints PASS and every rank exits 0 (expected: the
# property's judge finds nothing); a rank exits 2 where the script cannot run (not under torchrun,
# another world size) or the case fails another way (it prints FAIL). torchrun's own status is 1
# whenever a rank's is not 0.

from __future__ import annotations
import torch
from torch import nn
from contextlib import contextmanager
import torch.nn.functional as F
from dataclasses import dataclass, field, replace

class TreeBlock(nn.Module):

    def __init__(self, children, scale):
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(4)) if scale else None

    def forward(self, x):
        y = x
        for name, child in self.named_children():
            y = child(y)
        if self.scale is not None:
            y = y * self.scale
        return y

@dataclass
class Composed:
    model: object
    param_names: object = field()

    @contextmanager
    def full_parameters(self):
        modules = {n.replace('_fsdp_wrapped_module.', ''): m for n, m in self.model.named_modules()}
        out = {}
        name = next(iter(self.param_names))
        owner, _, attr = name.rpartition('.')
        out[name] = getattr(modules[owner], attr)
        yield out

def _mismatch(prop, check, where, summary, **details):
    return summary

def attempt(rank, world_size):
    import torch.distributed as dist
    ctx_device = torch.device('cpu')
    lo = rank * 2
    out = []
    for _ in range(3):
        x = torch.randn(4, 4)
        y = torch.randn(4, 4)
        step_ = [(x[lo:lo + 2], y[lo:lo + 2])]
        out.append(step_)
    data = [step[0] for step in out]
    build_model_out = TreeBlock([TreeBlock([], True)], False)
    names = [n__ for n__, __ in build_model_out.named_parameters()]
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    wrap_out = FSDP(build_model_out, device_id=torch.device('cpu'), use_orig_params=True)
    composed = Composed(model=wrap_out, param_names=names)
    src_opt = torch.optim.SGD(wrap_out.parameters())
    msd = wrap_out.state_dict()
    build_model_out_ = TreeBlock([TreeBlock([], True)], False)
    names_ = [n___ for n___, ___ in build_model_out_.named_parameters()]
    strategy_ = ShardingStrategy.HYBRID_SHARD
    from torch.distributed.device_mesh import init_device_mesh
    ctx__meshes_empty = init_device_mesh(ctx_device.type, (2, 1))
    wrap_out_ = FSDP(build_model_out_, sharding_strategy=strategy_, device_id=torch.device('cpu'), use_orig_params=True, device_mesh=ctx__meshes_empty)
    composed_ = Composed(model=wrap_out_, param_names=names_)
    tgt_opt = torch.optim.SGD(wrap_out_.parameters())
    result_ = wrap_out_.load_state_dict(msd)
    data_ = data[2:]
    x_, y_ = next(iter(data_))
    F.mse_loss(wrap_out(x_), y_).backward()
    src_opt.step()
    with composed.full_parameters() as params__:
        out_ = {n: [v for v in t_] for n, t_ in params__.items()}
    x__, y__ = next(iter(data_))
    F.mse_loss(wrap_out_(x__), y__).backward()
    tgt_opt.step()
    with composed_.full_parameters() as params___:
        out__ = {n_: [v_ for v_ in t__] for n_, t__ in params___.items()}
    obs__ = {'final_source': out_, 'final_target': out__}
    outs = [None, None]
    dist.all_gather_object(outs, obs__)
    if rank != 0:
        return ''
    first = [r for r in (o for r, o in enumerate(outs))][0]
    got_p = first['final_target']
    name, want_v = next(iter(first['final_source'].items()))
    actual = got_p.get(name, [])
    worst = None
    i, (a, e) = zip(actual, want_v)
    if not abs(a - e) <= 1.2039656400680544e-05:
        worst = i
    failure_ = _mismatch('state_dict', 'resume_params', 'fsdp1_optim_state_dictFSDP1 HYBRID_SHARD with a shard dimension of size 1 never averages gradients across replicas', '0.scale[0] is 1.2614985704421997 after resuming, uninterrupted 1.2611660957336426 (error 0.000332 > allowed 1.2e-05)') if worst is not None else None
    if failure_ is not None:
        return f'REPRODUCED mismatch:state_dict@fsdp1_optim_state_dict:shard1: {failure_}'
    return f'PASS or another failure: {failure_ and failure_}'


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
