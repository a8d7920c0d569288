"""Standalone reproducers: a corpus entry as one Python script that imports only torch.

``python -m fuzz repro ENTRY.json -o FILE.py`` writes a script for ``torchrun --nproc-per-node N
FILE.py`` that rebuilds the entry's case as plain code (a module tree in ``nn.Sequential`` form
with the case's submodule names, the composition calls, the data drawn from the case's seed, the
training loop of the composed model and of its reference, and the property's checks with the
tolerance numbers inlined) and exits 1 iff the failure reproduces, short enough to paste into
a PyTorch issue.

The script mirrors what the ranks do (:mod:`fuzz._rank.parity`, :mod:`fuzz._rank.compose`,
:mod:`fuzz._rank.models`) and what the driver judges (:mod:`fuzz.properties.parity`); tests run
a script and the pool on the same case and compare every observation, so a drift shows.

A renderer must never emit a script that quietly tests something else than the case. So before
rendering, :func:`check_supported` walks the whole case: every dataclass must be one this
module knows, every field of it one this module renders (:data:`KNOWN_FIELDS`), every enum value
one it renders (:data:`KNOWN_VALUES`). A field added to the case model later is accepted only
while it holds its default (a case that does not use the new feature renders as before);
anything else is refused with an :class:`~fuzz.errors.InvalidArgument` that names the field
(exit 2 from the command line). Supporting a feature means rendering it (a small function
below) and adding it to those tables. Body kinds map to renderers in :data:`RENDERERS`.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import textwrap
from collections.abc import Callable, Iterator
from typing import Any

from fuzz.case import (
    AccumSync,
    Block,
    Case,
    Composition,
    Dtype,
    Leaf,
    LeafKind,
    ModuleTree,
    Node,
    Optimizer,
    ParityBody,
    ShardSpec,
    Training,
    iter_paths,
    owns_params,
    to_jsonable,
)
from fuzz.corpus import Entry
from fuzz.errors import InvalidArgument
from fuzz.tolerance import tolerance_for

#: The fields each case dataclass may use in a renderable case. Fields missing here must hold
#: their defaults. ``checkpoint_first`` orders checkpoint calls against fully_shard, so it has no
#: effect while ``checkpoints`` is empty, which it must be here (``checkpoints`` is not listed).
KNOWN_FIELDS: dict[type, frozenset[str]] = {
    Case: frozenset({"property", "world_size", "seed", "body"}),
    ParityBody: frozenset({"tree", "composition", "training"}),
    ModuleTree: frozenset({"width", "root"}),
    Block: frozenset({"children", "residual", "scale", "buffer"}),
    Leaf: frozenset({"kind", "bias", "frozen"}),
    Composition: frozenset({"shards", "checkpoint_first"}),
    ShardSpec: frozenset({"path", "reshard_after_forward", "shard_dim", "group"}),
    Training: frozenset(
        {
            "optimizer",
            "lr",
            "momentum",
            "eps",
            "steps",
            "batch_per_rank",
            "dtype",
            "grad_accum",
            "accum_sync",
            "set_to_none",
            "same_input",
            "param_groups",
            "foreach",
        }
    ),
}

#: The enum values the renderer can write. Others are refused.
KNOWN_VALUES: dict[type[enum.Enum], frozenset[enum.Enum]] = {
    LeafKind: frozenset(
        {
            LeafKind.LINEAR,
            LeafKind.LAYER_NORM,
            LeafKind.CONV1D,
            LeafKind.RELU,
            LeafKind.TANH,
            LeafKind.GELU,
            LeafKind.DROPOUT,
        }
    ),
    Optimizer: frozenset({Optimizer.SGD, Optimizer.ADAM, Optimizer.ADAMW}),
    Dtype: frozenset({Dtype.FLOAT32, Dtype.FLOAT64}),
    AccumSync: frozenset({AccumSync.ALWAYS, AccumSync.NO_GRAD_SYNC}),
}

#: Properties whose judge the parity renderer reproduces (``mixed_precision`` shares the body
#: but judges other things).
PARITY_PROPERTIES = frozenset({"parity"})

#: Seconds before a script gives up on a hang (faulthandler prints every thread's stack).
TIMEOUT_S = 300


def render_entry(entry: Entry, *, source: str = "") -> str:
    """The reproducer script for ``entry`` (``source`` names the entry file in its docstring)."""
    case = entry.case
    if case.body.KIND in REFUSED:
        raise InvalidArgument(f"{source or 'entry'}: {REFUSED[case.body.KIND]}")
    renderer = RENDERERS.get(case.body.KIND)
    if renderer is None:
        raise InvalidArgument(
            f"{source or 'entry'}: repro has no renderer for case bodies of kind {case.body.KIND!r} "
            f"(it renders {sorted(RENDERERS)}); replay it with `python -m fuzz replay` instead"
        )
    check_supported(case, where=source or "entry")
    return renderer(entry, source)


def check_supported(case: Case, *, where: str = "entry") -> None:
    """Refuse (InvalidArgument naming the field) any part of ``case`` the renderer does not know."""
    problems = [f"{path}: {problem}" for path, problem in _unsupported(case, "case")]
    if problems:
        raise InvalidArgument(
            f"{where}: repro cannot render this case yet (replay it with `python -m fuzz replay` instead): "
            + "; ".join(problems)
        )


def _unsupported(value: Any, path: str) -> Iterator[tuple[str, str]]:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        cls = type(value)
        known = KNOWN_FIELDS.get(cls)
        if known is None:
            yield path, f"{cls.__name__} is a case feature repro does not know"
            return
        fields = {f.name: f for f in dataclasses.fields(value)}
        stale = known - set(fields)
        if stale:  # the case model dropped or renamed something this module renders
            raise InvalidArgument(f"fuzz.repro is out of date: {cls.__name__} has no field(s) {sorted(stale)}")
        for name, f in fields.items():
            item = getattr(value, name)
            if name in known:
                yield from _unsupported(item, f"{path}.{name}")
            elif item != _default(f):
                default = _show(_default(f))
                yield f"{path}.{name}", f"{_show(item)} is a case feature repro does not render (default {default})"
    elif isinstance(value, tuple):
        for i, item in enumerate(value):
            yield from _unsupported(item, f"{path}[{i}]")
    elif isinstance(value, enum.Enum) and value not in KNOWN_VALUES.get(type(value), frozenset()):
        yield path, f"{type(value).__name__}.{value.name} ({value.value!r}) is not rendered"


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _q(value: Any) -> str:
    """A Python literal for a string, a list of strings or None, in double quotes (black style)."""
    return "None" if value is None else json.dumps(value)


def _show(value: Any) -> str:
    try:
        return json.dumps(to_jsonable(value))[:120]
    except TypeError:
        return repr(value)[:120]


# ----------------------------------------------------------------------------------------------
# parity


def render_parity(entry: Entry, source: str) -> str:
    case = entry.case
    body = case.body
    assert isinstance(body, ParityBody)
    if case.property not in PARITY_PROPERTIES:
        raise InvalidArgument(
            f"{source or 'entry'}: property {case.property!r} judges parity bodies differently; "
            f"repro renders the checks of {sorted(PARITY_PROPERTIES)} only"
        )
    tree, comp, training = body.tree, body.composition, body.training
    sections = [
        _header(entry, source, training),
        _IMPORTS + ("from torch.distributed.tensor import DTensor, Shard\n" if _uses_shard_dim(comp) else _DTENSOR),
        _constants(entry, training),
        render_classes(tree),
        render_model(tree),
        render_composition(comp, tree),
        render_optimizer(training),
        _STATIC,
        _MAIN,
    ]
    return "\n\n\n".join(s.strip("\n") for s in sections if s.strip()) + "\n"


def _uses_shard_dim(comp: Composition) -> bool:
    return any(spec.shard_dim for spec in comp.shards)


def _header(entry: Entry, source: str, training: Training) -> str:
    case = entry.case
    tol = tolerance_for(training.dtype.value)
    summary = textwrap.fill(entry.summary or "(no summary)", 92, initial_indent="    ", subsequent_indent="    ")
    versions = ", ".join(f"{k} {v}" for k, v in sorted(entry.versions.items()) if k in ("torch", "python", "device"))
    name = _doc(source or "a shardfuzz corpus entry")
    summary, versions = _doc(summary), _doc(versions)
    return f'''#!/usr/bin/env python3
"""Reproducer for {name} (generated by `python -m fuzz repro`).

Recorded failure: {_doc(entry.signature)} ({entry.status}; reproduced {entry.reproduced}/{entry.reruns} re-runs)
{summary}
Found with {versions or "unknown versions"}; backend {entry.backend}, {case.world_size} ranks.

Every rank trains the model below under fully_shard, and the same plain model whose gradients
are averaged over the ranks by an all_reduce per step (data parallelism, nothing to get wrong),
each on its own slice of the same batches, from the same weights and RNG state. Every rank's
losses and gradient norms, and the full parameters after every step, must agree within
rtol={tol.rtol!r}, atol={tol.atol!r} ({training.dtype.value}); and right after the first forward the
parameters of every fully_shard unit must be sharded iff its reshard_after_forward is True.

    torchrun --nproc-per-node {case.world_size} THIS_FILE.py [--backend gloo|nccl]

gloo on CPU by default; nccl (one GPU per rank) with --backend nccl or REPRO_BACKEND=nccl.
Exit status 0: everything agrees (the failure does not reproduce); 1: it does; 2: bad usage.
"""'''


def _doc(text: str) -> str:
    """``text`` made safe inside a triple-quoted docstring (messages can hold quotes, backslashes)."""
    return text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')


_IMPORTS = """
import argparse
import faulthandler
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
"""
_DTENSOR = "from torch.distributed.tensor import DTensor\n"


def _constants(entry: Entry, training: Training) -> str:
    case = entry.case
    assert isinstance(case.body, ParityBody)
    tol = tolerance_for(training.dtype.value)
    return f"""
RECORDED = {_q(entry.signature)}  # the failure shardfuzz saw, and the check that disagreed
RECORDED_CHECK = {_q(entry.details.get("check"))}
WORLD_SIZE = {case.world_size}
SEED = {case.seed}
WIDTH = {case.body.tree.width}
STEPS = {training.steps}
MICROBATCHES = {training.grad_accum}  # per optimizer step
BATCH_PER_RANK = {training.batch_per_rank}
SAME_INPUT = {training.same_input}  # every rank trains on the first slice (else on its own)
DTYPE = torch.{training.dtype.value}
RTOL, ATOL = {tol.rtol!r}, {tol.atol!r}  # shardfuzz's tolerance policy for {training.dtype.value}
TIMEOUT_S = {TIMEOUT_S}
"""


# -- the module tree ----------------------------------------------------------------------------

#: Leaf kind -> constructor expression.
LEAF_RENDERERS: dict[LeafKind, Callable[[Leaf], str]] = {
    LeafKind.LINEAR: lambda leaf: f"nn.Linear(WIDTH, WIDTH{_bias(leaf)})",
    LeafKind.LAYER_NORM: lambda leaf: f"nn.LayerNorm(WIDTH{_bias(leaf)})",
    LeafKind.CONV1D: lambda leaf: f"PointwiseConv1d(WIDTH, WIDTH, kernel_size=1{_bias(leaf)})",
    LeafKind.RELU: lambda leaf: "nn.ReLU()",
    LeafKind.TANH: lambda leaf: "nn.Tanh()",
    LeafKind.GELU: lambda leaf: "nn.GELU()",
    LeafKind.DROPOUT: lambda leaf: "nn.Dropout(0.5)",
}


def _bias(leaf: Leaf) -> str:
    return "" if leaf.bias else ", bias=False"


def _nodes(tree: ModuleTree) -> list[Node]:
    return [n for _, n in iter_paths(tree.root)]


def _is_plain(block: Block) -> bool:
    return not (block.residual or block.scale or block.buffer)


_BLOCK_CLASS = '''
class Block(nn.Sequential):
    """Runs its children in order, then * scale (a parameter of its own), + shift (a buffer)
    and + its input (residual), each if it has it."""

    def __init__(self, *children, residual=False, scale=False, shift=False):
        super().__init__(*children)
        self.residual = residual
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(WIDTH)) if scale else None
        if shift:
            self.register_buffer("shift", 0.1 * torch.randn(WIDTH))
        else:
            self.shift = None

    def forward(self, x):
        y = super().forward(x)
        if self.scale is not None:
            y = y * self.scale
        if self.shift is not None:
            y = y + self.shift
        return x + y if self.residual else y
'''

_CONV_CLASS = '''
class PointwiseConv1d(nn.Conv1d):
    """Conv1d with kernel 1 applied to (batch, width) as a length-1 sequence."""

    def forward(self, x):
        return super().forward(x.unsqueeze(-1)).squeeze(-1)
'''


def render_classes(tree: ModuleTree) -> str:
    """The module classes the tree needs beyond torch.nn."""
    nodes = _nodes(tree)
    out = []
    if any(isinstance(n, Block) and not _is_plain(n) for n in nodes):
        out.append(_BLOCK_CLASS)
    if any(isinstance(n, Leaf) and n.kind is LeafKind.CONV1D for n in nodes):
        out.append(_CONV_CLASS)
    return "\n\n\n".join(s.strip("\n") for s in out)


def render_model(tree: ModuleTree) -> str:
    body = render_node(tree.root, "", 1)
    return (
        "def build_model():\n"
        '    """Submodule names are the case\'s paths (commented), as model.get_submodule(path) finds them."""\n'
        f"    return {body.lstrip()}\n"
    )


def render_node(node: Node, path: str, depth: int) -> str:
    pad = "    " * depth
    if isinstance(node, Leaf):
        expr = LEAF_RENDERERS[node.kind](node)
        return pad + expr + (".requires_grad_(False)" if node.frozen else "")
    lines = []
    for i, child in enumerate(node.children):
        child_path = f"{path}.{i}" if path else str(i)
        lines.append(render_node(child, child_path, depth + 1) + f",  # {_q(child_path)}")
    opts = [name for name, on in (("residual", node.residual), ("scale", node.scale), ("shift", node.buffer)) if on]
    cls = "nn.Sequential" if not opts else "Block"
    tail = "".join(f"{pad}    {name}=True,\n" for name in opts)
    return f"{pad}{cls}(\n" + "\n".join(lines) + "\n" + tail + f"{pad})"


# -- the composition ----------------------------------------------------------------------------


def render_composition(comp: Composition, tree: ModuleTree) -> str:
    """fully_shard calls in the order the fuzzer applies them (``Composition.steps()``)."""
    specs = {spec.path: spec for spec in comp.shards}
    placement = sorted({spec.shard_dim for spec in comp.shards if spec.shard_dim})
    out = [render_placement_fn(dim) for dim in placement]
    calls = [render_fully_shard(specs[path]) for api, path in comp.steps() if api == "fully_shard"]
    sharded = comp.sharded_paths
    tops = [p for p in sharded if not any(q != p and (q == "" or p.startswith(q + ".")) for q in sharded)]
    out.append(
        "def compose(model, mesh):\n"
        '    """fully_shard, deepest modules first; returns the outermost FSDP modules."""\n'
        + "".join(f"    {call}\n" for call in calls)
        + f"    return [{', '.join(_module(p) for p in tops)}]\n"
    )
    out.append(render_reshard_contract(comp, tree))
    return "\n\n\n".join(s.strip("\n") for s in out)


def _module(path: str) -> str:
    return "model" if path == "" else f"model.get_submodule({_q(path)})"


def render_placement_fn(dim: int) -> str:
    return f'''
def shard_dim_{dim}(param):
    """Shard({dim}) where dim {dim} splits evenly over the shard ranks, else the default Shard(0):
    fully_shard supports uneven sharding on dim 0 only."""
    if param.ndim > {dim} and param.shape[{dim}] % WORLD_SIZE == 0:
        return Shard({dim})
    return None
'''


def render_fully_shard(spec: ShardSpec) -> str:
    modules = [_module(p) for p in spec.paths]
    target = f"[{', '.join(modules)}]" if spec.group else modules[0]
    kwargs = f"mesh=mesh, reshard_after_forward={spec.reshard_after_forward!r}"
    if spec.shard_dim:
        kwargs += f", shard_placement_fn=shard_dim_{spec.shard_dim}"
    return f"fully_shard({target}, {kwargs})"


def render_reshard_contract(comp: Composition, tree: ModuleTree) -> str:
    """Per fully_shard call with a bool reshard_after_forward: the modules whose own parameters it
    manages (every module under its members that is not inside another unit nested in them), as
    fuzz._rank.parity records the contract."""
    sharded = comp.sharded_paths
    # Modules without parameters of their own contribute no flags; leaving them out changes nothing.
    modules = [path for path, node in tree.paths().items() if owns_params(node)]
    rows = ""
    for spec in comp.shards:
        if isinstance(spec.reshard_after_forward, bool):
            owned = [m for member in spec.paths for m in _owned(member, modules, sharded)]
            rows += f"    {_q(spec.path)}: ({spec.reshard_after_forward}, {_q(owned)}),\n"
    return (
        "# fully_shard unit (its first module) -> (reshard_after_forward, modules whose own parameters it holds)\n"
        + ("RESHARD_CONTRACT = {\n" + rows + "}\n" if rows else "RESHARD_CONTRACT = {}\n")
    )


def _owned(member: str, modules: list[str], sharded: list[str]) -> list[str]:
    out = []
    for sub in modules:
        if not (sub == member or member == "" or sub.startswith(member + ".")):
            continue
        nested = [o for o in sharded if o != member and (member == "" or o.startswith(member + "."))]
        if sub != member and any(sub == o or sub.startswith(o + ".") for o in nested):
            continue
        out.append(sub)
    return out


# -- training -----------------------------------------------------------------------------------


def render_optimizer(training: Training) -> str:
    if training.optimizer is Optimizer.SGD:
        ctor = f"torch.optim.SGD(groups, lr={training.lr!r}, momentum={training.momentum!r}"
    else:
        name = {Optimizer.ADAM: "Adam", Optimizer.ADAMW: "AdamW"}[training.optimizer]
        ctor = f"torch.optim.{name}(groups, lr={training.lr!r}, eps={training.eps!r}"
    ctor += ")" if training.foreach is None else f", foreach={training.foreach!r})"
    groups = "    groups = params\n"
    if training.param_groups == 2:
        groups = (
            f'    groups = [{{"params": params[0::2]}}, {{"params": params[1::2], "lr": {training.lr / 2!r}}}]\n'
            '    groups = [g for g in groups if g["params"]]\n'
        )
    sync = training.accum_sync is AccumSync.NO_GRAD_SYNC
    return (
        "def make_optimizer(model):\n"
        "    params = [p for p in model.parameters() if p.requires_grad]\n"
        + groups
        + f"    return {ctor}\n"
        + "\n\n"
        + "SET_TO_NONE = "
        + repr(training.set_to_none)
        + "  # zero_grad(set_to_none=...)\n"
        + "SYNC_EVERY_MICROBATCH = "
        + repr(not sync)
        + "  # else set_requires_gradient_sync(False) on all but a step's last microbatch\n"
    )


_STATIC = '''
def batches(rank, device):
    """Per step, per microbatch: this rank's slice of a global batch drawn from a generator seeded
    with SEED (the same on every rank)."""
    gen = torch.Generator().manual_seed(SEED)
    lo = 0 if SAME_INPUT else rank * BATCH_PER_RANK
    out = []
    for _ in range(STEPS):
        step = []
        for _ in range(MICROBATCHES):
            x = torch.randn(WORLD_SIZE * BATCH_PER_RANK, WIDTH, generator=gen, dtype=DTYPE)
            y = torch.randn(WORLD_SIZE * BATCH_PER_RANK, WIDTH, generator=gen, dtype=DTYPE)
            step.append((x[lo : lo + BATCH_PER_RANK].to(device), y[lo : lo + BATCH_PER_RANK].to(device)))
        out.append(step)
    return out


def full(t):
    return t.full_tensor() if isinstance(t, DTensor) else t


def sharded_after_forward(model):
    """Per unit of RESHARD_CONTRACT: is each of its parameters registered sharded (a DTensor)?"""
    return {
        unit: (reshard, [isinstance(p, DTensor) for m in mods for p in model.get_submodule(m).parameters(False)])
        for unit, (reshard, mods) in RESHARD_CONTRACT.items()
    }


def train(composed, rank, device, mesh):
    """One run: under fully_shard (composed) or plain with gradients all-reduced (reference)."""
    torch.manual_seed(SEED)
    with device:
        model = build_model()
    model.to(DTYPE)
    roots = compose(model, mesh) if composed else []
    opt = make_optimizer(model)
    torch.manual_seed((SEED * 7919 + rank + 1) % 2**63)  # dropout masks: same in both runs of a rank
    run = {"losses": [], "grad_norms": [], "params": []}
    for step in batches(rank, device):
        step_losses = []
        for i, (x, y) in enumerate(step):
            sync = SYNC_EVERY_MICROBATCH or i == len(step) - 1
            for m in roots:
                m.set_requires_gradient_sync(sync)
                m.set_requires_all_reduce(sync)
            out = model(x)
            if composed and "contract" not in run:
                run["contract"] = sharded_after_forward(model)
            loss = F.mse_loss(out.to(y.dtype), y)
            loss.backward()
            step_losses.append(loss.item())
        if not composed:
            for p in model.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad /= WORLD_SIZE
        norm = torch.zeros((), dtype=torch.float64)
        for p in model.parameters():
            if p.grad is not None:
                norm += full(p.grad).double().pow(2).sum().cpu()
        run["grad_norms"].append(float(norm.sqrt()))
        opt.step()
        opt.zero_grad(set_to_none=SET_TO_NONE)
        run["losses"].append(step_losses)
        params = {n: full(p).detach().double().cpu().flatten().tolist() for n, p in model.named_parameters()}
        if rank == 0:
            run["params"].append(params)
    return run


def worst_mismatch(actual, expected):
    """The element furthest outside |a - e| <= ATOL + RTOL * |e| (NaN and inf never pass), or None."""
    if len(actual) != len(expected):
        return (-1, len(actual), len(expected), float("inf"), 0.0)
    worst = None
    for i, (a, e) in enumerate(zip(actual, expected)):
        allowed = ATOL + RTOL * abs(e)
        err = abs(a - e)
        if not err <= allowed or e != e or abs(e) == float("inf"):
            excess = err - allowed if err == err else float("inf")
            if worst is None or excess > worst[3] - worst[4]:
                worst = (i, a, e, err, allowed)
    return worst


def check(runs):
    """(check, message) for the first disagreement, in the fuzzer's order, or None."""
    for rank, (got, ref) in enumerate(runs):
        for step, (a, e) in enumerate(zip(got["losses"], ref["losses"])):
            bad = worst_mismatch(a, e)
            if bad:
                i, a, e, err, allowed = bad
                return "loss", (
                    f"rank {rank} loss at step {step}, microbatch {i}: {a!r}, expected {e!r} "
                    f"(error {err:.3g} > allowed {allowed:.3g})"
                )
        for step, (a, e) in enumerate(zip(got["grad_norms"], ref["grad_norms"])):
            if a == a and e == e and worst_mismatch([a], [e]):  # NaN: not comparable, skipped
                return "grad", f"rank {rank} gradient norm at step {step} is {a!r}, expected {e!r}"
    got, ref = runs[0]
    for step, (a, e) in enumerate(zip(got["params"], ref["params"])):
        if set(a) != set(e):
            return "param-names", f"parameter names differ: {sorted(set(a) ^ set(e))}"
        for name in e:
            bad = worst_mismatch(a[name], e[name])
            if bad:
                i, x, y, err, allowed = bad
                return "param", (
                    f"{name}[{i}] after step {step} is {x!r}, expected {y!r} "
                    f"(error {err:.3g} > allowed {allowed:.3g})"
                )
    for unit, (reshard, flags) in got["contract"].items():
        if flags and any(f != reshard for f in flags):
            state = "sharded" if reshard else "unsharded"
            return "contract-reshard", (
                f"fully_shard({unit!r}, reshard_after_forward={reshard}): "
                f"parameters not {state} after forward ({flags})"
            )
    return None
'''

_MAIN = """
def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("gloo", "nccl"), default=os.environ.get("REPRO_BACKEND", "gloo"))
    args = parser.parse_args()
    faulthandler.dump_traceback_later(TIMEOUT_S, exit=True)  # a hang: every thread's stack, exit 1
    if args.backend == "nccl" and not torch.cuda.is_available():
        print("--backend nccl needs CUDA, which this torch cannot see; use --backend gloo", file=sys.stderr)
        return 2
    if args.backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        dist.init_process_group("cpu:gloo,cuda:nccl")
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    if dist.get_world_size() != WORLD_SIZE:
        if rank == 0:
            print(f"this case needs {WORLD_SIZE} ranks: torchrun --nproc-per-node {WORLD_SIZE} {sys.argv[0]}")
        dist.destroy_process_group()
        return 2
    mesh = init_device_mesh(device.type, (WORLD_SIZE,), mesh_dim_names=("shard",))
    try:
        mine = (train(True, rank, device, mesh), train(False, rank, device, mesh))
    except Exception as e:  # say so, then let the traceback through (torchrun exits 1)
        name = f"{type(e).__module__}.{type(e).__qualname__}"
        verdict = "REPRODUCED" if f":{name}@" in RECORDED else "FAIL"
        print(f"{verdict} (rank {rank}): {name}: {e}; the recorded failure was {RECORDED}", flush=True)
        raise
    runs = [None] * WORLD_SIZE
    dist.all_gather_object(runs, mine)
    failed = check(runs) if rank == 0 else None
    if rank == 0:
        for step, (got, ref) in enumerate(zip(runs[0][0]["losses"], runs[0][1]["losses"])):
            print(f"rank 0 step {step}: loss {got}, reference {ref}")
        if os.environ.get("REPRO_OBSERVATIONS"):  # for shardfuzz's own tests
            with open(os.environ["REPRO_OBSERVATIONS"], "w") as f:
                json.dump(runs, f)
        if failed is None:
            print(f"PASS: every check agrees; the recorded failure {RECORDED} does not reproduce")
        elif failed[0] == RECORDED_CHECK:
            print(f"REPRODUCED {RECORDED} ({failed[0]}): {failed[1]}")
        else:
            print(f"FAIL ({failed[0]}; the recorded failure was {RECORDED}, {RECORDED_CHECK}): {failed[1]}")
    code = torch.tensor([0 if failed is None else 1], device=device)
    dist.broadcast(code, 0)
    dist.destroy_process_group()
    return int(code.item())


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # skip interpreter teardown, which process-group threads can abort (SIGABRT)
"""


#: Body kind -> renderer; a kind missing here is refused.
RENDERERS: dict[str, Callable[[Entry, str], str]] = {"parity": render_parity}
#: Body kinds refused on purpose, with why.
REFUSED: dict[str, str] = {
    "fault": "fault cases are the rank pool's self-test (an injected fault), not a torch bug; nothing to reproduce"
}
