#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=63e5b277ec033028 sources=b2f61a16b7315ba5 seconds=4895.1
# Reproduces shardfuzz corpus entry dcp-mismatch-ada81405774d.json: mismatch:dcp@save:fsdp1-hsdp-load_sharded_optimizer_state_dict
# Known torch bug: load_sharded_optimizer_state_dict chunks optimizer state over the whole world:
# wrong Adam state in FSDP1 HYBRID_SHARD over a 2-D mesh; upstream: none found.
# Observed: rank 2's local optimizer state (FSDP1, one layout) differs after the load:
# ['0.weight']['exp_avg'][0]: 0.0 != -0.016777848531689548
# Run: torchrun --nproc-per-node 4 THIS_FILE.py: while the failure is there a rank prints
# REPRODUCED and exits 1; once it is gone rank 0 prints PASS and every rank exits 0 (expected: the
# property's judge finds nothing); a rank exits 2 where the script cannot run (not under torchrun,
# another world size) or the case fails another way (it prints FAIL). torchrun's own status is 1
# whenever a rank's is not 0.

from __future__ import annotations
import torch
import enum
import os
from torch import nn
import torch.nn.functional as F
import torch.distributed as dist
from dataclasses import dataclass, field

class DcpItem(str, enum.Enum):
    OPTIMIZER = 'optimizer'

class PointwiseConv1d(nn.Conv1d):

    def forward(self, x):
        return super().forward(x.unsqueeze(-1))

def clean_name():
    pass

def _jsonable(value):
    return [v_ for v_ in value.flatten()]

@dataclass()
class Failure:
    kind: object
    signature: object
    summary: object
    details: object = field()

def _mismatch(prop, check, where, summary, **details):
    return Failure('mismatch', 'mismatch', summary, {**details})

def _exact(prop, check, where, what, got, want, **details):
    diff = '' if got == want else f"{''}: {got!r} != {want!r}"
    if not diff:
        return None
    return _mismatch(prop, check, where, f'{what} differs after the load: {diff}', **details)

def _check_optimizer(prop, observations):
    for rank, obs in enumerate(observations):
        local = obs['saved']['optimizer_local']
        holding_elements_out = {name: entry for name, entry in local.items()}
        failure = _exact(prop, 'optimizer', 'save', f"rank {rank}'s local optimizer state (FSDP1, one layout)", obs['loaded']['optimizer_local'], holding_elements_out)
        if failure is not None:
            return failure

def attempt(rank, world_size):
    path = os.path.join('/tmp/shardfuzz-dcp-3246', 'bc6a61957b78-0')
    x = torch.randn(world_size, 2, dtype=torch.float64)
    y = torch.randn(world_size, 2)
    step_ = [(x[rank:rank + 1], y[rank:rank + 1])]
    model = nn.Sequential(PointwiseConv1d(2, 2, kernel_size=1)).to(torch.float64)
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    strategy = ShardingStrategy.HYBRID_SHARD
    from torch.distributed.device_mesh import init_device_mesh
    ctx__meshes_empty = init_device_mesh(torch.device('cpu').type, (2, 2))
    wrap_out = FSDP(model, sharding_strategy=strategy, device_id=torch.device('cpu'), use_orig_params=True, device_mesh=ctx__meshes_empty)
    params = wrap_out.parameters()
    src_opt = torch.optim.Adam(params)
    src_param_names = {id(p): clean_name() for n__, p in wrap_out.named_parameters()}
    from torch.distributed.fsdp import ShardedOptimStateDictConfig, ShardedStateDictConfig, StateDictType
    FSDP.set_state_dict_type(wrap_out, StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig(), ShardedOptimStateDictConfig())
    data_ = [step_[0]][:1]
    x_, y_ = next(iter(data_))
    loss = F.mse_loss(wrap_out(x_), y_)
    loss.backward()
    src_opt.step()
    osd_ = FSDP.optim_state_dict(wrap_out, src_opt)
    state = {DcpItem.OPTIMIZER.value: osd_}
    import torch.distributed.checkpoint as dcp
    dcp.save(state, checkpoint_id=path)
    current = {id(p____): clean_name() for n, p____ in wrap_out.named_parameters()}
    names = {**src_param_names, **current}
    out___ = {}
    group = next(iter(src_opt.param_groups))
    p__ = next(iter(group['params']))
    state_ = src_opt.state.get(p__, {})
    entry = {key__: _jsonable(state_[key__]) for key__ in state_}
    out___[names.get(id(p__), '?')] = entry
    obs_ = {'optimizer_local': out___}
    saved = {**obs_}
    model_ = nn.Sequential(PointwiseConv1d(2, 2, kernel_size=1)).to(torch.float64)
    strategy_ = ShardingStrategy.HYBRID_SHARD
    wrap_out_ = FSDP(model_, sharding_strategy=strategy_, device_id=torch.device('cpu'), use_orig_params=True, device_mesh=ctx__meshes_empty)
    params_ = wrap_out_.parameters()
    tgt_opt = torch.optim.Adam(params_)
    tgt_param_names = {id(p_): clean_name() for n___, p_ in wrap_out_.named_parameters()}
    FSDP.set_state_dict_type(wrap_out_, StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig(), ShardedOptimStateDictConfig())
    from torch.distributed.checkpoint.optimizer import load_sharded_optimizer_state_dict
    loaded = load_sharded_optimizer_state_dict(model_state_dict=wrap_out_.state_dict(), optimizer_key='optimizer', storage_reader=dcp.FileSystemReader(path))
    osd = loaded['optimizer']
    tgt_opt.load_state_dict(FSDP.optim_state_dict_to_load(wrap_out_, tgt_opt, osd))
    current_ = {id(p_____): clean_name() for n_, p_____ in wrap_out_.named_parameters()}
    names_ = {**tgt_param_names, **current_}
    out____ = {}
    group_ = next(iter(tgt_opt.param_groups))
    p___ = next(iter(group_['params']))
    state__ = tgt_opt.state.get(p___, {})
    entry_ = {key___: _jsonable(state__[key___]) for key___ in state__}
    out____[names_.get(id(p___), '?')] = entry_
    obs___ = {'optimizer_local': out____}
    obs__ = {'saved': saved, 'loaded': {**obs___}}
    outs = [None, None, None, None]
    dist.all_gather_object(outs, obs__)
    if rank != 0:
        return ''
    reports = (o for r, o in enumerate(outs))
    prop, observations = ('dcp', [r for r in reports])
    failure__ = _check_optimizer(prop, observations)
    failure = failure__ if failure__ is None or not failure__.signature.endswith(':shard1') else None
    if failure is not None:
        return f'REPRODUCED mismatch:dcp@save:fsdp1-hsdp-load_sharded_optimizer_state_dict: {failure.summary}'
    return f'PASS or another failure: {failure and failure.summary}'


def main():
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import sys
    if os.environ.get("WORLD_SIZE") != "4":
        print("run it with: torchrun --nproc-per-node 4 " + sys.argv[0], file=sys.stderr)
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
