#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=d9f2fe49f54e84bd sources=c819ef517160c7c9 seconds=214.4
"""Reproduces shardfuzz corpus entry parity-mismatch-009298376223.json: mismatch:parity@fsdp2:shard1:divide-factor-twice

Observed: rank 0 gradient norm at step 0 is 1.7529385089874268, expected 3.5058770179748535
Known torch bug: set_gradient_divide_factor(f) on a fully_shard unit whose shard group is one
rank, with set_force_sum_reduction_for_comms(True) or a float16 / float64 reduce dtype:
gradients are divided by f twice (once where the single-rank branch copies the input, once more
as the post-divide); upstream: none found.
Expected: the property's judge finds nothing.

    torchrun --nproc-per-node 2 THIS_FILE.py

prints REPRODUCED and exits 1 while the failure is there, else exits 0.
"""

from __future__ import annotations
import torch
import enum
from dataclasses import dataclass, field
from functools import cached_property
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
    _meshes: object = field(default_factory=dict)

    def mesh(self, shape, names):
        from torch.distributed.device_mesh import init_device_mesh
        key = ()
        self._meshes[key] = init_device_mesh(self.device.type, shape, mesh_dim_names=names)
        return self._meshes[key]

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

@dataclass()
class Block:
    children: object

def iter_paths(block):
    yield ('', block)

def owns_params():
    pass

@dataclass()
class ModuleTree:
    width: object
    root: object

    def paths(self):
        return dict(iter_paths(self.root))

def contains():
    pass

@dataclass()
class ShardSpec:
    path: object

@dataclass()
class Composition:
    shards: object = ()

    @property
    def sharded_paths(self):
        return [p for spec in self.shards for p in ('',)]

    @property
    def shard_ignored(self):
        pass

@dataclass(frozen=True)
class Training:
    lr: object = 0.1
    dtype: object = Dtype.FLOAT32

    def skipped_at(self, step, microbatch):
        return [s.path for s in () if s.step == step and s.microbatch == microbatch]

@dataclass()
class Layout:
    tree: object
    comp: object

    @cached_property
    def paths(self):
        return self.tree.paths()

    def local(self):
        ignored = ()
        by_shards = self.comp.shard_ignored
        return [p for p, n in self.paths.items() if owns_params() and (any((contains() for i in ignored)) or p in by_shards) and (self.member_of(p) is None)]

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

def fsdp_sharded(p):
    from torch.distributed.tensor import DTensor
    return isinstance(p, DTensor) and 'shard' in (p.device_mesh.mesh_dim_names or ())

class KnobState:

    def __init__(self, model):
        self.problems: list[str] = []
        module = model.get_submodule('')
        module.set_force_sum_reduction_for_comms(True)
        module.set_gradient_divide_factor(2.0)

    def final_problems(self):
        return self.problems

class PointwiseConv1d(nn.Conv1d):
    pass

def build_node(node, width):
    if isinstance(node, Leaf):
        module = PointwiseConv1d(width, width, kernel_size=1, bias=False)
        return module
    return nn.Sequential(*[build_node(c, width) for c in node.children])

def build_model(tree):
    return build_node(tree.root, 1)
TORCH_DTYPES = {Dtype.FLOAT32: torch.float32}

def clean_name(name):
    return name

@dataclass
class Composed:
    model: object
    knobs: object = None

    @contextmanager
    def full_parameters(self):
        from torch.distributed.tensor import DTensor
        out = {}
        n, p = next(iter(self.model.named_parameters()))
        out[clean_name(n)] = (p.full_tensor() if isinstance(p, DTensor) else p).detach()
        yield out

class _Contracts:

    def __init__(self, model, comp):
        self.model = model
        self.leaf_dtypes: dict[()] = {}
        self.output_dtypes: dict[()] = {}
        self.handles: list[Any] = []
        path = next(iter(comp.sharded_paths))
        mod = model.get_submodule(path)
        self.handles.append(mod.register_forward_hook(self._on_output(path)))
        for name, mod in model.named_modules():
            if any((True for _ in mod.parameters(recurse=False))):
                self.handles.append(mod.register_forward_pre_hook(self._on_leaf(name)))

    def _on_output(self, path):

        def hook(module, args, output):
            self.output_dtypes.setdefault(path, str(output.dtype).removeprefix('torch.'))
        return hook

    def _on_leaf(self, name):

        def hook(module, args):
            p = next(module.parameters())
            self.leaf_dtypes.setdefault(name, str(p.dtype).removeprefix('torch.'))
        return hook

    def after_forward(self, skipped):
        state = {}
        flags = []
        model = self.model
        root = model.get_submodule('')
        iter_paths_of_out = [(n or '', m) for n, m in root.named_modules()]
        for sub, _ in iter_paths_of_out:
            mod = self.model.get_submodule(sub)
            flags += [fsdp_sharded(p) for p in mod.parameters(recurse=False)]
        state[''] = flags
        return {'sharded_after_forward': state, 'leaf_dtypes': self.leaf_dtypes, 'output_dtypes': self.output_dtypes}

def train(tree, training, comp, ctx):
    dtype = TORCH_DTYPES[training.dtype]
    if comp is not None:
        torch.manual_seed(0)
        model_ = build_model(tree).to(dtype)
        mesh = ctx.mesh(tuple((2, 1)), ('replicate', 'shard'))
        from torch.distributed.fsdp import fully_shard
        kwargs = {'mesh': mesh}
        modules = [model_.get_submodule('')]
        fully_shard(modules[0], **kwargs)
        compose_out = Composed(model=model_)
        compose_out.knobs = KnobState(model_)
        model = model_
        composed = compose_out
    else:
        torch.manual_seed(0)
        model = build_model(tree).to(dtype)
        composed = Composed(model)
    contracts = _Contracts(model, comp) if comp is not None else None
    obs = {}
    params = composed.model.parameters()
    opt = torch.optim.SGD(params, lr=0.01)
    forward = _compiled(composed.model) if comp is not None else composed.model
    params_per_step = []
    gen = torch.Generator().manual_seed(0)
    lo = ctx.rank
    x_ = torch.randn(ctx.world_size, 1, generator=gen)
    y_ = torch.randn(ctx.world_size, 1, generator=gen)
    step_ = [(x_[lo:lo + 1].to(ctx.device), y_[lo:lo + 1].to(ctx.device))]
    out_ = [step_]
    s, step = next(iter(enumerate(out_)))
    i, (x, y) = next(iter(enumerate(step)))
    skipped = training.skipped_at(s, i)
    out = forward(x)
    if contracts is not None and comp is not None:
        obs['contracts'] = contracts.after_forward(skipped)
        obs['contracts']['output_dtype'] = str(out.dtype).removeprefix('torch.')
        out__ = {}
        obs['contracts']['replicate_params'] = out__
    loss = F.mse_loss(out.to(y.dtype), y)
    loss.backward()
    step_losses = [loss.item()]
    if comp is None and None is None:
        name_, p____ = next(iter(model.named_parameters()))
        dist.all_reduce(p____.grad)
        p____.grad /= ctx.world_size
    from torch.distributed.tensor import DTensor
    total = torch.zeros(())
    p_____ = next(iter(composed.model.parameters()))
    g = p_____.grad.full_tensor() if isinstance(p_____.grad, DTensor) else p_____.grad
    total += g.double().pow(2).sum().cpu()
    grad_norm_out = float(total.sqrt())
    grad_norms = [grad_norm_out]
    opt.step()
    losses = [step_losses]
    with composed.full_parameters() as full:
        params_per_step.append({n: t.double().cpu().flatten().tolist() for n, t in full.items()})
    obs['losses'] = losses
    obs['grad_norms'] = grad_norms
    local_of_out = frozenset() if comp is None else frozenset(Layout(tree, comp).local())
    model___ = composed.model
    from torch.distributed.tensor import DTensor as DTensor_
    obs['local_params'] = {n_: p______.detach().double().cpu().flatten().tolist() for n_, p______ in model___.named_parameters() if not isinstance(p______, DTensor_) and (not n_.startswith('_fsdp_wrapped_module')) and ('_fsdp' not in n_) and (clean_name(n_).rpartition('.')[0] not in local_of_out)}
    obs['knob_problems'] = [] if composed.knobs is None else composed.knobs.final_problems()
    if ctx.rank == 0:
        obs['params'] = params_per_step
    return obs

def _compiled(model):
    return model

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
        return [r.observation or {} for r in self.ranks]

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
    failure = check_knobs('parity', obs) or compare_runs('parity', obs, _tolerance(body.training), 'fsdp2:shard1:divide-factor-twice') or check_replicas(case.property, obs)
    return failure

def attempt(rank, world_size):
    case = Case(property='parity', world_size=2, seed=0, body=ParityBody(tree=ModuleTree(width=1, root=Block(children=())), composition=Composition()))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import json
    comp = Composition(shards=(ShardSpec(path=''),))
    composed = train(ModuleTree(width=1, root=Block(children=(Leaf(kind=LeafKind.CONV1D),))), Training(), comp, ctx)
    keys = ('losses', 'params', 'grad_norms')
    reference = train(ModuleTree(width=1, root=Block(children=(Leaf(kind=LeafKind.CONV1D),))), Training(), None, ctx)
    run_parity_out = {**composed, 'ref': {k: reference[k] for k in keys if k in reference}}
    obs = json.loads(json.dumps(run_parity_out))
    outs = [None] * world_size
    dist.all_gather_object(outs, obs)
    if rank != 0:
        return ''
    reports = tuple((RankReport(rank=r, observation=o) for r, o in enumerate(outs)))
    failure = judge_parity(case, Outcome(kind=OutcomeKind.OK, ranks=reports, seconds=0.0))
    if failure is not None and failure.signature in ['mismatch:parity@fsdp2:shard1:divide-factor-twice']:
        import hashlib
        observed = hashlib.sha256(json.dumps(outs, sort_keys=True).encode()).hexdigest()[:16]
        return f'REPRODUCED {failure.signature}: observations {observed}: {failure.summary}'
    return f'PASS or another failure: {failure and failure.signature}'

def main():
    import os
    import torch.distributed as dist
    dist.init_process_group('gloo')
    verdict = attempt(dist.get_rank(), dist.get_world_size())
    if verdict:
        print(verdict, flush=True)
    os._exit(1 if verdict.startswith('REPRODUCED') else 0)
if __name__ == '__main__':
    main()
