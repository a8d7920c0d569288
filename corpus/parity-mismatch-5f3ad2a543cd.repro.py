#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=f1aad34c9feef555 sources=9b23fb50ee8d6024 seconds=268.4
"""Reproduces shardfuzz corpus entry parity-mismatch-5f3ad2a543cd.json: mismatch:parity@fsdp2:unfrozen-unresharded

Observed: FSDP2: a frozen fully_shard unit with reshard_after_forward=False under a replicate'd
root is never resharded (its output needs no gradient, so no post-backward runs); the sharded
parameter the optimizer holds, unfrozen later, never trains. Same root cause as parity-
mismatch-e887f758b809. Torch-only reproducer: docs/known_bugs.md. (rank 0 gradient norm at step
1 is 0.9281261466533012, expected 1.2408355322824975)
Known torch bug: a frozen fully_shard unit without resharding under a replicate'd root is never
resharded: a leaf unfrozen later never trains (KeyError in get_optimizer_state_dict); upstream:
none found.
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

class LeafKind(str, enum.Enum):
    LINEAR = 'linear'
    LAYER_NORM = 'layer_norm'
    CONV1D = 'conv1d'
    RELU = 'relu'
    TANH = 'tanh'
    GELU = 'gelu'
    DROPOUT = 'dropout'

class Dtype(str, enum.Enum):
    FLOAT32 = 'float32'
    FLOAT64 = 'float64'
    BFLOAT16 = 'bfloat16'
    FLOAT16 = 'float16'
PARAM_LEAVES = frozenset({LeafKind.LINEAR, LeafKind.LAYER_NORM, LeafKind.CONV1D})

@dataclass(frozen=True)
class Leaf:
    kind: object
    bias: object = True
    frozen: object = False

@dataclass()
class Block:
    children: object

def iter_paths(block):
    i, child = next(iter(enumerate(block.children)))
    path = str(i)
    yield (path, child)

def owns_params(node):
    if isinstance(node, Leaf):
        return node.kind in PARAM_LEAVES
    return node.scale

@dataclass()
class ModuleTree:
    width: object
    root: object

    def paths(self):
        return dict(iter_paths(self.root))

def contains(outer, path):
    return outer == path or outer == '' or path.startswith(outer + '.')

def is_ancestor(ancestor, path):
    return ancestor != path and contains(ancestor, path)

@dataclass()
class ShardSpec:
    path: object
    group: object = ()
    ignored: object = ()

    @property
    def paths(self):
        return (self.path, *self.group)

@dataclass()
class ReplicateOptions:
    ignored_modules: object = ()

@dataclass()
class Composition:
    shards: object = ()
    replicates: object = ()
    checkpoints: object = ()
    tp_size: object = 1
    replicate_options: object = field(default_factory=ReplicateOptions)

    @property
    def sharded_paths(self):
        return [p for spec in self.shards for p in spec.paths]

    @property
    def shard_ignored(self):
        return frozenset((p for spec in self.shards for p in spec.ignored))

    def steps(self):
        items = [() for p in self.checkpoints] + [('replicate', p) for p in self.replicates]
        items += [('fully_shard', spec.path) for spec in self.shards]
        return sorted(items)

@dataclass()
class Unfreeze:
    path: object
    step: object

@dataclass(frozen=True)
class Training:
    lr: object = 0.1
    steps: object = 2
    batch_per_rank: object = 2
    dtype: object = Dtype.FLOAT32
    same_input: object = False
    skips: object = ()
    unfreeze: object = ()

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

    @cached_property
    def member_paths(self):
        return tuple((m for u in self.units for m in u.members))

    def member_of(self, path, api=None):
        best = None
        members = self.member_paths if api is None else [m for u in self.units if u.api == api for m in u.members]
        for m in members:
            if contains(m, path) and (best is None or is_ancestor(best, m)):
                best = m
        return best

    def unit_of(self, path):
        member = self.member_of(path)
        return next((u for u in self.units if member in u.members))

    def owned_by(self, unit, member=None):
        out = []
        for path, node in self.paths.items():
            if owns_params(node) and self.member_of(path) in (unit.members if member is None else (member,)):
                out.append(path)
        return out

    def local(self):
        ignored = self.comp.replicate_options.ignored_modules
        by_shards = self.comp.shard_ignored
        return [p for p, n in self.paths.items() if owns_params(n) and (any((contains(i, p) for i in ignored)) or p in by_shards) and (self.member_of(p) is None)]

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

def fsdp_sharded():
    return False

def build_node(node, width):
    if isinstance(node, Leaf):
        module = nn.Linear(width, width)
        if node.frozen:
            module.requires_grad_(False)
        return module
    return nn.Sequential(*[build_node(c, width) for c in node.children])

def build_model(tree):
    return build_node(tree.root, tree.width)
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
        for n, p in self.model.named_parameters():
            out[clean_name(n)] = (p.full_tensor() if isinstance(p, DTensor) else p).detach()
        yield out

class _Contracts:

    def __init__(self, model, comp):
        self.model = model
        self.comp = comp
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
        spec = next(iter(self.comp.shards))
        path = next(iter(spec.paths))
        model = self.model
        root = model.get_submodule(path)
        iter_paths_of_out = [(f'{path}.{n}' if path and n else n or path, m) for n, m in root.named_modules()]
        sub, _ = next(iter(iter_paths_of_out))
        mod = self.model.get_submodule(sub)
        flags = [fsdp_sharded() for p in mod.parameters()]
        state[spec.path] = flags
        return {'sharded_after_forward': state, 'leaf_dtypes': self.leaf_dtypes, 'output_dtypes': self.output_dtypes}

def train(case, tree, training, comp, ctx, tp_size=1, local=frozenset()):
    dtype = TORCH_DTYPES[training.dtype]
    if comp is not None:
        seed = case.seed
        torch.manual_seed(seed)
        model___ = build_model(tree).to(dtype)
        from torch.distributed._composable import replicate as replicate_
        specs = {s_.path: s_ for s_ in comp.shards}
        for api, path__ in comp.steps():
            if api == 'fully_shard':
                spec = specs[path__]
                from torch.distributed.fsdp import fully_shard
                kwargs = {}
                modules = [model___.get_submodule(p______) for p______ in spec.paths]
                fully_shard(modules if spec.group else modules[0], **kwargs)
            else:
                kwargs_ = {}
                replicate_kwargs_out = kwargs_
                replicate_(model___.get_submodule(path__), **replicate_kwargs_out)
        compose_out = Composed(model=model___)
        model = model___
        composed = compose_out
    else:
        torch.manual_seed(case.seed)
        model = build_model(tree).to(dtype)
        composed = Composed(model)
    contracts = _Contracts(model, comp) if comp is not None else None
    obs = {}
    model_ = composed.model
    out___ = {u_.path: [] for u_ in training.unfreeze}
    for name, p_ in model_.named_parameters():
        owner = '.'.join((c for c in clean_name(name).split('.')[:-1] if c.isdigit()))
        if owner in out___:
            out___[owner].append(p_)
    params = composed.model.parameters()
    opt = torch.optim.SGD(params, lr=training.lr)
    forward = _compiled(composed.model) if comp is not None else composed.model
    losses = []
    params_per_step = []
    grad_norms = []
    width = tree.width
    gen = torch.Generator().manual_seed(case.seed)
    b = training.batch_per_rank
    lo = 0 if training.same_input else ctx.rank // tp_size * b
    out_ = []
    for _ in range(training.steps):
        x_ = torch.randn(ctx.world_size * b, width, generator=gen)
        y_ = torch.randn(ctx.world_size * b, width, generator=gen)
        step_ = [(x_[lo:lo + b].to(ctx.device), y_[lo:lo + b].to(ctx.device))]
        out_.append(step_)
    for s, step in enumerate(out_):
        for path in [u.path for u in training.unfreeze if u.step == s]:
            for p in out___[path]:
                p.requires_grad_(True)
        i, (x, y) = next(iter(enumerate(step)))
        skipped = training.skipped_at(s, i)
        out = forward(x)
        if contracts is not None and comp is not None:
            obs['contracts'] = contracts.after_forward(skipped)
            obs['contracts']['output_dtype'] = str(out.dtype).removeprefix('torch.')
            from torch.distributed._composable import replicate
            out__ = {}
            path_ = next(iter(comp.replicates))
            state = replicate.state(model.get_submodule(path_))
            out__[path_] = sorted(getattr(state, '_param_names', []))
            obs['contracts']['replicate_params'] = out__
        loss = F.mse_loss(out.to(y.dtype), y)
        loss.backward()
        step_losses = [loss.item()]
        if comp is None and None is None:
            for name_, p__ in model.named_parameters():
                if p__.grad is not None and name_.rpartition('.')[0] not in local:
                    dist.all_reduce(p__.grad)
                    p__.grad /= ctx.world_size
        from torch.distributed.tensor import DTensor
        total = torch.zeros((), dtype=torch.float64)
        for p___ in composed.model.parameters():
            if p___.grad is not None:
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
    model__ = composed.model
    local_ = frozenset() if comp is None else frozenset(Layout(tree, comp).local())
    from torch.distributed.tensor import DTensor as DTensor_
    obs['local_params'] = {n_: p____.detach().double().cpu().flatten().tolist() for n_, p____ in model__.named_parameters() if not isinstance(p____, DTensor_) and (not n_.startswith('_fsdp_wrapped_module')) and ('_fsdp' not in n_) and (clean_name(n_).rpartition('.')[0] not in local_)}
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
    first = observations[0]
    updated = 0 if before_first_update else judged
    for step, (got_params, want_params) in enumerate(zip(first['params'][:updated], first['ref']['params'][:updated])):
        for name, want in want_params.items():
            bad = first_mismatch(got_params[name], want, tol)
    return None

def check_replicas(prop, observations):
    base = observations[0]['local_params']
    for rank, obs in enumerate(observations[1:], start=1):
        for name, values in base.items():
            pass
    return None

def check_contracts(prop, comp, tree, contracts):
    for spec in comp.shards:
        flags = contracts['sharded_after_forward'].get(spec.path, [])
        raf = comp.reshard_after_forward(spec)
    delayed = contracts.get('delayed') or []
    ignored = contracts.get('ignored') or []
    for path, names in contracts.get('replicate_params', {}).items():
        expected = sorted(_replicated_names(tree, comp, path))
    return None

def check_knobs(prop, observations):
    for rank, obs in enumerate(observations):
        for run in (obs, obs.get('ref', {})):
            problems = run.get('knob_problems') or []
    return None

def _replicated_names(tree, comp, path):
    layout = Layout(tree, comp)
    names = []
    for sub in layout.owned_by(layout.unit_of(path) or Unit('replicate', -1, (path,)), path):
        node = layout.paths[sub]
        rel = sub[len(path) + 1:] if path and sub != path else '' if sub == path else sub
        prefix = f'{rel}.' if rel else ''
        if isinstance(node, Leaf):
            names.append(prefix + 'weight')
            if node.bias:
                names.append(prefix + 'bias')
    return names

def _tolerance(training):
    return tolerance_for(training.dtype.value)

def judge_parity(case, outcome):
    body = case.body
    assert isinstance(body, ParityBody)
    obs = outcome.observations
    failure = check_knobs(case.property, obs) or compare_runs(case.property, obs, _tolerance(body.training), 'fsdp2:unfrozen-unresharded') or check_replicas(case.property, obs)
    if failure is None and 'contracts' in obs[0]:
        failure = check_contracts(case.property, body.composition, body.tree, obs[0]['contracts'])
    return failure

def attempt(rank, world_size):
    case = Case(property='parity', world_size=2, seed=1, body=ParityBody(tree=ModuleTree(width=4, root=Block(children=(Leaf(kind=LeafKind.LINEAR),))), composition=Composition(replicates=('',))))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import json
    tp = Composition().tp_size
    comp = Composition(shards=(ShardSpec(path='0'),), replicates=('',))
    composed = train(case, ModuleTree(width=4, root=Block(children=(Leaf(kind=LeafKind.LINEAR, frozen=True), Leaf(kind=LeafKind.LINEAR)))), Training(unfreeze=(Unfreeze(path='0', step=1),)), comp, ctx, tp)
    keys = ('losses', 'params', 'grad_norms')
    reference = train(case, ModuleTree(width=4, root=Block(children=(Leaf(kind=LeafKind.LINEAR, frozen=True), Leaf(kind=LeafKind.LINEAR)))), Training(unfreeze=(Unfreeze(path='0', step=1),)), None, ctx, tp)
    run_parity_out = {**composed, 'ref': {k: reference[k] for k in keys if k in reference}}
    obs = json.loads(json.dumps(run_parity_out))
    outs = [None] * world_size
    dist.all_gather_object(outs, obs)
    if rank != 0:
        return ''
    reports = tuple((RankReport(rank=r, observation=o) for r, o in enumerate(outs)))
    failure = judge_parity(case, Outcome(kind=OutcomeKind.OK, ranks=reports, seconds=0.0))
    if failure is not None and failure.signature in ['mismatch:parity@fsdp2:shard1:unfrozen-unresharded', 'mismatch:parity@fsdp2:unfrozen-unresharded']:
        import hashlib
        observed = hashlib.sha256(json.dumps(outs, sort_keys=True).encode()).hexdigest()[:16]
        return f'REPRODUCED {failure.signature}: observations {observed}: {failure.summary}'
    return f'PASS or another failure: {failure and failure.signature}'

def main():
    import os
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
