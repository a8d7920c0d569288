#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=e9797d40ebc65ba7 sources=23436965d888924f seconds=2368.2
# Reproduces shardfuzz corpus entry state_dict-mismatch-7b9a97d5e646.json: mismatch:state_dict@fsdp1_optim_state_dict:shard1
# Known torch bug: FSDP1 HYBRID_SHARD with a shard dimension of size 1 never averages gradients
# across replicas; upstream: https://github.com/pytorch/pytorch/issues/154888.
# Observed: FSDP1 HYBRID_SHARD with a shard dimension of size 1 never averages gradients across
# replicas; met here while resuming after an FSDP1 state-dict load. (0.weight[14] is ...
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: prints REPRODUCED and exits 1 while the failure
# is there, else exits 0 (expected: the property's judge finds nothing).

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

def clean_name(name):
    name = name.replace('_fsdp_wrapped_module.', '')
    return name

@dataclass
class Composed:
    model: object
    param_names: object = field()

    @contextmanager
    def full_parameters(self):
        modules = {clean_name(n): m for n, m in self.model.named_modules()}
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
    ctx__meshes = {}
    import json
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
    params = wrap_out.parameters()
    src_opt = torch.optim.SGD(params)
    obs__ = {}
    msd, osd = (wrap_out.state_dict(), wrap_out)
    build_model_out_ = TreeBlock([TreeBlock([], True)], False)
    names_ = [n___ for n___, ___ in build_model_out_.named_parameters()]
    strategy_ = ShardingStrategy.HYBRID_SHARD
    shape = (2, 1)
    from torch.distributed.device_mesh import init_device_mesh
    key = ()
    ctx__meshes[key] = init_device_mesh(ctx_device.type, shape)
    RankContext_mesh_out = ctx__meshes[key]
    wrap_out_ = FSDP(build_model_out_, sharding_strategy=strategy_, device_id=torch.device('cpu'), use_orig_params=True, device_mesh=RankContext_mesh_out)
    composed_ = Composed(model=wrap_out_, param_names=names_)
    params_ = wrap_out_.parameters()
    tgt_opt = torch.optim.SGD(params_)
    result_ = wrap_out_.load_state_dict(msd)
    data_ = data[2:]
    obs_ = {}
    x_, y_ = next(iter(data_))
    loss = F.mse_loss(wrap_out(x_), y_)
    loss.backward()
    src_opt.step()
    with composed.full_parameters() as params__:
        out_ = {n: [float(v) for v in t_] for n, t_ in params__.items()}
    x__, y__ = next(iter(data_))
    loss_ = F.mse_loss(wrap_out_(x__), y__)
    loss_.backward()
    tgt_opt.step()
    with composed_.full_parameters() as params___:
        out__ = {n_: [float(v_) for v_ in t__] for n_, t__ in params___.items()}
    obs_['final_source'], obs_['final_target'] = (out_, out__)
    obs__.update(obs_)
    outs = [None, None]
    dist.all_gather_object(outs, obs__)
    if rank != 0:
        return ''
    reports = tuple((o for r, o in enumerate(outs)))
    observations = [r for r in reports]
    first = observations[0]
    got_p, want_p = (first['final_target'], first['final_source'])
    name, want_v = next(iter(want_p.items()))
    actual = got_p.get(name, [])
    worst = None
    i, (a, e) = next(enumerate(zip(actual, want_v)))
    err = abs(a - e)
    if not err <= 1.2039656400680544e-05:
        worst = i
    bad_p = worst
    failure_ = _mismatch('state_dict', 'resume_params', 'fsdp1_optim_state_dictFSDP1 HYBRID_SHARD with a shard dimension of size 1 never averages gradients across replicas', '0.scale[0] is 1.2614985704421997 after resuming, uninterrupted 1.2611660957336426 (error 0.000332 > allowed 1.2e-05)') if bad_p is not None else None
    if failure_ is not None:
        return f'REPRODUCED mismatch:state_dict@fsdp1_optim_state_dict:shard1: {failure_}'
    return f'PASS or another failure: {failure_ and failure_}'

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
