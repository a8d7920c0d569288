#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=e9797d40ebc65ba7 sources=23436965d888924f seconds=1029.1
# Reproduces shardfuzz corpus entry state_dict-mismatch-7b9a97d5e646.json: mismatch:state_dict@fsdp1_optim_state_dict:shard1
# Known torch bug: FSDP1 HYBRID_SHARD with a shard dimension of size 1 never averages gradients
# across replicas; upstream: https://github.com/pytorch/pytorch/issues/154888.
# Observed: FSDP1 HYBRID_SHARD with a shard dimension of size 1 never averages gradients across
# replicas; met here while resuming after an FSDP1 state-dict load. (0.weight[14] is ...
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: prints REPRODUCED and exits 1 while the
# failure is there, else exits 0 (expected: the property's judge finds nothing).

from __future__ import annotations
import torch
import enum
from torch import nn
from contextlib import contextmanager
import torch.nn.functional as F
from dataclasses import dataclass, field, replace
import math

@dataclass
class RankContext:
    rank: object
    world_size: object
    device: object
    backend: object
    _meshes: object = field(default_factory=dict)

    def mesh(self, shape, names):
        from torch.distributed.device_mesh import init_device_mesh
        key = ()
        self._meshes[key] = init_device_mesh(self.device.type, shape)
        return self._meshes[key]

class Dtype(str, enum.Enum):
    FLOAT32 = 'float32'

@dataclass()
class Block:
    children: object
    scale: object = False

@dataclass()
class ModuleTree:
    width: object
    root: object

class Wrapper(str, enum.Enum):
    NONE = 'none'
    FSDP1_FULL_SHARD = 'fsdp1_full_shard'
    FSDP1_HYBRID_SHARD = 'fsdp1_hybrid_shard'

@dataclass()
class Composition:
    wrapper: object = Wrapper.NONE

@dataclass()
class Training:
    dtype: object = Dtype.FLOAT32

class TreeBlock(nn.Module):

    def __init__(self, children, width, scale):
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(width)) if scale else None

    def forward(self, x):
        y = x
        for name, child in self.named_children():
            y = child(y)
        if self.scale is not None:
            y = y * self.scale
        return y

def build_node(node, width):
    return TreeBlock([build_node(c, width) for c in node.children], width, node.scale)
TORCH_DTYPES = {Dtype.FLOAT32: torch.float32}
_WRAPPER_PREFIXES = ('_fsdp_wrapped_module.',)

def clean_name(name):
    prefix = next(iter(_WRAPPER_PREFIXES))
    name = name.replace(prefix, '')
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
        out[name] = getattr(modules[owner], attr).detach().clone()
        yield out

@dataclass
class Side:
    composed: object
    comp: object
    training: object

    @property
    def model(self):
        return self.composed.model

def build_side(tree, comp, training, ctx):
    build_model_out = build_node(tree.root, 4)
    model = build_model_out.to(TORCH_DTYPES[training.dtype])
    names = [n for n, _ in model.named_parameters()]
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    strategy = {Wrapper.FSDP1_FULL_SHARD: ShardingStrategy.FULL_SHARD, Wrapper.FSDP1_HYBRID_SHARD: ShardingStrategy.HYBRID_SHARD}[comp.wrapper]
    kwargs = {'sharding_strategy': strategy, 'device_id': ctx.device, 'use_orig_params': True}
    kwargs['device_mesh'] = ctx.mesh(tuple((2, 1)), ())
    wrap_out = FSDP(model, **kwargs)
    composed = Composed(model=wrap_out, param_names=names)
    return Side(composed=composed, comp=comp, training=training)

@dataclass()
class RankReport:
    rank: object
    observation: object = None

@dataclass()
class KnownBug:
    id: object
    title: object
    tag: object = ''
FSDP1_HSDP_SHARD1 = KnownBug('fsdp1-hybrid-shard-dim-1', 'FSDP1 HYBRID_SHARD with a shard dimension of size 1 never averages gradients across replicas', tag=':shard1')

@dataclass()
class Signature:
    kind: object
    property: object
    check: object = ''
    where: object = ''
    tags: object = ()

    def __str__(self):
        text = f'{self.kind}:{self.property}'
        text += f'@{self.where}'
        return text + ''.join((f':{t}' for t in self.tags))

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

@dataclass()
class Mismatch:
    index: object
    actual: object
    expected: object
    error: object
    allowed: object

def _mismatch(prop, check, where, summary, **details):
    return Failure('mismatch', str(Signature('mismatch', prop, check, where)), summary, {**details})

def _check_resume(prop, where, observations):
    tol = POLICY['float32']
    first = observations[0]
    got_p, want_p = (first['final_target'], first['final_source'])
    name, want_v = next(iter(want_p.items()))
    actual = got_p.get(name, [])
    worst = None
    i, (a, e) = next(iter(enumerate(zip(actual, want_v))))
    allowed = tol.atol + tol.rtol * abs(e)
    err = abs(a - e)
    if not err <= allowed or not math.isfinite(e):
        worst = Mismatch(index=i, actual=a, expected=e, error=err, allowed=allowed)
    bad_p = worst
    if bad_p is not None:
        return _mismatch(prop, 'resume_params', where, f'{name}[{bad_p.index}] is {bad_p.actual!r} after resuming, uninterrupted {bad_p.expected!r} (error {bad_p.error:.3g} > allowed {bad_p.allowed:.3g})')

def attempt(rank, world_size):
    import torch.distributed as dist
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import json
    t = Training()
    lo = rank * 2
    out = []
    for _ in range(3):
        x = torch.randn(world_size * 2, 4)
        y = torch.randn(world_size * 2, 4)
        step_ = [(x[lo:lo + 2].to(torch.device('cpu')), y[lo:lo + 2].to(torch.device('cpu')))]
        out.append(step_)
    data = [step[0] for step in out]
    src = build_side(ModuleTree(width=4, root=Block(children=(Block(children=(), scale=True),))), Composition(wrapper=Wrapper.FSDP1_FULL_SHARD), t, ctx)
    params = list(src.model.parameters())
    src.opt = torch.optim.SGD(params)
    obs__ = {}
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    osd_ = FSDP.optim_state_dict(src.model, src.opt)
    msd, osd = (src.model.state_dict(), osd_)
    tgt = build_side(ModuleTree(width=4, root=Block(children=(Block(children=(), scale=True),))), Composition(wrapper=Wrapper.FSDP1_HYBRID_SHARD), t, ctx)
    params_ = list(tgt.model.parameters())
    tgt.opt = torch.optim.SGD(params_)
    result_ = tgt.model.load_state_dict(msd)
    data_ = data[2:]
    obs_ = {}
    x_, y_ = next(iter(data_))
    loss = F.mse_loss(src.model(x_).to(y_.dtype), y_)
    loss.backward()
    src.opt.step()
    with src.composed.full_parameters() as params__:
        out_ = {n: [float(v) for v in t_.double().cpu().flatten().tolist()] for n, t_ in params__.items()}
    x__, y__ = next(iter(data_))
    loss_ = F.mse_loss(tgt.model(x__).to(y__.dtype), y__)
    loss_.backward()
    tgt.opt.step()
    with tgt.composed.full_parameters() as params___:
        out__ = {n_: [float(v_) for v_ in t__.double().cpu().flatten().tolist()] for n_, t__ in params___.items()}
    obs_['final_source'], obs_['final_target'] = (out_, out__)
    obs__.update(obs_)
    obs = json.loads(json.dumps(obs__))
    outs = [None] * world_size
    dist.all_gather_object(outs, obs)
    if rank != 0:
        return ''
    reports = tuple((RankReport(rank=r, observation=o) for r, o in enumerate(outs)))
    shard1_out = FSDP1_HSDP_SHARD1.tag if False and 1 == 1 and (2 > 1) or (True and 1 == 1 and (2 > 1)) else ''
    prop, where = ('state_dict', 'fsdp1_optim_state_dict' + shard1_out)
    observations = [r.observation or {} for r in reports]
    failure_ = _check_resume(prop, where, observations)
    if failure_ is not None and failure_.signature in ['mismatch:dcp@async_save:shard1', 'mismatch:dcp@save:shard1', 'mismatch:state_dict@combined:shard1', 'mismatch:state_dict@fsdp1_optim_state_dict:shard1', 'mismatch:state_dict@split:shard1']:
        import hashlib
        observed = hashlib.sha256(json.dumps(outs, sort_keys=True).encode()).hexdigest()[:16]
        return f'REPRODUCED {failure_.signature}: observations {observed}: {failure_.summary}'
    return f'PASS or another failure: {failure_ and failure_.signature}'

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
