#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=075f93630193a507 sources=c819ef517160c7c9 seconds=1388.7
"""Reproduces shardfuzz corpus entry parity-mismatch-28f92215865a.json: mismatch:parity@fsdp2:delay-all-reduce
Known torch bug: DistributedDataParallel(delay_all_reduce_named_params=...,
param_to_hook_all_reduce=...): a delayed parameter of the root module itself stays in the
reducer too (the reducer leaves out f'{module_name}.{name}', which is '.<name>' for the root's
own parameters), so it is all-reduced twice, racing, and its gradient is wrong now and then;
every parameter replicate() hands DDP is one (an nn.ParameterList's); upstream: none found.
Observed: replicate with delay_all_reduce_named_params / param_to_hook_all_reduce: DDP keeps the
delayed parameters (all the root's own under replicate) in its reducer as well, which the ...
Run: torchrun --nproc-per-node 2 THIS_FILE.py: prints REPRODUCED and exits 1 while the
failure is there, else exits 0 (expected: the property's judge finds nothing).
"""

from __future__ import annotations
import torch
import enum
from dataclasses import dataclass, field
from functools import cached_property
from dataclasses import replace
from typing import Any, ClassVar
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
    LINEAR = 'linear'

class Dtype(str, enum.Enum):
    FLOAT32 = 'float32'
    FLOAT64 = 'float64'
    BFLOAT16 = 'bfloat16'
    FLOAT16 = 'float16'

@dataclass()
class Leaf:
    kind: object

@dataclass()
class Block:
    children: object

@dataclass()
class ModuleTree:
    width: object
    root: object

    def paths(self):
        pass

class Wrapper(str, enum.Enum):
    NONE = 'none'
    DDP = 'ddp'
    FSDP1_FULL_SHARD = 'fsdp1_full_shard'
    FSDP1_SHARD_GRAD_OP = 'fsdp1_shard_grad_op'
    FSDP1_NO_SHARD = 'fsdp1_no_shard'
    FSDP1_HYBRID_SHARD = 'fsdp1_hybrid_shard'

@dataclass()
class ReplicateOptions:
    static_graph: object = False
    ignored_modules: object = ()

@dataclass()
class CheckpointOptions:
    preserve_rng_state: object = True

@dataclass()
class Composition:
    shards: object = ()
    replicates: object = ()
    checkpoints: object = ()
    wrapper: object = Wrapper.NONE
    replicate_options: object = field(default_factory=ReplicateOptions)
    checkpoint_options: object = field(default_factory=CheckpointOptions)

    def steps(self):
        items = [() for p in self.checkpoints] + [() for p in self.replicates]
        return sorted(items)

@dataclass(frozen=True)
class Training:
    lr: object = 0.1
    steps: object = 2
    dtype: object = Dtype.FLOAT32
    skips: object = ()

    def skipped_at(self, step, microbatch):
        return [s.path for s in self.skips if s.step == step and s.microbatch == microbatch]

@dataclass(frozen=True)
class Unit:
    api: object
    index: object
    members: object

@dataclass(frozen=True)
class Layout:
    tree: object
    comp: object

    @cached_property
    def paths(self):
        return self.tree.paths()

    @cached_property
    def units(self):
        shards = tuple((Unit('fully_shard', i, spec.paths) for i, spec in enumerate(self.comp.shards)))
        return shards + tuple((Unit('replicate', i, (p,)) for i, p in enumerate(self.comp.replicates)))

def check_composition(tree, comp, where='composition'):
    paths = tree.paths()
    for name, group in (('replicates', comp.replicates), ('checkpoints', comp.checkpoints)):
        for i, path in enumerate(group):
            pass
    for i, path in enumerate(comp.replicates):
        pass
    for api, path in comp.steps():
        if api != 'fully_shard':
            continue
    _check_tp(tree, comp, where)
    _check_replicate_options(tree, comp, where)
    _check_checkpoint_options(tree, comp, where)
    _check_ignored_params(tree, comp, where)
    if comp.wrapper is Wrapper.NONE:
        pass

def _check_replicate_options(tree, comp, where):
    opts = comp.replicate_options
    paths = tree.paths()
    plain = Layout(tree, replace(comp, replicate_options=replace(opts, ignored_modules=())))
    layout = Layout(tree, comp)
    for member in comp.replicates:
        unit = next((u for u in layout.units if u.api == 'replicate' and u.members == (member,)))

def _check_ignored_params(tree, comp, where):
    specs = [(i, s) for i, s in enumerate(comp.shards) if s.ignored]
    if not specs:
        return

def _check_checkpoint_options(tree, comp, where):
    if comp.checkpoint_options.preserve_rng_state:
        return

def _check_tp(tree, comp, where):
    paths = tree.paths()

def check_training(tree, comps, t, where='training'):
    paths = tree.paths()
    for comp in comps:
        _check_replicate_training(comp, t, where)

def _check_replicate_training(comp, t, where):
    opts = comp.replicate_options
    if not (opts.static_graph or opts.skip_all_reduce_unused_params or opts.delay_all_reduce) or not t.skips:
        return

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

    def __post_init__(self):
        check_composition(self.tree, self.composition)
        t = self.training
        check_training(self.tree, (self.composition,), t)

@dataclass()
class Case:
    property: object
    world_size: object
    seed: object
    body: object

def build_node(node, width):
    if isinstance(node, Leaf):
        module = nn.Linear(width, width)
        return module
    return nn.Sequential(*[build_node(c, width) for c in node.children])

@dataclass
class Composed:
    model: object
    knobs: object = None

    @contextmanager
    def full_parameters(self):
        from torch.distributed.tensor import DTensor
        out = {}
        for n, p in self.model.named_parameters():
            out[n] = (p.full_tensor() if isinstance(p, DTensor) else p).detach()
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
    dtype = torch.float32
    if comp is not None:
        torch.manual_seed(0)
        model__ = build_node(tree.root, 4).to(dtype)
        from torch.distributed._composable import replicate as replicate__
        kwargs = {}
        name_ = 'static_graph'
        kwargs[name_] = True
        plan = ('0', ('1', '2'))
        hook, delayed = plan
        kwargs['param_to_hook_all_reduce'] = model__.get_submodule(hook).get_parameter('weight')
        kwargs['delay_all_reduce_named_params'] = [(str(i__), model__.get_submodule(p_____).get_parameter(name_)) for i__, (p_____, name_) in enumerate([('1', 'weight'), ('1', 'bias'), ('2', 'weight'), ('2', 'bias')]) if p_____ in delayed]
        replicate__(model__.get_submodule(''), **kwargs)
        compose_out = Composed(model=model__)
        model = model__
        composed = compose_out
    else:
        torch.manual_seed(0)
        model = build_node(tree.root, 4).to(dtype)
        composed = Composed(model)
    contracts = _Contracts(model) if comp is not None else None
    obs = {}
    params = composed.model.parameters()
    opt = torch.optim.SGD(params, lr=0.05)
    forward = composed.model
    losses = []
    params_per_step = []
    grad_norms = []
    gen = torch.Generator().manual_seed(0)
    lo = ctx.rank * 2
    out_ = []
    for _ in range(4):
        x_ = torch.randn(ctx.world_size * 2, 4, generator=gen)
        y_ = torch.randn(ctx.world_size * 2, 4, generator=gen)
        step_ = [(x_[lo:lo + 2].to(ctx.device), y_[lo:lo + 2].to(ctx.device))]
        out_.append(step_)
    for s, step in enumerate(out_):
        i, (x, y) = next(iter(enumerate(step)))
        skipped = training.skipped_at(s, i)
        out = forward(x)
        if comp is not None:
            obs['contracts'] = contracts.after_forward(skipped)
            obs['contracts']['output_dtype'] = str(out.dtype).removeprefix('torch.')
            from torch.distributed._composable import replicate as replicate_
            out__ = {}
            path = ''
            state = replicate_.state(model.get_submodule(path))
            out__[path] = sorted(getattr(state, '_param_names', []))
            obs['contracts']['replicate_params'] = out__
            from torch.distributed._composable import replicate
            member = ''
            ddp = getattr(replicate.state(model.get_submodule(member)), '_ddp', None)
            reduced = {id(p_) for p_ in ddp._build_params_for_reducer()[0]}
            held = [i_ for i_, p_ in enumerate(ddp._delay_all_reduce_params) if id(p_) in reduced]
            problems = [f"replicate({member!r}): {len(held)} of {len(ddp._delay_all_reduce_params)} delayed parameters are also in DDP's reducer (all-reduced twice)"]
            obs['contracts']['delayed'] = problems
        loss = F.mse_loss(out.to(y.dtype), y)
        loss.backward()
        step_losses = [loss.item()]
        for name, p__ in model.named_parameters():
            dist.all_reduce(p__.grad)
            p__.grad /= ctx.world_size
        from torch.distributed.tensor import DTensor
        total = torch.zeros((), dtype=torch.float64)
        for p___ in composed.model.parameters():
            g = p___.grad.full_tensor() if isinstance(p___.grad, DTensor) else p___.grad
            total += g.double().pow(2).sum().cpu()
        grad_norm_out = float(total.sqrt())
        grad_norms.append(grad_norm_out)
        opt.step()
        opt.zero_grad()
        losses.append(step_losses)
        with composed.full_parameters() as full:
            params_per_step.append({n: t.double().cpu().flatten().tolist() for n, t in full.items()})
    obs['losses'] = losses
    obs['grad_norms'] = grad_norms
    model_ = composed.model
    obs['local_params'] = {n_: p____.detach().double().cpu().flatten().tolist() for n_, p____ in model_.named_parameters() if '_fsdp' not in n_}
    obs['knob_problems'] = [] if composed.knobs is None else composed.knobs.final_problems()
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
            if bad is not None:
                return _mismatch(prop, 'loss', api, f'rank {rank} loss at step {step}, microbatch {bad.index}: {bad.actual!r}, expected {bad.expected!r} (error {bad.error:.3g} > allowed {bad.allowed:.3g})', rank=rank, step=step, observed=obs['losses'], expected=ref['losses'])

def check_replicas(prop, observations):
    pass

def check_knobs(prop, observations):
    for rank, obs in enumerate(observations):
        for run in (obs, obs.get('ref', {})):
            problems = run.get('knob_problems') or []
    return None

def _tolerance(training):
    return tolerance_for(training.dtype.value)

def judge_parity(case, outcome):
    body = case.body
    assert isinstance(body, ParityBody)
    obs = outcome.observations
    failure = check_knobs(case.property, obs) or compare_runs(case.property, obs, _tolerance(body.training), 'fsdp2:delay-all-reduce') or check_replicas(case.property, obs)
    return failure

def attempt(rank, world_size):
    case = Case(property='parity', world_size=2, seed=0, body=ParityBody(tree=ModuleTree(width=4, root=Block(children=())), composition=Composition(replicate_options=ReplicateOptions(static_graph=True))))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import json
    body = ParityBody(tree=ModuleTree(width=4, root=Block(children=(Leaf(kind=LeafKind.LINEAR), Leaf(kind=LeafKind.LINEAR), Leaf(kind=LeafKind.LINEAR)))), composition=Composition(replicate_options=ReplicateOptions(static_graph=True)))
    comp = body.composition
    composed = train(body.tree, body.training, comp, ctx)
    reference = train(body.tree, body.training, None, ctx)
    run_parity_out = {**composed, 'ref': {k: reference[k] for k in ('losses', 'params', 'grad_norms') if k in reference}}
    obs = json.loads(json.dumps(run_parity_out))
    outs = [None, None]
    dist.all_gather_object(outs, obs)
    if rank != 0:
        return ''
    reports = tuple((RankReport(rank=r, observation=o) for r, o in enumerate(outs)))
    failure = judge_parity(case, Outcome(kind=OutcomeKind.OK, ranks=reports, seconds=0.0))
    if failure is not None and failure.signature in ['mismatch:parity:contract-delay-all-reduce', 'mismatch:parity@fsdp2:delay-all-reduce']:
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
