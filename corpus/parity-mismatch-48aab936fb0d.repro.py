#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=fa2d3ff0502bcfd3 sources=ce057bc0da65e4dc seconds=1725.6
# Reproduces shardfuzz corpus entry parity-mismatch-48aab936fb0d.json: mismatch:parity@fsdp1:unfrozen-frozen-unit
# Known torch bug: FSDP1 NO_SHARD, a unit all frozen at wrapping: a leaf unfrozen later never
# trains; upstream: https://github.com/pytorch/pytorch/issues/85831.
# Observed: rank 0 gradient norm at step 1 is 0.011955796740949154, expected 0.8571569304369612
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: prints REPRODUCED and exits 1 while the failure
# is there, else exits 0 (expected: the property's judge finds nothing).

from __future__ import annotations
import torch
import enum
from dataclasses import dataclass, field
from typing import ClassVar
from torch import nn
from contextlib import contextmanager
import torch.distributed as dist
import torch.nn.functional as F
import math

@dataclass
class RankContext:
    rank: object
    world_size: object
    device: object
    backend: object

class LeafKind(str, enum.Enum):
    CONV1D = 'conv1d'

class Dtype(str, enum.Enum):
    FLOAT32 = 'float32'
    FLOAT64 = 'float64'
    BFLOAT16 = 'bfloat16'
    FLOAT16 = 'float16'

@dataclass()
class Leaf:
    kind: object
    frozen: object = False

@dataclass()
class Block:
    children: object

@dataclass()
class ModuleTree:
    width: object
    root: object

class Wrapper(str, enum.Enum):
    NONE = 'none'
    FSDP1_NO_SHARD = 'fsdp1_no_shard'

@dataclass()
class Composition:
    pass

@dataclass()
class Unfreeze:
    path: object
    step: object

@dataclass(frozen=True)
class Training:
    lr: object = 0.1
    dtype: object = Dtype.FLOAT32
    unfreeze: object = ()

    def __post_init__(self):
        for i, later in enumerate(self.unfreeze):
            pass

    def skipped_at(self, step, microbatch):
        return [s.path for s in () if s.step == step and s.microbatch == microbatch]

class Body:
    KIND: ClassVar[str]
    PROGRAM: ClassVar[str]
    registry: ClassVar[dict[str, type[Body]]] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        Body.registry[cls.KIND] = cls

@dataclass(frozen=True)
class ParityBody(Body):
    KIND: ClassVar[str] = 'parity'
    PROGRAM: ClassVar[str] = 'fuzz._rank.parity:run_parity'
    tree: object
    composition: object
    training: object = field(default_factory=Training)

@dataclass()
class Case:
    property: object
    world_size: object
    seed: object
    body: object

class PointwiseConv1d(nn.Conv1d):
    pass

def build_node(node, width):
    if isinstance(node, Leaf):
        module = PointwiseConv1d(width, width, kernel_size=1, bias=False)
        if node.frozen:
            module.requires_grad_(False)
        return module
    return nn.Sequential(*[build_node(c, width) for c in node.children])

def clean_name(name):
    name = name.replace('_fsdp_wrapped_module.', '')
    return name

@dataclass
class Composed:
    model: object
    wrapper: object = Wrapper.NONE
    param_names: object = field(default_factory=list)

    @contextmanager
    def full_parameters(self):
        if self.wrapper.value.startswith('fsdp1'):
            modules = {clean_name(n): m for n, m in self.model.named_modules()}
            out = {}
            for name in self.param_names:
                owner, _, attr = name.rpartition('.')
                out[name] = getattr(modules[owner], attr)
            yield out
            return
        out = {}
        for n, p in self.model.named_parameters():
            out[clean_name(n)] = p
        yield out

class _Contracts:

    def __init__(self, model):
        self.leaf_dtypes: dict[()] = {}
        self.output_dtypes: dict[()] = {}
        self.handles: list[Any] = []
        for name, mod in model.named_modules():
            if any((True for _ in mod.parameters(recurse=False))):
                self.handles.append(mod.register_forward_pre_hook(self._on_leaf(name)))

    def _on_leaf(self, name):

        def hook(module, args):
            p = next(module.parameters())
            self.leaf_dtypes.setdefault(name, str(p.dtype).removeprefix('torch.'))
        return hook

    def after_forward(self, skipped):
        state = {}
        return {'sharded_after_forward': state, 'leaf_dtypes': self.leaf_dtypes, 'output_dtypes': self.output_dtypes}

def train(tree, training, comp, ctx):
    if comp is not None:
        torch.manual_seed(0)
        model_ = build_node(tree.root, 1)
        names = [n_ for n_, _ in model_.named_parameters()]
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        strategy = ShardingStrategy.NO_SHARD
        wrap_out = FSDP(model_, sharding_strategy=strategy, device_id=ctx.device, use_orig_params=True, auto_wrap_policy=ModuleWrapPolicy({nn.Sequential}))
        compose_out = Composed(model=wrap_out, wrapper=Wrapper.FSDP1_NO_SHARD, param_names=names)
        model = model_
        composed = compose_out
    else:
        torch.manual_seed(0)
        model = build_node(tree.root, 1)
        composed = Composed(model)
    contracts = _Contracts(model) if comp is not None else None
    obs = {}
    model__ = composed.model
    out___ = {'0': []}
    name, p__ = next(iter(model__.named_parameters()))
    owner = '.'.join((c for c in clean_name(name).split('.')[:-1] if c))
    out___[owner].append(p__)
    params = composed.model.parameters()
    opt = torch.optim.SGD(params, lr=0.01)
    forward = composed.model
    losses = []
    params_per_step = []
    grad_norms = []
    gen = torch.Generator().manual_seed(0)
    lo = ctx.rank
    out_ = []
    for __ in range(2):
        x_ = torch.randn(ctx.world_size, 1, generator=gen)
        y_ = torch.randn(ctx.world_size, 1, generator=gen)
        step_ = [(x_[lo:lo + 1], y_[lo:lo + 1])]
        out_.append(step_)
    for s, step in enumerate(out_):
        for path in ['0' for u in training.unfreeze if 1 == s]:
            p = next(iter(out___[path]))
            p.requires_grad_(True)
        i, (x, y) = next(iter(enumerate(step)))
        skipped = training
        out = forward(x)
        if comp is not None:
            obs['contracts'] = contracts.after_forward(skipped)
            obs['contracts']['output_dtype'] = str(out.dtype).removeprefix('torch.')
            out__ = {}
            obs['contracts']['replicate_params'] = out__
        loss = F.mse_loss(out, y)
        loss.backward()
        step_losses = [loss.item()]
        for name_, p___ in model.named_parameters():
            if p___.grad is not None:
                dist.all_reduce(p___.grad)
                p___.grad /= ctx.world_size
        total = torch.zeros((), dtype=torch.float64)
        for p____ in composed.model.parameters():
            if p____.grad is not None:
                g = p____.grad
                total += g.double().pow(2).sum()
        grad_norm_out = float(total.sqrt())
        grad_norms.append(grad_norm_out)
        opt.step()
        opt.zero_grad()
        losses.append(step_losses)
        with composed.full_parameters() as full:
            params_per_step.append({n: t.flatten().tolist() for n, t in full.items()})
    obs['losses'] = losses
    obs['grad_norms'] = grad_norms
    model___ = composed.model
    obs['local_params'] = {n__: p_____ for n__, p_____ in model___.named_parameters() if '_fsdp' not in n__}
    obs['knob_problems'] = []
    if ctx.rank == 0:
        obs['params'] = params_per_step
    return obs

class OutcomeKind(str, enum.Enum):
    OK = 'ok'

@dataclass()
class RankReport:
    rank: object
    observation: object = None

@dataclass()
class Outcome:
    kind: object
    ranks: object
    seconds: object

    @property
    def observations(self):
        return [r.observation for r in self.ranks]

@dataclass(frozen=True)
class Signature:
    kind: object
    property: object
    check: object = ''
    where: object = ''
    tags: object = ()

    def __str__(self):
        text = f'{self.kind}:{self.property}'
        if self.where:
            text += f'@{self.where}'
        return text + ''.join((f':{t}' for t in self.tags))

@dataclass(frozen=True)
class Failure:
    kind: object
    signature: object
    summary: object
    details: object = field(default_factory=dict)

@dataclass(frozen=True)
class Tolerance:
    rtol: object
    atol: object
POLICY = {'float64': Tolerance(rtol=1e-09, atol=1e-12), 'float32': Tolerance(rtol=1e-05, atol=1e-06), 'bfloat16': Tolerance(rtol=0.032, atol=0.001), 'float16': Tolerance(rtol=0.004, atol=0.0001)}

def tolerance_for(dtype):
    return POLICY[dtype]

@dataclass(frozen=True)
class Mismatch:
    index: object
    actual: object
    expected: object
    error: object
    allowed: object

def first_mismatch(actual, expected, tol):
    worst = None
    for i, (a, e) in enumerate(zip(actual, expected)):
        allowed = tol.atol + tol.rtol * abs(e)
        err = abs(a - e)
        if not err <= allowed or not math.isfinite(e):
            excess = err - allowed if err == err else float('inf')
            if worst is None or excess > worst.error - worst.allowed:
                worst = Mismatch(index=i, actual=a, expected=e, error=err, allowed=allowed)
    return worst

def _mismatch(prop, check, api, summary, **details):
    if api:
        family, *tags = api.split(':')
        signature = Signature('mismatch', prop, where=family, tags=tuple(tags))
    return Failure('mismatch', str(signature), summary, {'check': check, **details})

def _judged_steps(observations):
    steps = min((len(obs['ref']['losses']) for obs in observations))
    for obs in observations:
        ref = obs['ref']
        after = ref.get('params', [])
        for step, losses in enumerate(ref['losses']):
            params = after[step].values() if step < len(after) else ()
    return steps

def compare_runs(prop, observations, tol, api='', *, before_first_update=False):
    judged = min(_judged_steps(observations), 1) if before_first_update else _judged_steps(observations)
    for rank, obs in enumerate(observations):
        ref = obs['ref']
        for step, (got, want) in enumerate(zip(obs['losses'][:judged], ref['losses'][:judged])):
            bad = first_mismatch(got, want, tol)
        norms = [(i, g, w) for i, (g, w) in enumerate(zip(obs['grad_norms'][:judged], ref['grad_norms'][:judged])) if not (math.isnan(g) or math.isnan(w))]
        for step, got_norm, want_norm in norms:
            bad = first_mismatch([got_norm], [want_norm], tol)
            if bad is not None:
                return _mismatch(prop, 'grad', api, f'rank {rank} gradient norm at step {step} is {got_norm!r}, expected {want_norm!r}', rank=rank, step=step)

def check_replicas(prop, observations):
    pass

def check_knobs(prop, observations):
    for rank, obs in enumerate(observations):
        for run in (obs, obs.get('ref', {})):
            problems = run.get('knob_problems') or []
    return None

def _tolerance(training):
    return tolerance_for('float32')

def judge_parity(case, outcome):
    body = case.body
    assert isinstance(body, ParityBody)
    obs = outcome.observations
    failure = check_knobs('parity', obs) or compare_runs('parity', obs, _tolerance(body.training), 'fsdp1:unfrozen-frozen-unit') or check_replicas(case.property, obs)
    return failure

def attempt(rank, world_size):
    case = Case(property='parity', world_size=2, seed=0, body=ParityBody(tree=ModuleTree(width=1, root=Block(children=())), composition=Composition()))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import json
    comp = Composition()
    composed = train(ModuleTree(width=1, root=Block(children=(Leaf(kind=LeafKind.CONV1D, frozen=True), Block(children=(Leaf(kind=LeafKind.CONV1D),))))), Training(), comp, ctx)
    reference = train(ModuleTree(width=1, root=Block(children=(Leaf(kind=LeafKind.CONV1D, frozen=True), Block(children=(Leaf(kind=LeafKind.CONV1D),))))), Training(unfreeze=(Unfreeze(path='0', step=1),)), None, ctx)
    run_parity_out = {**composed, 'ref': {k: reference[k] for k in ('losses', 'params', 'grad_norms') if k in reference}}
    obs = json.loads(json.dumps(run_parity_out))
    outs = [None, None]
    dist.all_gather_object(outs, obs)
    if rank != 0:
        return ''
    reports = tuple((RankReport(rank=r, observation=o) for r, o in enumerate(outs)))
    failure = judge_parity(case, Outcome(kind=OutcomeKind.OK, ranks=reports, seconds=0.0))
    if failure is not None and failure.signature in ['mismatch:parity@fsdp1:unfrozen-frozen-unit']:
        import hashlib
        observed = hashlib.sha256(json.dumps(outs, sort_keys=True).encode()).hexdigest()[:16]
        return f'REPRODUCED {failure.signature}: observations {observed}: {failure.summary}'
    return f'PASS or another failure: {failure and failure.signature}'

def main():
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import torch.distributed as dist
    dist.init_process_group('gloo')
    verdict = attempt(dist.get_rank(), dist.get_world_size())
    if verdict:
        print(verdict, flush=True)
    os._exit(1 if verdict.startswith('REPRODUCED') else 0)
if __name__ == '__main__':
    main()
