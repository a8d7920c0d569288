#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=8fe6d7b1f8b8192a sources=b2f61a16b7315ba5 seconds=8598.2
# Reproduces shardfuzz corpus entry dcp-mismatch-175e579ba153.json: mismatch:dcp@async_save:fsdp1-hsdp-load_sharded_optimizer_state_dict
# Known torch bug: load_sharded_optimizer_state_dict chunks optimizer state over the whole world:
# wrong Adam state in FSDP1 HYBRID_SHARD over a 2-D mesh; upstream: none found.
# Observed: Into FSDP1 HYBRID_SHARD over a 2-D mesh, load_sharded_optimizer_state_dict lays the
# optimizer state out as chunks over the whole world instead of the model's DTensors over the ...
# Run: torchrun --nproc-per-node 4 THIS_FILE.py: prints REPRODUCED and exits 1 while the failure
# is there, else exits 0 (expected: the property's judge finds nothing).

from __future__ import annotations
import torch
import enum
from dataclasses import dataclass, field
import os
from torch import nn
from contextlib import contextmanager
import torch.nn.functional as F
import torch.distributed as dist

class DcpItem(str, enum.Enum):
    MODEL = 'model'
    OPTIMIZER = 'optimizer'

class TreeBlock(nn.Module):

    def __init__(self, children, scale):
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)
        self.residual = False
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(12)) if scale else None

    def forward(self, x):
        y = x
        for name, child in self.named_children():
            y = child(y)
        if self.scale is not None:
            y = y * self.scale
        return x + y if self.residual else y

def clean_name(name):
    name = name.replace('_fsdp_wrapped_module.', '')
    return name

@dataclass
class Composed:
    model: object
    param_names: object = field()

    @contextmanager
    def full_parameters(self):
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        modules = {clean_name(n): m for n, m in self.model.named_modules()}
        with FSDP.summon_full_params(self.model):
            out = {}
            name = next(iter(self.param_names))
            owner, _, attr = name.rpartition('.')
            out[name] = getattr(modules[owner], attr)
            yield out
FSDP1_HSDP_SHARD1 = ':shard1'

@dataclass()
class Failure:
    kind: object
    signature: object
    summary: object
    details: object = field()

@dataclass()
class Tolerance:
    rtol: object
    atol: object
POLICY = {'float32': Tolerance(rtol=1e-05, atol=1e-06)}

def attempt(rank, world_size):
    path = os.path.join('/tmp/shardfuzz-dcp-3201', '48669d247974-0')
    lo = rank * 2
    out = []
    for _ in range(2):
        x = torch.randn(8, 12)
        y = torch.randn(8, 12)
        step_ = [(x[lo:lo + 2], y[lo:lo + 2])]
        out.append(step_)
    data = [step[0] for step in out]
    model = TreeBlock([TreeBlock([TreeBlock([], True)], False)], False)
    names = [n for n, __ in model.named_parameters()]
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    wrap_out = FSDP(model, device_id=torch.device('cpu'))
    composed = Composed(model=wrap_out, param_names=names)
    params = wrap_out.parameters()
    src_opt = torch.optim.SGD(params, momentum=0.9)
    from torch.distributed.fsdp import ShardedOptimStateDictConfig, ShardedStateDictConfig, StateDictType
    data__ = data[:1]
    x_, y_ = next(iter(data__))
    loss = F.mse_loss(wrap_out(x_), y_)
    loss.backward()
    src_opt.step()
    src_opt.zero_grad()
    out___ = {}
    out___[DcpItem.MODEL] = wrap_out.state_dict()
    osd_ = FSDP.optim_state_dict(wrap_out, src_opt)
    out___[DcpItem.OPTIMIZER] = osd_
    values = out___
    order = ((), (), (), (0, 1))[rank]
    state = {(DcpItem.MODEL, DcpItem.OPTIMIZER)[i].value: values[(DcpItem.MODEL, DcpItem.OPTIMIZER)[i]] for i in order}
    import torch.distributed.checkpoint as dcp
    writer_out = dcp.FileSystemWriter(path)
    result = dcp.async_save(state, storage_writer=writer_out)
    result.result()
    model_ = TreeBlock([TreeBlock([TreeBlock([], True)], False)], False)
    names_ = [n_ for n_, ___ in model_.named_parameters()]
    strategy_ = ShardingStrategy.HYBRID_SHARD
    from torch.distributed.device_mesh import init_device_mesh
    ctx__meshes_empty = init_device_mesh(torch.device('cpu').type, (2, 2))
    wrap_out_ = FSDP(model_, sharding_strategy=strategy_, device_id=torch.device('cpu'), device_mesh=ctx__meshes_empty)
    composed_ = Composed(model=wrap_out_, param_names=names_)
    params___ = wrap_out_.parameters()
    tgt_opt = torch.optim.SGD(params___)
    FSDP.set_state_dict_type(wrap_out_, StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig(), ShardedOptimStateDictConfig())
    out____ = {}
    out____[DcpItem.MODEL] = wrap_out_.state_dict()
    values = out____
    state = {'model': values[DcpItem.MODEL]}
    dcp.load(state, storage_reader=dcp.FileSystemReader(path))
    from torch.distributed.checkpoint.optimizer import load_sharded_optimizer_state_dict
    wrap_out_.load_state_dict(values[DcpItem.MODEL])
    loaded = load_sharded_optimizer_state_dict(model_state_dict=wrap_out_.state_dict(), optimizer_key='optimizer', storage_reader=dcp.FileSystemReader(path))
    osd = loaded['optimizer']
    tgt_opt.load_state_dict(FSDP.optim_state_dict_to_load(wrap_out_, tgt_opt, osd))
    obs__ = {}
    data_ = data[1:]
    x__, y__ = next(iter(data_))
    loss_ = F.mse_loss(wrap_out(x__), y__)
    loss_.backward()
    src_opt.step()
    with composed.full_parameters() as params_:
        out_ = {n__: [float(v) for v in t_] for n__, t_ in params_.items()}
    x___, y___ = next(iter(data_))
    loss__ = F.mse_loss(wrap_out_(x___), y___)
    loss__.backward()
    tgt_opt.step()
    obs_ = {}
    with composed_.full_parameters() as params__:
        out__ = {n___: [float(v_) for v_ in t__] for n___, t__ in params__.items()}
    obs_['final_source'], obs_['final_target'] = (out_, out__)
    obs__.update(obs_)
    outs = [None, None, None, None]
    dist.all_gather_object(outs, obs__)
    if rank != 0:
        return ''
    reports = (o for r, o in enumerate(outs))
    prop, observations = ('dcp', [r for r in reports])
    tol = POLICY['float32']
    first = observations[0]
    got_p, want_p = (first['final_target'], first['final_source'])
    name, want_v = next(iter(want_p.items()))
    actual = got_p.get(name, [])
    worst = None
    for i__, (a, e) in enumerate(zip(actual, want_v)):
        allowed = tol.atol + tol.rtol * e
        err = a - e
        if not err <= allowed:
            worst = i__
    bad_p = worst
    failure__ = Failure('mismatch', 'mismatch', '0.0.scale[11] is 1.1299751996994019 after resuming, uninterrupted 1.1296120882034302 (error 0.000363 > allowed 1.23e-05)', {}) if bad_p is not None else None
    failure = failure__ if failure__ is None or not failure__.signature.endswith(FSDP1_HSDP_SHARD1) else None
    if failure is not None:
        return f'REPRODUCED mismatch:dcp@async_save:fsdp1-hsdp-load_sharded_optimizer_state_dict: {failure.summary}'
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
