#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=c33cc422d730720c sources=9b23fb50ee8d6024 seconds=270.3
"""Reproduces shardfuzz corpus entry metamorphic-mismatch-c39d139117c4.json: mismatch:metamorphic@fsdp1:shard1

Observed: 0.weight[1] after step 0 is -0.362216979265213, expected -0.32023686170578003 (error
0.042 > allowed 4.2e-06)
Known torch bug: FSDP1 HYBRID_SHARD with a shard dimension of size 1 never averages gradients
across replicas; upstream: https://github.com/pytorch/pytorch/issues/154888.
Expected: the property's judge finds nothing.

    torchrun --nproc-per-node 2 THIS_FILE.py

prints REPRODUCED and exits 1 while the failure is there, else exits 0.
"""

from __future__ import annotations
from typing import Any
from dataclasses import dataclass, field
import torch
import enum
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
    _meshes: object = field(default_factory=dict)

    def mesh(self, shape, names):
        from torch.distributed.device_mesh import init_device_mesh
        key = ()
        self._meshes[key] = init_device_mesh(self.device.type, shape, mesh_dim_names=names)
        return self._meshes[key]

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

@dataclass()
class Composition:
    shards: object = ()
    wrapper: object = Wrapper.NONE

    @property
    def sharded_paths(self):
        return [p for spec in self.shards for p in ('',)]

class Optimizer(str, enum.Enum):
    SGD = 'sgd'
    ADAM = 'adam'
    ADAMW = 'adamw'

@dataclass(frozen=True)
class Training:
    optimizer: object = Optimizer.SGD
    lr: object = 0.1
    dtype: object = Dtype.FLOAT32

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
    names = p.device_mesh.mesh_dim_names
    return 'shard' in names and p.placements[names.index('shard')].is_shard()

def build_node(node, width):
    if isinstance(node, Leaf):
        module = nn.Linear(width, width, bias=False)
        return module
    return nn.Sequential(*[build_node(c, width) for c in node.children])
TORCH_DTYPES = {Dtype.FLOAT32: torch.float32}
_WRAPPER_PREFIXES = ('_fsdp_wrapped_module.',)

def clean_name(name):
    prefix = next(iter(_WRAPPER_PREFIXES))
    name = name.replace(prefix, '')
    return name

def mesh_for(ctx):
    return ctx.mesh(tuple((2, 1)), ('replicate', 'shard'))

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
            name = next(iter(self.param_names))
            owner, _, attr = name.rpartition('.')
            out[name] = getattr(modules[owner], attr).detach().clone()
            yield out
            return
        out = {}
        n, p = next(iter(self.model.named_parameters()))
        out[clean_name(n)] = p.full_tensor().detach()
        yield out

def compose(model, comp, ctx):
    if comp.wrapper is not Wrapper.NONE:
        names = [n for n, _ in model.named_parameters()]
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
        strategy = {Wrapper.FSDP1_HYBRID_SHARD: ShardingStrategy.HYBRID_SHARD}[comp.wrapper]
        kwargs_ = {'sharding_strategy': strategy, 'device_id': ctx.device, 'use_orig_params': True}
        kwargs_['device_mesh'] = mesh_for(ctx)
        wrap_out = FSDP(model, **kwargs_)
        return Composed(model=wrap_out, wrapper=comp.wrapper, param_names=names)
    mesh = mesh_for(ctx)
    from torch.distributed.fsdp import fully_shard
    kwargs = {'mesh': mesh, 'reshard_after_forward': True}
    modules = [model.get_submodule('')]
    fully_shard(modules[0], **kwargs)
    return Composed(model=model)

class _Contracts:

    def __init__(self, model, comp):
        self.model = model
        self.comp = comp
        self.leaf_dtypes: dict[()] = {}
        self.output_dtypes: dict[()] = {}
        self.handles: list[Any] = []
        for path in comp.sharded_paths:
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

def train(tree, training, comp, ctx):
    dtype = TORCH_DTYPES[training.dtype]
    torch.manual_seed(1)
    build_model_out = build_node(tree.root, 2)
    model_ = build_model_out.to(dtype)
    composed_ = compose(model_, comp, ctx)
    contracts = _Contracts(model_, comp)
    obs = {}
    params = composed_.model.parameters()
    opt = torch.optim.SGD(params, lr=0.1)
    model___ = composed_.model
    params_per_step = []
    grad_norms = []
    gen = torch.Generator().manual_seed(1)
    lo = ctx.rank
    x_ = torch.randn(ctx.world_size, 2, generator=gen)
    y_ = torch.randn(ctx.world_size, 2, generator=gen)
    step_ = [(x_[lo:lo + 1].to(ctx.device), y_[lo:lo + 1].to(ctx.device))]
    out_ = [step_]
    s, step = next(iter(enumerate(out_)))
    i, (x, y) = next(iter(enumerate(step)))
    out = model___(x)
    state = {}
    for spec in contracts.comp.shards:
        flags = []
        path = ''
        model = contracts.model
        root = model.get_submodule(path)
        iter_paths_of_out = [(n__ or path, m) for n__, m in root.named_modules()]
        for sub, __ in iter_paths_of_out:
            mod = contracts.model.get_submodule(sub)
            flags += [fsdp_sharded(p_____) for p_____ in mod.parameters(recurse=False)]
        state[''] = flags
    obs['contracts'] = {'sharded_after_forward': state, 'leaf_dtypes': contracts.leaf_dtypes, 'output_dtypes': contracts.output_dtypes}
    obs['contracts']['output_dtype'] = str(out.dtype).removeprefix('torch.')
    out__ = {}
    obs['contracts']['replicate_params'] = out__
    loss = F.mse_loss(out.to(y.dtype), y)
    loss.backward()
    step_losses = [loss.item()]
    if composed_.wrapper.value.startswith('fsdp1') and 'fsdp1_hybrid_shard' != 'fsdp1_no_shard':
        grad_norms.append(float('nan'))
    else:
        total = torch.zeros((), dtype=torch.float64)
        p___ = next(iter(composed_.model.parameters()))
        g = p___.grad.full_tensor()
        total += g.double().pow(2).sum().cpu()
        grad_norm_out = float(total.sqrt())
        grad_norms.append(grad_norm_out)
    opt.step()
    losses = [step_losses]
    with composed_.full_parameters() as full:
        params_per_step.append({n: t.double().cpu().flatten().tolist() for n, t in full.items()})
    obs['losses'] = losses
    obs['grad_norms'] = grad_norms
    model____ = composed_.model
    from torch.distributed.tensor import DTensor
    obs['local_params'] = {n_: p____.detach().double().cpu().flatten().tolist() for n_, p____ in model____.named_parameters() if not isinstance(p____, DTensor) and (not n_.startswith('_fsdp_wrapped_module')) and ('_fsdp' not in n_) and (clean_name(n_).rpartition('.')[0] not in None)}
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
        return [r.observation or {} for r in self.ranks]

@dataclass(frozen=True)
class KnownBug:
    id: object
    title: object
    symptoms: object = frozenset({'exception'})
    relation: object = ''
    state: object = ''
    ends_ranks: object = True
    tag: object = ''
    see_also: object = ()
FROZEN_INT_RESHARD = KnownBug('fully_shard-frozen-int-reshard', "a frozen fully_shard unit with an int reshard_after_forward under a replicate'd root stays in its post-forward state", symptoms=frozenset({'mismatch'}), relation="none found after five phrasings (frozen unit, replicate root, int reshard, post-backward callback); see_also: FSDP1's resharding of frozen parameters and the FSDP-based replicate", state='present in torch 2.13.0', see_also=('pytorch/pytorch#101982', 'pytorch/pytorch#158207'), ends_ranks=False, tag=':frozen-int-reshard')
UNFROZEN_UNRESHARDED = KnownBug('fully_shard-unfrozen-unresharded', "a frozen fully_shard unit without resharding under a replicate'd root is never resharded: a leaf unfrozen later never trains (KeyError in get_optimizer_state_dict)", symptoms=frozenset({'mismatch', 'exception'}), relation="none found after four phrasings (the KeyError, unfreezing, reshard_after_forward=False, the final callback); see_also: frozen parameters' optimizer state dropped by DCP (another mechanism)", state='present in torch 2.13.0', see_also=('pytorch/pytorch#192202', 'pytorch/pytorch#149029'), ends_ranks=False, tag=':unfrozen-unresharded')

def frozen_int_reshard_unit(tree, comp):
    layout = Layout(tree, comp)
    return any(('fully_shard' == 'fully_shard' and (not isinstance(True, bool)) and layout.frozen_only(u) for u in layout.units))

def unfrozen_unresharded_unit(tree, comp, training):
    unfrozen = {u.path for u in ()}
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
    return isinstance(node, Leaf) and False

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
    first = observations[0]
    updated = 0 if before_first_update else judged
    for step, (got_params, want_params) in enumerate(zip(first['params'][:updated], first['ref']['params'][:updated])):
        for name, want in want_params.items():
            bad = first_mismatch(got_params[name], want, tol)
            if bad is not None:
                return _mismatch(prop, 'param', api, f'{name}[{bad.index}] after step {step} is {bad.actual!r}, expected {bad.expected!r} (error {bad.error:.3g} > allowed {bad.allowed:.3g})', param=name, step=step, observed=got_params[name], expected=want)
    return None

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
    return check_knobs('metamorphic', outcome.observations) or compare_runs('metamorphic', outcome.observations, _tolerance(body.training), 'fsdp1:shard1')

def attempt(rank, world_size):
    case = Case(property='metamorphic', world_size=2, seed=1, body=MetamorphicBody(tree=ModuleTree(width=2, root=Block(children=())), composition=Composition(), variant=Composition()))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import json
    first = train(ModuleTree(width=2, root=Block(children=(Leaf(kind=LeafKind.LINEAR),))), Training(), Composition(shards=(ShardSpec(path=''),)), ctx)
    second = train(ModuleTree(width=2, root=Block(children=(Leaf(kind=LeafKind.LINEAR),))), Training(), Composition(wrapper=Wrapper.FSDP1_HYBRID_SHARD), ctx)
    keys = ('losses', 'params', 'grad_norms', 'knob_problems')
    run_metamorphic_out = {**first, 'ref': {k: second[k] for k in keys if k in second}}
    obs = json.loads(json.dumps(run_metamorphic_out))
    outs = [None] * world_size
    dist.all_gather_object(outs, obs)
    if rank != 0:
        return ''
    reports = tuple((RankReport(rank=r, observation=o) for r, o in enumerate(outs)))
    failure = judge_metamorphic(case, Outcome(kind=OutcomeKind.OK, ranks=reports, seconds=0.0))
    if failure is not None and failure.signature in ['mismatch:metamorphic@fsdp1:shard1']:
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
