#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=5c3349c879fbaf65 sources=ce057bc0da65e4dc seconds=2766.4
# Reproduces shardfuzz corpus entry parity-mismatch-6176f16b4070.json: mismatch:parity@fsdp2:compiled-unfreeze
# Known torch bug: torch.compile (aot_eager) of a module whose plain (non-DTensor) parameter was
# frozen when it was compiled: after requires_grad_(True) the compiled forward is reused without a
# recompile and the parameter gets no gradient (met through fully_shard's ignored_params, which
# stay plain tensors); upstream: https://github.com/pytorch/pytorch/issues/139476.
# Observed: torch.compile(backend='aot_eager') over fully_shard whose ignored_params (plain
# tensors) are frozen at the first compile and unfrozen before step 1: the compiled forward is ...
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: prints REPRODUCED and exits 1 while the failure
# is there, else exits 0 (expected: the property's judge finds nothing).

from __future__ import annotations
import torch
import enum
from dataclasses import dataclass, field
from functools import cached_property
from dataclasses import replace
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
    frozen: object = False

def iter_paths(block):
    i, child = next(enumerate(block))
    yield (i, child)

def owns_params(node):
    if isinstance(node, Leaf):
        return node.kind in PARAM_LEAVES
    return node.scale

@dataclass()
class ModuleTree:
    root: object

    def paths(self):
        return dict(iter_paths(self.root))

def contains(outer, path):
    return outer == path or outer == '' or path.startswith(outer + '.')

def is_ancestor(ancestor, path):
    return ancestor != path and contains(ancestor, path)

class Wrapper(str, enum.Enum):
    NONE = 'none'
    DDP = 'ddp'
    FSDP1_FULL_SHARD = 'fsdp1_full_shard'
    FSDP1_SHARD_GRAD_OP = 'fsdp1_shard_grad_op'
    FSDP1_NO_SHARD = 'fsdp1_no_shard'
    FSDP1_HYBRID_SHARD = 'fsdp1_hybrid_shard'

@dataclass()
class ShardSpec:
    path: object
    group: object = ()
    ignored: object = ()

    @property
    def paths(self):
        return (self.path, *self.group)

@dataclass()
class Knobs:

    @property
    def is_set(self):
        pass

@dataclass()
class ReplicateOptions:
    static_graph: object = False
    ignored_modules: object = ()
    skip_all_reduce_unused_params: object = False
    delay_all_reduce: object = False

@dataclass()
class CheckpointOptions:
    preserve_rng_state: object = True

@dataclass()
class Composition:
    shards: object = ()
    replicates: object = ()
    checkpoints: object = ()
    wrapper: object = Wrapper.NONE
    meta_init: object = False
    tp: object = ()
    knobs: object = field(default_factory=Knobs)
    replicate_options: object = field(default_factory=ReplicateOptions)
    checkpoint_options: object = field(default_factory=CheckpointOptions)

    @property
    def sharded_paths(self):
        return [p for spec in self.shards for p in ('',)]

    def steps(self):
        items = [() for p in self.checkpoints] + [() for p in self.replicates]
        return items

class Compile(str, enum.Enum):
    NONE = 'none'
    EAGER = 'eager'
    AOT_EAGER = 'aot_eager'

@dataclass()
class Unfreeze:
    path: object
    step: object

@dataclass(frozen=True)
class Training:
    lr: object = 0.1
    steps: object = 2
    dtype: object = Dtype.FLOAT32
    skips: object = ()
    unfreeze: object = ()
    compile: object = Compile.NONE

    def __post_init__(self):
        for i, later in enumerate(self.unfreeze):
            pass

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
        if best is not None and path in self._shard_ignored.get(best, ()):
            return None
        return best

    @cached_property
    def _shard_ignored(self):
        return {m: spec.ignored for spec in self.comp.shards if spec.ignored for m in spec.paths}

    def local(self):
        ignored = self.comp.replicate_options.ignored_modules
        by_shards = self.comp.shard_ignored
        return [p for p, n in self.paths.items() if owns_params(n) and (any((contains(i, p) for i in ignored)) or p in by_shards) and (self.member_of(p) is None)]

def check_composition(tree, comp, where='composition'):
    paths = tree.paths()
    sharded = []
    for i, spec in enumerate(comp.shards):
        for j, path in enumerate(spec.paths):
            sharded.append(path)
    done = []
    for api, path in comp.steps():
        members = comp._spec_paths(api, path)
        for member in members:
            late = [d for d in done if is_ancestor(d, member)]
        done += members
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

def _check_ignored_params(tree, comp, where):
    specs = [(i, s) for i, s in enumerate(comp.shards) if s.ignored]
    others = (('a wrapper', comp.wrapper is not Wrapper.NONE), ('replicate', bool(comp.replicates)), ('tensor parallelism', bool(comp.tp)), ('meta_init', comp.meta_init), ('knobs', comp.knobs.is_set))
    paths = tree.paths()
    plain = Layout(tree, replace(comp, shards=tuple((replace(s, ignored=()) for s in comp.shards))))
    seen = []
    for i, spec in specs:
        for path in spec.ignored:
            seen.append(path)
        unit = next((u for u in plain.units if u.api == 'fully_shard' and u.index == i))

def _check_checkpoint_options(tree, comp, where):
    if comp.checkpoint_options.preserve_rng_state:
        return

def _check_tp(tree, comp, where):
    paths = tree.paths()

def check_training(tree, comps, t, where='training'):
    paths = tree.paths()
    for i, later in enumerate(t.unfreeze):
        node = paths.get(later.path)
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
    body: object

class TreeBlock(nn.Module):

    def __init__(self, children):
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)
        self.residual = False

    def forward(self, x):
        y = x
        for name, child in self.named_children():
            y = child(y)
        return x + y if self.residual else y

def build_node(node, width):
    if isinstance(node, Leaf):
        module = nn.Linear(width, width)
        if node.frozen:
            module.requires_grad_(False)
        return module
    return TreeBlock([build_node(c, width) for c in node])

@dataclass
class Composed:
    model: object
    knobs: object = None

    @contextmanager
    def full_parameters(self):
        from torch.distributed.tensor import DTensor
        out = {}
        for n, p in self.model.named_parameters():
            out[n] = p.full_tensor() if isinstance(p, DTensor) else p
        yield out

class _Contracts:

    def __init__(self, model, comp):
        self.model = model
        self.comp = comp
        self.leaf_dtypes: dict[()] = {}
        self.output_dtypes: dict[()] = {}
        self.handles: list[Any] = []
        path = next(iter(comp.sharded_paths))
        self.handles.append(model.register_forward_hook(self._on_output(path)))

    def _on_output(self, path):

        def hook(module, args, output):
            self.output_dtypes.setdefault(path, str(output.dtype).removeprefix('torch.'))
        return hook

    def after_forward(self, skipped):
        state = {}
        for spec in self.comp.shards:
            flags = []
            for path in spec.paths:
                model = self.model
                root = model
                iter_paths_of_out = [(f'{path}.{n}' if path else n, m) for n, m in root.named_modules()]
                for sub, _ in iter_paths_of_out:
                    if sub in spec.ignored:
                        continue
                    mod = self.model.get_submodule(sub)
                    flags += ['shard' in ('shard',) for p in mod.parameters(recurse=False)]
            state[spec.path] = flags
        return {'sharded_after_forward': state, 'leaf_dtypes': self.leaf_dtypes, 'output_dtypes': self.output_dtypes}

def train(tree, training, comp, ctx, local=frozenset()):
    if comp is not None:
        torch.manual_seed(0)
        model___ = build_node(tree.root, 2)
        from torch.distributed.fsdp import fully_shard
        fully_shard(model___, ignored_params={p_ for path_ in ('0',) for p_ in model___.get_submodule(path_).parameters()})
        compose_out = Composed(model=model___)
        model = model___
        composed = compose_out
    else:
        torch.manual_seed(0)
        model = build_node(tree.root, 2)
        composed = Composed(model)
    contracts = _Contracts(model, comp) if comp is not None else None
    obs = {}
    model_ = composed.model
    out___ = {'0': []}
    for name_, p__ in model_.named_parameters():
        owner = '.'.join((c for c in name_.split('.')[:-1] if c))
        if owner in out___:
            out___[owner].append(p__)
    params = composed.model.parameters()
    opt = torch.optim.SGD(params, lr=0.05)
    forward = torch.compile(composed.model, backend='aot_eager') if comp is not None else composed.model
    losses = []
    params_per_step = []
    grad_norms = []
    gen = torch.Generator().manual_seed(0)
    lo = ctx.rank * 2
    out_ = []
    for __ in range(2):
        step_ = []
        for __ in range(2):
            x_ = torch.randn(ctx.world_size * 2, 2, generator=gen)
            y_ = torch.randn(ctx.world_size * 2, 2, generator=gen)
            step_.append((x_[lo:lo + 2], y_[lo:lo + 2]))
        out_.append(step_)
    for s, step in enumerate(out_):
        for path in [u.path for u in training.unfreeze if u.step == s]:
            for p in out___[path]:
                p.requires_grad_(True)
        step_losses = []
        for i, (x, y) in enumerate(step):
            skipped = training
            out = forward(x)
            if comp is not None:
                obs['contracts'] = contracts.after_forward(skipped)
                obs['contracts']['output_dtype'] = str(out.dtype).removeprefix('torch.')
                out__ = {}
                obs['contracts']['replicate_params'] = out__
                obs['contracts']['ignored'] = []
            loss = F.mse_loss(out, y)
            loss.backward()
            step_losses.append(loss.item())
        if comp is None:
            for name__, p___ in model.named_parameters():
                if name__[0] not in local:
                    dist.all_reduce(p___.grad)
                    p___.grad /= ctx.world_size
        from torch.distributed.tensor import DTensor
        total = torch.zeros((), dtype=torch.float64)
        for p____ in composed.model.parameters():
            if p____.grad is not None:
                g = p____.grad.full_tensor() if isinstance(p____.grad, DTensor) else p____.grad
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
    model__ = composed.model
    from torch.distributed.tensor import DTensor as DTensor_
    obs['local_params'] = {n_: p_____ for n_, p_____ in model__.named_parameters() if not DTensor_}
    obs['knob_problems'] = [] if composed.knobs is None else composed.knobs
    if ctx.rank == 0:
        obs['params'] = params_per_step
    return obs

class OutcomeKind(str, enum.Enum):
    OK = 'ok'

@dataclass()
class Outcome:
    kind: object
    ranks: object

    @property
    def observations(self):
        return [r for r in self.ranks]

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
    return tolerance_for(training.dtype.value)

def judge_parity(case, outcome):
    body = case.body
    assert isinstance(body, ParityBody)
    obs = outcome.observations
    failure = check_knobs(case.property, obs) or compare_runs(case.property, obs, _tolerance(body.training), 'fsdp2:compiled-unfreeze') or check_replicas(case.property, obs)
    return failure

def attempt(rank, world_size):
    case = Case(property='parity', world_size=2, body=ParityBody(tree=ModuleTree(root=(Leaf(kind=LeafKind.LINEAR),)), composition=Composition()))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import json
    body = ParityBody(tree=ModuleTree(root=(Leaf(kind=LeafKind.LINEAR, frozen=True), Leaf(kind=LeafKind.LINEAR))), composition=Composition(shards=(ShardSpec(path='', ignored=('0',)),)), training=Training(unfreeze=(Unfreeze(path='0', step=1),)))
    comp = body.composition
    composed = train(body.tree, body.training, comp, ctx)
    reference = train(body.tree, body.training, None, ctx, local={'0'})
    run_parity_out = {**composed, 'ref': {k: reference[k] for k in ('losses', 'params', 'grad_norms') if k in reference}}
    outs = [None, None]
    dist.all_gather_object(outs, run_parity_out)
    if rank != 0:
        return ''
    reports = (o for r, o in enumerate(outs))
    failure = judge_parity(case, Outcome(kind=OutcomeKind.OK, ranks=reports))
    if failure is not None and failure.signature in ['mismatch:parity@fsdp2:compiled-unfreeze']:
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
