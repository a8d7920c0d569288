#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=63e5b277ec033028 sources=b2f61a16b7315ba5 seconds=2684.8
# Reproduces shardfuzz corpus entry dcp-mismatch-ada81405774d.json: mismatch:dcp@save:fsdp1-hsdp-load_sharded_optimizer_state_dict
# Known torch bug: load_sharded_optimizer_state_dict chunks optimizer state over the whole world:
# wrong Adam state in FSDP1 HYBRID_SHARD over a 2-D mesh; upstream: none found.
# Observed: rank 2's local optimizer state (FSDP1, one layout) differs after the load:
# ['0.weight']['exp_avg'][0]: 0.0 != -0.016777848531689548
# Run: torchrun --nproc-per-node 4 THIS_FILE.py: prints REPRODUCED and exits 1 while the failure
# is there, else exits 0 (expected: the property's judge finds nothing).

from __future__ import annotations
import torch
import enum
import os
from torch import nn
import torch.nn.functional as F
import torch.distributed as dist
from dataclasses import dataclass, field

@dataclass()
class Composition:
    pass

@dataclass()
class Training:
    pass

class DcpItem(str, enum.Enum):
    MODEL = 'model'
    OPTIMIZER = 'optimizer'

class PointwiseConv1d(nn.Conv1d):

    def forward(self, x):
        return super().forward(x.unsqueeze(-1))

def clean_name():
    pass

@dataclass
class Composed:
    model: object

@dataclass
class Side:
    composed: object
    comp: object
    training: object

    @property
    def model(self):
        return self.composed.model

    def names(self):
        current = {id(p): clean_name() for n, p in self.model.named_parameters()}
        return {**self.param_names, **current}

def _jsonable(value):
    return [float(v_) for v_ in value.flatten()]

def observe(side):
    names = side.names()
    out_ = {}
    group = next(iter(side.opt.param_groups))
    p = next(iter(group['params']))
    state = side.opt.state.get(p, {})
    entry = {key: _jsonable(state[key]) for key in sorted(state)}
    out_[names.get(id(p), '?')] = entry
    obs = {'optimizer_local': out_}
    return obs

@dataclass()
class Failure:
    kind: object
    signature: object
    summary: object
    details: object = field()

def _mismatch(prop, check, where, summary, **details):
    return Failure('mismatch', str('mismatch'), summary, {**details})

def _exact(prop, check, where, what, got, want, **details):
    diff = '' if got == want else f"{''}: {got!r} != {want!r}"
    if not diff:
        return None
    return _mismatch(prop, check, where, f'{what} differs after the load: {diff}', **details)

def _check_optimizer(prop, observations):
    for rank, obs in enumerate(observations):
        failure = _exact(prop, 'optimizer', 'save', f"rank {rank}'s local optimizer state (FSDP1, one layout)", _holding_elements(obs['loaded']['optimizer_local']), _holding_elements(obs['saved']['optimizer_local']))
        if failure is not None:
            return failure

def _holding_elements(local):
    return {name: entry for name, entry in local.items() if not any((v == [] for v in entry))}

def attempt(rank, world_size):
    ctx__meshes = {}
    import json
    t = Training()
    path = os.path.join('/tmp/shardfuzz-dcp-3246', 'bc6a61957b78-0')
    x = torch.randn(world_size, 2, dtype=torch.float64)
    y = torch.randn(world_size, 2)
    step_ = [(x[rank:rank + 1], y[rank:rank + 1])]
    comp = Composition()
    model = nn.Sequential(PointwiseConv1d(2, 2, kernel_size=1)).to(torch.float64)
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    strategy = ShardingStrategy.HYBRID_SHARD
    shape = (2, 2)
    from torch.distributed.device_mesh import init_device_mesh
    key = ()
    ctx__meshes[key] = init_device_mesh(torch.device('cpu').type, shape)
    RankContext_mesh_out = ctx__meshes[key]
    wrap_out = FSDP(model, sharding_strategy=strategy, device_id=torch.device('cpu'), use_orig_params=True, device_mesh=RankContext_mesh_out)
    composed = Composed(model=wrap_out)
    src = Side(composed=composed, comp=comp, training=t)
    params = list(wrap_out.parameters())
    src.opt = torch.optim.Adam(params)
    src.param_names = {id(p): clean_name() for n__, p in wrap_out.named_parameters()}
    from torch.distributed.fsdp import ShardedOptimStateDictConfig, ShardedStateDictConfig, StateDictType
    FSDP.set_state_dict_type(wrap_out, StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig(), ShardedOptimStateDictConfig())
    data_ = [step_[0]][:1]
    x_, y_ = next(iter(data_))
    loss = F.mse_loss(wrap_out(x_).to(y_.dtype), y_)
    loss.backward()
    src.opt.step()
    out = {}
    osd_ = FSDP.optim_state_dict(wrap_out, src.opt)
    out[DcpItem.OPTIMIZER] = osd_
    state = {(DcpItem.MODEL, DcpItem.OPTIMIZER)[i].value: out[(DcpItem.MODEL, DcpItem.OPTIMIZER)[i]] for i in (1,) if (DcpItem.MODEL, DcpItem.OPTIMIZER)[i] in out}
    import torch.distributed.checkpoint as dcp
    dcp.save(state, checkpoint_id=path)
    out_ = {}
    saved = {**observe(src), **out_}
    comp_ = Composition()
    model_ = nn.Sequential(PointwiseConv1d(2, 2, kernel_size=1)).to(torch.float64)
    strategy_ = ShardingStrategy.HYBRID_SHARD
    key_ = ()
    RankContext_mesh_out_ = ctx__meshes[key_]
    wrap_out_ = FSDP(model_, sharding_strategy=strategy_, device_id=torch.device('cpu'), use_orig_params=True, device_mesh=RankContext_mesh_out_)
    composed_ = Composed(model=wrap_out_)
    tgt = Side(composed=composed_, comp=comp_, training=t)
    params_ = list(wrap_out_.parameters())
    tgt.opt = torch.optim.Adam(params_)
    tgt.param_names = {id(p_): clean_name() for n___, p_ in wrap_out_.named_parameters()}
    FSDP.set_state_dict_type(wrap_out_, StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig(), ShardedOptimStateDictConfig())
    from torch.distributed.checkpoint.optimizer import load_sharded_optimizer_state_dict
    loaded = load_sharded_optimizer_state_dict(model_state_dict=wrap_out_.state_dict(), optimizer_key='optimizer', storage_reader=dcp.FileSystemReader(path))
    osd = loaded['optimizer']
    tgt.opt.load_state_dict(FSDP.optim_state_dict_to_load(wrap_out_, tgt.opt, osd))
    out__ = {}
    obs__ = {'saved': saved, 'loaded': {**observe(tgt), **out__}}
    obs = json.loads(json.dumps(obs__))
    outs = [None, None, None, None]
    dist.all_gather_object(outs, obs)
    if rank != 0:
        return ''
    reports = tuple((o for r, o in enumerate(outs)))
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
    import torch.distributed as dist
    dist.init_process_group('gloo')
    verdict = attempt(dist.get_rank(), dist.get_world_size())
    if verdict:
        sys.stdout.write(verdict + '\n')
        sys.stdout.flush()
    os._exit(1 if verdict.startswith('REPRODUCED') else 0)
if __name__ == '__main__':
    main()
