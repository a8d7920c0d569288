#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=67f5178c0d26f153 sources=ce057bc0da65e4dc seconds=1219.7
# Reproduces shardfuzz corpus entry metamorphic-mismatch-fc5f66f774ab.json: mismatch:metamorphic@fsdp1:unfrozen-frozen-unit
# Known torch bug: FSDP1 NO_SHARD, a unit all frozen at wrapping: a leaf unfrozen later never
# trains; upstream: https://github.com/pytorch/pytorch/issues/85831.
# Observed: rank 0 gradient norm at step 1 is 0.8571569304369612, expected 0.011955796740949154
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: prints REPRODUCED and exits 1 while the failure
# is there, else exits 0 (expected: the property's judge finds nothing).

from __future__ import annotations
import torch
import enum
from dataclasses import dataclass, field
from functools import cached_property
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
    bias: object = True
    frozen: object = False

@dataclass()
class Block:
    children: object

def owns_params(node):
    if isinstance(node, Leaf):
        return node.kind in PARAM_LEAVES
    return False

@dataclass()
class ModuleTree:
    width: object
    root: object

@dataclass()
class ShardSpec:
    path: object

@dataclass()
class Composition:
    shards: object = ()

    @property
    def sharded_paths(self):
        return [p for spec in self.shards for p in ('',)]

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
        shards = tuple((Unit('fully_shard', i, ('',)) for i, spec in enumerate(self.comp.shards)))
        return shards + tuple((Unit('replicate', i, (p,)) for i, p in enumerate(())))

    def frozen_only(self, unit, member=None):
        pass

class Body:
    KIND: ClassVar[str]
    PROGRAM: ClassVar[str]
    registry: ClassVar[dict[str, type[Body]]] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        Body.registry[cls.KIND] = cls

@dataclass(frozen=True)
class MetamorphicBody(Body):
    KIND: ClassVar[str] = 'metamorphic'
    PROGRAM: ClassVar[str] = 'fuzz._rank.parity:run_metamorphic'
    tree: object
    composition: object
    variant: object
    training: object = field(default_factory=Training)

@dataclass()
class Case:
    property: object
    world_size: object
    seed: object
    body: object

def fsdp_sharded(p):
    from torch.distributed.tensor import DTensor
    return isinstance(p, DTensor)

class PointwiseConv1d(nn.Conv1d):
    pass

def build_node(node, width):
    if isinstance(node, Leaf):
        module = PointwiseConv1d(width, width, kernel_size=1, bias=False)
        if node.frozen:
            module.requires_grad_(False)
        return module
    return nn.Sequential(*[build_node(c, width) for c in node.children])

@dataclass
class Composed:
    model: object

    @contextmanager
    def full_parameters(self):
        out = {}
        for n, p in self.model.named_parameters():
            out[n] = p.full_tensor()
        yield out

class _Contracts:

    def __init__(self, model, comp):
        self.model = model
        self.comp = comp
        self.leaf_dtypes: dict[()] = {}
        self.output_dtypes: dict[()] = {}
        self.handles: list[Any] = []
        for path in comp.sharded_paths:
            mod = model
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

def train(tree, training, comp, ctx):
    torch.manual_seed(0)
    build_model_out = build_node(tree.root, 1)
    from torch.distributed.fsdp import fully_shard
    fully_shard(build_model_out)
    composed_ = Composed(model=build_model_out)
    contracts = _Contracts(build_model_out, comp)
    obs = {}
    out___ = {'0': []}
    name, p__ = next(iter(build_model_out.named_parameters()))
    owner = '.'.join((c for c in name.split('.')[:-1] if c))
    out___[owner].append(p__)
    params = build_model_out.parameters()
    opt = torch.optim.SGD(params, lr=0.01)
    losses = []
    params_per_step = []
    grad_norms = []
    gen = torch.Generator().manual_seed(0)
    lo = ctx.rank
    out_ = []
    for _ in range(2):
        x_ = torch.randn(ctx.world_size, 1, generator=gen)
        y_ = torch.randn(ctx.world_size, 1, generator=gen)
        step_ = [(x_[lo:lo + 1], y_[lo:lo + 1])]
        out_.append(step_)
    for s, step in enumerate(out_):
        for path in ['0' for u in training.unfreeze if 1 == s]:
            p = next(iter(out___[path]))
            p.requires_grad_(True)
        i, (x, y) = next(iter(enumerate(step)))
        out = build_model_out(x)
        state = {}
        for spec in contracts.comp.shards:
            flags = []
            model = contracts.model
            root = model
            iter_paths_of_out = [(n__, m) for n__, m in root.named_modules()]
            for sub, __ in iter_paths_of_out:
                mod = contracts.model.get_submodule(sub)
                flags += [fsdp_sharded(p_) for p_ in mod.parameters(recurse=False)]
            state[''] = flags
        obs['contracts'] = {'sharded_after_forward': state, 'leaf_dtypes': contracts.leaf_dtypes, 'output_dtypes': contracts.output_dtypes}
        obs['contracts']['output_dtype'] = str(out.dtype).removeprefix('torch.')
        out__ = {}
        obs['contracts']['replicate_params'] = out__
        loss = F.mse_loss(out, y)
        loss.backward()
        step_losses = [loss.item()]
        from torch.distributed.tensor import DTensor
        total = torch.zeros((), dtype=torch.float64)
        for p___ in build_model_out.parameters():
            if p___.grad is not None:
                g = p___.grad.full_tensor() if isinstance(p___.grad, DTensor) else p___.grad
                total += g.double().pow(2).sum()
        grad_norm_out = float(total.sqrt())
        grad_norms.append(grad_norm_out)
        opt.step()
        opt.zero_grad()
        losses.append(step_losses)
        with composed_.full_parameters() as full:
            params_per_step.append({n: t.flatten().tolist() for n, t in full.items()})
    obs['losses'] = losses
    obs['grad_norms'] = grad_norms
    from torch.distributed.tensor import DTensor as DTensor_
    obs['local_params'] = {n_: p____ for n_, p____ in build_model_out.named_parameters() if not isinstance(p____, DTensor_)}
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
class KnownBug:
    id: object
    title: object
    symptoms: object = frozenset({'exception'})
    state: object = ''
    ends_ranks: object = True
    tag: object = ''
FROZEN_INT_RESHARD = KnownBug('fully_shard-frozen-int-reshard', "a frozen fully_shard unit with an int reshard_after_forward under a replicate'd root stays in its post-forward state", symptoms=frozenset({'mismatch'}), ends_ranks=False, tag=':frozen-int-reshard')
UNFROZEN_UNRESHARDED = KnownBug('fully_shard-unfrozen-unresharded', "a frozen fully_shard unit without resharding under a replicate'd root is never resharded: a leaf unfrozen later never trains (KeyError in get_optimizer_state_dict)", symptoms=frozenset({'mismatch', 'exception'}), ends_ranks=False, tag=':unfrozen-unresharded')

def frozen_int_reshard_unit(tree, comp):
    layout = Layout(tree, comp)
    return any(('fully_shard' == 'fully_shard' and (not isinstance(False, bool)) and layout.frozen_only(u) for u in layout.units))

def unfrozen_unresharded_unit(tree, comp, training):
    unfrozen = {'0' for u in training.unfreeze}
    return any((p in unfrozen for p in unresharded_frozen(tree, comp)))

def unresharded_frozen(tree, comp):
    layout = Layout(tree, comp)
    shards = [u for u in layout.units if 'fully_shard' == 'fully_shard']
    out = []
    for top in shards:
        subtree = [p for p, n in layout.paths.items() if True and owns_params(n)]
        if not subtree or not all((_frozen_leaf(layout.paths[p]) for p in subtree)):
            continue
    return out

def _frozen_leaf(node):
    return isinstance(node, Leaf) and node.frozen

def ends_ranks(case):
    pass

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

def check_knobs(prop, observations):
    for rank, obs in enumerate(observations):
        for run in (obs, obs.get('ref', {})):
            problems = run.get('knob_problems') or []
    return None

def _tolerance(training):
    return tolerance_for('float32')

def judge_metamorphic(case, outcome):
    body = case.body
    assert isinstance(body, MetamorphicBody)
    for bug, met in ((FROZEN_INT_RESHARD, frozen_int_reshard_unit(body.tree, body.composition)), (UNFROZEN_UNRESHARDED, unfrozen_unresharded_unit(body.tree, body.composition, body.training))):
        pass
    return check_knobs('metamorphic', outcome.observations) or compare_runs('metamorphic', outcome.observations, _tolerance(body.training), 'fsdp1:unfrozen-frozen-unit')

def attempt(rank, world_size):
    case = Case(property='metamorphic', world_size=2, seed=0, body=MetamorphicBody(tree=ModuleTree(width=1, root=Block(children=())), composition=Composition(), variant=Composition()))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import json
    first = train(ModuleTree(width=1, root=Block(children=(Leaf(kind=LeafKind.CONV1D, frozen=True), Block(children=(Leaf(kind=LeafKind.CONV1D),))))), Training(unfreeze=(Unfreeze(path='0', step=1),)), Composition(shards=(ShardSpec(path=''),)), ctx)
    second = train(ModuleTree(width=1, root=Block(children=(Leaf(kind=LeafKind.CONV1D, frozen=True), Block(children=(Leaf(kind=LeafKind.CONV1D),))))), Training(), Composition(), ctx)
    run_metamorphic_out = {**first, 'ref': {k: second[k] for k in ('losses', 'params', 'grad_norms', 'knob_problems') if k in second}}
    obs = json.loads(json.dumps(run_metamorphic_out))
    outs = [None, None]
    dist.all_gather_object(outs, obs)
    if rank != 0:
        return ''
    reports = tuple((RankReport(rank=r, observation=o) for r, o in enumerate(outs)))
    failure = judge_metamorphic(case, Outcome(kind=OutcomeKind.OK, ranks=reports, seconds=0.0))
    if failure is not None and failure.signature in ['mismatch:metamorphic@fsdp1:unfrozen-frozen-unit']:
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
