#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=a161a48d10d56ad0 sources=ce057bc0da65e4dc seconds=411.6
"""Reproduces shardfuzz corpus entry parity-mismatch-cfc52991d173.json: mismatch:parity@fsdp2:unused-no-all-reduce

Observed: FSDP2 HSDP with set_requires_all_reduce(False): a unit unused on the last microbatch
loses the gradient it accumulated on the earlier ones (.grad None); FSDPParamGroup.post_backward
returns early with no new gradients and finalize_backward drops _partial_reduce_output. The same
schedule with set_requires_gradient_sync(False) is right. Torch-only reproducer:
docs/known_bugs.md. (rank 0 loss at step 1, microbatch 1: 1.75269615650177, expected
1.7257918119430542 (error 0.0269 > allowed 1.83e-05))
Known torch bug: HSDP with set_requires_all_reduce(False): a unit unused on the last microbatch
loses its accumulated gradient; upstream: none found.
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

def contains(outer, path):
    return outer == path or outer == '' or path.startswith(outer + '.')

def is_ancestor(ancestor, path):
    return ancestor != path and contains(ancestor, path)

@dataclass()
class ShardSpec:
    path: object

    @property
    def paths(self):
        return (self.path,)

@dataclass()
class Composition:
    shards: object = ()
    mesh: object = ()

    @property
    def sharded_paths(self):
        return [p for spec in self.shards for p in spec.paths]

    def steps(self):
        items = [('fully_shard', spec.path) for spec in self.shards]

        def key(item):
            api, path = item
            depth = min((q.count('.') + (q != '') for q in self._spec_paths(api, path)))
            return (-depth, path)
        return sorted(items, key=key)

    def _spec_paths(self, api, path):
        return next((s.paths for s in self.shards if s.path == path))

class AccumSync(str, enum.Enum):
    ALWAYS = 'always'
    NO_GRAD_SYNC = 'no_grad_sync'
    NO_ALL_REDUCE = 'no_all_reduce'

@dataclass()
class Skip:
    path: object
    step: object
    microbatch: object = 0

@dataclass(frozen=True)
class Training:
    lr: object = 0.1
    steps: object = 2
    dtype: object = Dtype.FLOAT32
    accum_sync: object = AccumSync.ALWAYS
    skips: object = ()

    def __post_init__(self):
        for i, skip in enumerate(self.skips):
            pass

    def skipped_at(self, step, microbatch):
        return ['0' for s in self.skips if 0 == step and 1 == microbatch]

@dataclass()
class Layout:
    tree: object
    comp: object

    @cached_property
    def paths(self):
        return self.tree.paths()

    def local(self):
        return [p for p, n in self.paths.items() if owns_params() and (any((contains(i, p) for i in ignored)) or p in by_shards) and (self.member_of(p) is None)]

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

class TreeBlock(nn.Module):

    def __init__(self, children):
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)

    def forward(self, x):
        y = x
        for name, child in self.named_children():
            if name in self.skipped:
                continue
            y = child(y)
        return y

def build_node(node, width):
    if isinstance(node, Leaf):
        module = nn.Linear(width, width)
        return module
    return TreeBlock([build_node(c, width) for c in node.children])

def build_model(tree):
    return build_node(tree.root, 4)
TORCH_DTYPES = {Dtype.FLOAT32: torch.float32}

def clean_name(name):
    return name

@dataclass
class Composed:
    model: object
    fsdp_roots: object = field(default_factory=list)

    def set_sync(self, requires_gradient_sync=True, requires_all_reduce=True):
        for m in self.fsdp_roots:
            m.set_requires_all_reduce(requires_all_reduce)

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

    def after_forward(self, skipped):
        h = next(iter(self.handles))
        sharded = self.comp.sharded_paths + list(())
        state = {}
        for spec in self.comp.shards:
            flags = []
            for path in spec.paths:
                model = self.model
                root = model.get_submodule(path)
                iter_paths_of_out = [(n or path, m) for n, m in root.named_modules()]
                for sub, _ in iter_paths_of_out:
                    if sub != path and _under_other_unit(sub, path, sharded) or sub in ():
                        continue
                    mod = self.model.get_submodule(sub)
                    flags += [fsdp_sharded(p) for p in mod.parameters(recurse=False)]
            state[spec.path] = flags
        return {'sharded_after_forward': state, 'leaf_dtypes': self.leaf_dtypes, 'output_dtypes': self.output_dtypes}

def _under_other_unit(sub, unit, sharded):
    return any((is_ancestor(unit, other) and contains(other, sub) for other in sharded))

def train(tree, training, comp, ctx):
    dtype = TORCH_DTYPES[training.dtype]
    if comp is not None:
        torch.manual_seed(0)
        model__ = build_model(tree).to(dtype)
        mesh = ctx.mesh(tuple((1, 2)), ('replicate', 'shard'))
        specs = {s_.path: s_ for s_ in comp.shards}
        for api, path_ in comp.steps():
            spec = specs[path_]
            from torch.distributed.fsdp import fully_shard
            kwargs = {'mesh': mesh, 'reshard_after_forward': True}
            modules = [model__.get_submodule(p___) for p___ in spec.paths]
            fully_shard(modules[0], **kwargs)
        sharded = comp.sharded_paths
        tops = [p__ for p__ in sharded if not any((is_ancestor(q, p__) for q in sharded))]
        compose_out = Composed(model=model__, fsdp_roots=[model__.get_submodule(p__) for p__ in tops])
        model = model__
        composed = compose_out
    else:
        torch.manual_seed(0)
        model = build_model(tree).to(dtype)
        composed = Composed(model)
    contracts = _Contracts(model, comp) if comp is not None else None
    obs = {}
    model_ = composed.model
    blocks = {'.'.join((c for c in name.split('.') if c.isdigit())): m for name, m in model_.named_modules() if isinstance(m, TreeBlock)}
    model___ = composed.model
    name__, p_____ = next(iter(model___.named_parameters()))
    params = composed.model.parameters()
    opt = torch.optim.SGD(params, lr=0.1)
    forward = _compiled(composed.model) if comp is not None else composed.model
    losses = []
    params_per_step = []
    grad_norms = []
    gen = torch.Generator().manual_seed(0)
    lo = ctx.rank * 2
    out_ = []
    for __ in range(2):
        step_ = []
        for __ in range(2):
            x_ = torch.randn(ctx.world_size * 2, 4, generator=gen)
            y_ = torch.randn(ctx.world_size * 2, 4, generator=gen)
            step_.append((x_[lo:lo + 2].to(ctx.device), y_[lo:lo + 2].to(ctx.device)))
        out_.append(step_)
    for s, step in enumerate(out_):
        step_losses = []
        for i, (x, y) in enumerate(step):
            skipped = training.skipped_at(s, i)
            skipped_ = {p_: set() for p_ in blocks}
            for path in skipped:
                parent, _, name_ = path.rpartition('.')
                skipped_[parent].add(name_)
            p_, block = next(iter(blocks.items()))
            block.skipped = frozenset(skipped_[p_])
            last = i == len(step) - 1
            sync = AccumSync.ALWAYS if last else training.accum_sync
            composed.set_sync(requires_all_reduce=sync is AccumSync.ALWAYS)
            out = forward(x)
            if contracts is not None and comp is not None:
                obs['contracts'] = contracts.after_forward(skipped)
                obs['contracts']['output_dtype'] = str(out.dtype).removeprefix('torch.')
                out__ = {}
                obs['contracts']['replicate_params'] = out__
            loss = F.mse_loss(out.to(y.dtype), y)
            loss.backward()
            step_losses.append(loss.item())
        if comp is None and None is None:
            for name___, p______ in model.named_parameters():
                dist.all_reduce(p______.grad)
                p______.grad /= ctx.world_size
        from torch.distributed.tensor import DTensor
        total = torch.zeros((), dtype=torch.float64)
        for p_______ in composed.model.parameters():
            if p_______.grad is not None:
                g = p_______.grad.full_tensor() if isinstance(p_______.grad, DTensor) else p_______.grad
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
    local_of_out = frozenset() if comp is None else frozenset(Layout(tree, comp).local())
    model____ = composed.model
    from torch.distributed.tensor import DTensor as DTensor_
    obs['local_params'] = {n_: p________.detach().double().cpu().flatten().tolist() for n_, p________ in model____.named_parameters() if not isinstance(p________, DTensor_) and (not n_.startswith('_fsdp_wrapped_module')) and ('_fsdp' not in n_) and (clean_name(n_).rpartition('.')[0] not in local_of_out)}
    obs['knob_problems'] = []
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
    return tolerance_for('float32')

def judge_parity(case, outcome):
    body = case.body
    assert isinstance(body, ParityBody)
    obs = outcome.observations
    failure = check_knobs('parity', obs) or compare_runs('parity', obs, _tolerance(body.training), 'fsdp2:unused-no-all-reduce') or check_replicas(case.property, obs)
    return failure

def attempt(rank, world_size):
    case = Case(property='parity', world_size=2, seed=0, body=ParityBody(tree=ModuleTree(width=4, root=Block(children=(Leaf(kind=LeafKind.LINEAR), Leaf(kind=LeafKind.LINEAR)))), composition=Composition(shards=(ShardSpec(path='0'), ShardSpec(path='')), mesh=(1, 2)), training=Training(accum_sync=AccumSync.NO_ALL_REDUCE, skips=(Skip(path='0', step=0, microbatch=1),))))
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    import json
    body = ParityBody(tree=ModuleTree(width=4, root=Block(children=(Leaf(kind=LeafKind.LINEAR), Leaf(kind=LeafKind.LINEAR)))), composition=Composition(shards=(ShardSpec(path='0'), ShardSpec(path=''))), training=Training(accum_sync=AccumSync.NO_ALL_REDUCE, skips=(Skip(path='0', step=0),)))
    comp = Composition(shards=(ShardSpec(path='0'), ShardSpec(path='')))
    composed = train(ModuleTree(width=4, root=Block(children=(Leaf(kind=LeafKind.LINEAR), Leaf(kind=LeafKind.LINEAR)))), Training(accum_sync=AccumSync.NO_ALL_REDUCE, skips=(Skip(path='0', step=0),)), comp, ctx)
    keys = ('losses', 'params', 'grad_norms')
    pass
    reference = train(ModuleTree(width=4, root=Block(children=(Leaf(kind=LeafKind.LINEAR), Leaf(kind=LeafKind.LINEAR)))), Training(accum_sync=AccumSync.NO_ALL_REDUCE, skips=(Skip(path='0', step=0),)), None, ctx)
    run_parity_out = {**composed, 'ref': {k: reference[k] for k in keys if k in reference}}
    obs = json.loads(json.dumps(run_parity_out))
    outs = [None] * world_size
    dist.all_gather_object(outs, obs)
    if rank != 0:
        return ''
    reports = tuple((RankReport(rank=r, observation=o) for r, o in enumerate(outs)))
    failure = judge_parity(case, Outcome(kind=OutcomeKind.OK, ranks=reports, seconds=0.0))
    if failure is not None and failure.signature in ['mismatch:parity@fsdp2:unused-no-all-reduce']:
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
