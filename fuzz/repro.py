"""Standalone reproducers: a corpus entry as one Python script that imports only torch.

``python -m fuzz repro ENTRY.json -o FILE.py`` writes a script for ``torchrun --nproc-per-node N
FILE.py`` that rebuilds the entry's case as plain code (a module tree in ``nn.Sequential`` form
with the case's submodule names, the composition calls, the data drawn from the case's seed, the
training loop of the composed model and of its reference, and the property's checks with the
tolerance numbers inlined) and exits 1 iff the failure reproduces, short enough to paste into
a PyTorch issue. Only what the case uses is written: a case without replicate has no replicate
import, no replica check and no replicate contract.

Rendered: ``parity`` and ``mixed_precision`` cases, and ``metamorphic`` ones (the model trained
under the composition, run A, and under the variant, run B, compared as the property does, with
no contracts); compositions of ``checkpoint``,
``fully_shard`` (groups, ``reshard_after_forward``, ``shard_placement_fn``,
``MixedPrecisionPolicy``) and ``replicate`` in the order :meth:`fuzz.case.Composition.steps`
gives, on the 1D mesh or an HSDP (replicate, shard) mesh; or DDP / FSDP1 (every sharding
strategy, auto-wrap) with checkpoint on submodules; ``torch.compile`` of the composed model.
Also rendered: modules left out of forward on given microbatches (``Training.skips``: every
block is then a ``Block`` that can leave children out) and frozen leaves unfrozen before a
step (``Training.unfreeze``). Refused: tensor parallelism (``Composition.tp``, not rendered
yet), ``CPUOffloadPolicy`` (it needs an accelerator, so no test on CPU could hold
a script against the pool), other body kinds and properties, and what the ranks ignore (a mesh
on a wrapper other than HYBRID_SHARD, ``checkpoint_first`` on a wrapper).

The script mirrors what the ranks do (:mod:`fuzz._rank.parity`, :mod:`fuzz._rank.compose`,
:mod:`fuzz._rank.models`) and what the driver judges (:mod:`fuzz.properties.parity`, whose
expectations it reuses); tests run a script and the pool on the same case and compare every
observation, so a drift shows.

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
import re
import textwrap
from collections.abc import Callable, Iterator
from typing import Any

from fuzz.case import (
    AccumSync,
    Block,
    Case,
    Compile,
    Composition,
    Dtype,
    Leaf,
    LeafKind,
    MetamorphicBody,
    MixedPrecision,
    ModuleTree,
    Node,
    Optimizer,
    ParityBody,
    ShardSpec,
    Skip,
    Training,
    Unfreeze,
    Wrapper,
    iter_paths,
    owns_params,
    to_jsonable,
)
from fuzz.corpus import Entry
from fuzz.errors import InvalidArgument

# The judge's own expectations (which parameters replicate must manage, which fully_shard unit
# casts a module's parameters), so a script's checks cannot drift from the property's.
from fuzz.properties.parity import _replicated_names, _unit_of
from fuzz.tolerance import tolerance_for

#: The fields each case dataclass may use in a renderable case. Fields missing here must hold
#: their defaults (``ShardSpec.offload``: CPUOffloadPolicy).
KNOWN_FIELDS: dict[type, frozenset[str]] = {
    Case: frozenset({"property", "world_size", "seed", "body"}),
    ParityBody: frozenset({"tree", "composition", "training"}),
    MetamorphicBody: frozenset({"tree", "composition", "variant", "training"}),
    ModuleTree: frozenset({"width", "root"}),
    Block: frozenset({"children", "residual", "scale", "buffer"}),
    Leaf: frozenset({"kind", "bias", "frozen"}),
    Composition: frozenset(
        {
            "shards",
            "replicates",
            "checkpoints",
            "checkpoint_first",
            "mesh",
            "wrapper",
            "auto_wrap",
            "meta_init",
            "find_unused",
        }
    ),
    ShardSpec: frozenset({"path", "reshard_after_forward", "shard_dim", "group", "mixed_precision"}),
    MixedPrecision: frozenset({"param_dtype", "reduce_dtype", "output_dtype", "cast_forward_inputs"}),
    Skip: frozenset({"path", "step", "microbatch"}),
    Unfreeze: frozenset({"path", "step"}),
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
            "compile",
            "skips",
            "unfreeze",
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
    Compile: frozenset({Compile.NONE, Compile.EAGER, Compile.AOT_EAGER}),
    Dtype: frozenset({Dtype.FLOAT32, Dtype.FLOAT64, Dtype.BFLOAT16, Dtype.FLOAT16}),
    AccumSync: frozenset({AccumSync.ALWAYS, AccumSync.NO_GRAD_SYNC, AccumSync.NO_ALL_REDUCE}),
    Wrapper: frozenset(
        {
            Wrapper.NONE,
            Wrapper.DDP,
            Wrapper.FSDP1_FULL_SHARD,
            Wrapper.FSDP1_SHARD_GRAD_OP,
            Wrapper.FSDP1_NO_SHARD,
            Wrapper.FSDP1_HYBRID_SHARD,
        }
    ),
}

#: Properties of parity bodies whose judges the parity renderer reproduces: ``parity`` (numerics
#: against the all-reduce reference, replicas, contracts on rank 0) and ``mixed_precision``
#: (the contracts alone, on every rank).
PARITY_PROPERTIES = frozenset({"parity", "mixed_precision"})

#: Seconds before a script gives up on a hang (faulthandler prints every thread's stack).
TIMEOUT_S = 300

_FSDP1_STRATEGIES = {
    Wrapper.FSDP1_FULL_SHARD: "FULL_SHARD",
    Wrapper.FSDP1_SHARD_GRAD_OP: "SHARD_GRAD_OP",
    Wrapper.FSDP1_NO_SHARD: "NO_SHARD",
    Wrapper.FSDP1_HYBRID_SHARD: "HYBRID_SHARD",
}


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
    if not problems and isinstance(case.body, ParityBody):
        problems = [f"{path}: {problem}" for path, problem in _ignored(case.body.composition, "case.body.composition")]
    if not problems and isinstance(case.body, MetamorphicBody):
        problems = [
            f"{path}: {problem}"
            for name in ("composition", "variant")
            for path, problem in _ignored(getattr(case.body, name), f"case.body.{name}")
        ]
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


def _ignored(comp: Composition, path: str) -> Iterator[tuple[str, str]]:
    """Fields the case model accepts but the ranks do not use with a wrapper: a script would
    either use them (and test something else than the ranks did) or silently drop them."""
    if comp.wrapper is Wrapper.NONE:
        return
    if comp.mesh and comp.wrapper is not Wrapper.FSDP1_HYBRID_SHARD:
        yield f"{path}.mesh", f"{_show(comp.mesh)} is not used by the ranks with wrapper {comp.wrapper.value}"
    if not comp.checkpoint_first:
        yield f"{path}.checkpoint_first", f"false is not used by the ranks with wrapper {comp.wrapper.value}"


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _q(value: Any) -> str:
    """A Python literal for a string, a list of strings or None, in double quotes (black style)."""
    return "None" if value is None else json.dumps(value)


def _names(names: list[str]) -> str:
    """A list of strings as a literal for a table row: inline, or one item a line where the row
    would run past the scripts' line length."""
    inline = _q(names)
    if len(inline) <= 80:
        return inline
    return "[\n" + "".join(f"        {_q(n)},\n" for n in names) + "    ]"


def _show(value: Any) -> str:
    try:
        return json.dumps(to_jsonable(value))[:120]
    except TypeError:
        return repr(value)[:120]


# ----------------------------------------------------------------------------------------------
# parity and mixed_precision


@dataclasses.dataclass(frozen=True)
class _Uses:
    """What a parity body's case uses, which decides what its script contains."""

    case: Case
    body: ParityBody
    #: Appended to the names of this composition's functions and constants (``compose_a``,
    #: ``MESH_SHAPE_A``) where a script trains under two (``metamorphic``); empty otherwise.
    suffix: str = ""

    @property
    def comp(self) -> Composition:
        return self.body.composition

    @property
    def metamorphic(self) -> bool:
        """Two compositions compared with each other: no reference, no contracts, no replicas."""
        return self.case.property == "metamorphic"

    @property
    def compares(self) -> bool:
        """Numerics compared between two runs (with the tolerance policy)."""
        return self.reference or self.metamorphic

    def fn(self, name: str) -> str:
        """A function name of this composition's run."""
        return name + self.suffix

    def const(self, name: str) -> str:
        """A constant's name of this composition's run."""
        return name + self.suffix.upper()

    @property
    def reference(self) -> bool:
        """Numerics against the all-reduce reference (``parity``); ``mixed_precision`` judges the
        contracts alone, so its script trains only the composed model."""
        return self.case.property == "parity"

    @property
    def wrapper(self) -> bool:
        return self.comp.wrapper is not Wrapper.NONE

    @property
    def fsdp1(self) -> bool:
        return self.comp.wrapper in _FSDP1_STRATEGIES

    @property
    def ddp(self) -> bool:
        return self.comp.wrapper is Wrapper.DDP

    @property
    def mesh(self) -> tuple[int, ...] | None:
        """The device mesh's shape, or None where nothing takes a mesh (DDP, FSDP1 but HYBRID_SHARD)."""
        if not self.wrapper:
            return self.comp.mesh or (self.case.world_size,)
        return self.comp.mesh if self.comp.wrapper is Wrapper.FSDP1_HYBRID_SHARD else None

    @property
    def replicas(self) -> bool:
        """Parameters held whole on every rank, which ``parity`` requires bitwise equal. Without
        replicate or DDP there are none: fully_shard's are DTensors, FSDP1's names start with
        ``_fsdp_wrapped_module`` (the ranks skip both)."""
        return self.reference and (bool(self.comp.replicates) or self.ddp)

    @property
    def sharded_grads(self) -> bool:
        """FSDP1 keeps local shards of gradients: their norms are not compared (NaN)."""
        return self.fsdp1 and self.comp.wrapper is not Wrapper.FSDP1_NO_SHARD

    @property
    def no_sync(self) -> bool:
        return self.wrapper and self.body.training.accum_sync is AccumSync.NO_GRAD_SYNC

    @property
    def compiled(self) -> bool:
        return self.body.training.compile is not Compile.NONE

    @property
    def dtensor(self) -> bool:
        return bool(self.comp.shards) or self.comp.meta_init

    @property
    def skips(self) -> bool:
        return bool(self.body.training.skips)

    @property
    def unfreeze(self) -> bool:
        return bool(self.body.training.unfreeze)

    def _ran_first(self, path: str) -> bool:
        """Whether the module at ``path`` ran in the first forward, where the contracts are read."""
        skipped = self.body.training.skipped_at(0, 0)
        return not any(path == s or path.startswith(s + ".") for s in skipped)

    def reshard_contract(self) -> dict[str, tuple[bool, list[str]]]:
        """Per fully_shard call with a bool reshard_after_forward: the modules whose own
        parameters it manages (every module under its members that is not inside another unit,
        fully_shard or replicate, nested in them), as fuzz._rank.parity records the contract."""
        if self.metamorphic:
            return {}
        comp, tree = self.comp, self.body.tree
        units = comp.sharded_paths + list(comp.replicates)
        # Modules without parameters of their own contribute no flags; leaving them out changes nothing.
        modules = [path for path, node in tree.paths().items() if owns_params(node)]
        return {
            spec.path: (
                spec.reshard_after_forward,
                [m for member in spec.paths for m in _owned(member, modules, units)],
            )
            for spec in comp.shards
            if isinstance(spec.reshard_after_forward, bool)
            # a unit holding no parameters of its own has nothing to check
            and any(_owned(member, modules, units) for member in spec.paths)
            # nor one with a member left out of the first forward: all left out, it never
            # unsharded; some, and torch before 2.13 does not reshard the group (the ranks
            # check the latter where torch completes such groups; the script never does)
            and all(self._ran_first(member) for member in spec.paths)
        }

    def replicate_contract(self) -> dict[str, list[str]]:
        """Replicated modules that ran in the first forward (lazy init sets what replicate manages)."""
        if self.metamorphic:
            return {}
        return {
            path: sorted(_replicated_names(self.body.tree, self.comp, path))
            for path in self.comp.replicates
            if self._ran_first(path)
        }

    def output_dtype_contract(self) -> dict[str, str]:
        if self.metamorphic:
            return {}
        return {
            spec.path: spec.mixed_precision.output_dtype.value
            for spec in self.comp.shards
            if spec.mixed_precision is not None
            and spec.mixed_precision.output_dtype is not None
            and self._ran_first(spec.path)
        }

    def param_dtype_contract(self) -> dict[str, tuple[str, list[str]]]:
        """Per fully_shard call with a param_dtype: the modules (with parameters of their own) it
        is the innermost unit of, which must see param_dtype parameters as their forward starts."""
        if self.metamorphic:
            return {}
        modules = [p for p, node in self.body.tree.paths().items() if owns_params(node) and self._ran_first(p)]
        return {
            spec.path: (
                spec.mixed_precision.param_dtype.value,
                [m for m in modules if _unit_of(m, self.comp) == spec.path],
            )
            for spec in self.comp.shards
            if spec.mixed_precision is not None and spec.mixed_precision.param_dtype is not None
        }

    @property
    def dtypes(self) -> bool:
        return bool(self.output_dtype_contract() or self.param_dtype_contract())

    @property
    def contracts(self) -> bool:
        return not self.metamorphic and bool(self.reshard_contract() or self.comp.replicates or self.dtypes)


def render_parity(entry: Entry, source: str) -> str:
    case = entry.case
    body = case.body
    assert isinstance(body, ParityBody)
    if case.property not in PARITY_PROPERTIES:
        raise InvalidArgument(
            f"{source or 'entry'}: property {case.property!r} judges parity bodies differently; "
            f"repro renders the checks of {sorted(PARITY_PROPERTIES)} only"
        )
    uses = _Uses(case, body)
    sections = [
        _header(entry, source, uses),
        render_imports(uses) + "\n\n" + _constants(entry, uses).strip("\n"),
        render_classes(body.tree, skips=uses.skips),
        render_model(body.tree, skips=uses.skips),
        render_composition(uses),
        render_optimizer(uses),
        render_training(uses),
        render_checks(uses),
        render_main(uses),
    ]
    return "\n\n\n".join(s.strip("\n") for s in sections if s.strip()) + "\n"


def render_metamorphic(entry: Entry, source: str) -> str:
    """A ``metamorphic`` case: train under the composition (run A) and under the variant (run B),
    each as the ranks do (:func:`fuzz._rank.parity.run_metamorphic`), and compare B with A as
    :func:`fuzz.properties.parity.compare_runs` does."""
    case = entry.case
    body = case.body
    assert isinstance(body, MetamorphicBody)
    a = _Uses(case, ParityBody(tree=body.tree, composition=body.composition, training=body.training), "_a")
    b = _Uses(case, ParityBody(tree=body.tree, composition=body.variant, training=body.training), "_b")
    skips = a.skips
    helpers = list(dict.fromkeys(h for side in (a, b) for h in render_helpers(side).split("\n\n\n") if h.strip()))
    sections = [
        _header(entry, source, a, b),
        render_imports(a, b) + "\n\n" + _constants(entry, a, b).strip("\n"),
        render_classes(body.tree, skips=skips),
        render_model(body.tree, skips=skips),
        render_composition(a),
        render_composition(b),
        render_optimizer(a, b),
        _BATCHES,
        *helpers,
        render_meta(a),
        render_train(a),
        render_meta(b),
        render_train(b),
        render_checks(a),
        render_main(a, b),
    ]
    return "\n\n\n".join(s.strip("\n") for s in sections if s.strip()) + "\n"


def describe_composition(uses: _Uses) -> str:
    """What the composed model runs under, in words: "under checkpoint and fully_shard on a ..."."""
    comp = uses.comp
    mesh = uses.mesh
    on_mesh = f" on a {mesh[0]}x{mesh[1]} (replicate, shard) device mesh" if mesh and len(mesh) == 2 else ""
    if comp.wrapper is Wrapper.DDP:
        what = "wrapped in DistributedDataParallel"
    elif uses.fsdp1:
        what = (
            f"wrapped in FullyShardedDataParallel (FSDP1, ShardingStrategy.{_FSDP1_STRATEGIES[comp.wrapper]}){on_mesh}"
        )
        if comp.auto_wrap:
            what += ", every block wrapped by ModuleWrapPolicy"
    else:
        apis = [api for api in ("checkpoint", "fully_shard", "replicate") if any(a == api for a, _ in comp.steps())]
        what = "under " + (", ".join(apis[:-1]) + " and " + apis[-1] if len(apis) > 1 else apis[0]) + on_mesh
    if uses.wrapper and comp.checkpoints:
        what = f"under checkpoint on submodules, {what}"
    if comp.meta_init:
        what += ", built on the meta device"
    return what


def _wrap_signature(signature: str) -> str:
    """The signature indented, split at '@' and '/' where it is longer than a line allows."""
    lines, line = [], "    "
    for part in re.split(r"(?<=[@/])", signature):
        if len(line) + len(part) > 100 and line.strip():
            lines.append(line)
            line = "      "
        line += part
    return "\n".join([*lines, line])


def _long_str(text: str) -> str:
    """A string literal, as adjacent literals in parentheses where one line would be too long."""
    if len(text) < 90:
        return _q(text)
    parts = [text[i : i + 80] for i in range(0, len(text), 80)]
    return "(\n" + "".join(f"    {_q(p)}\n" for p in parts) + ")"


def _header(entry: Entry, source: str, uses: _Uses, variant: _Uses | None = None) -> str:
    case = entry.case
    training = uses.body.training
    tol = tolerance_for(training.dtype.value)
    summary = textwrap.fill(entry.summary or "(no summary)", 92, initial_indent="    ", subsequent_indent="    ")
    versions = ", ".join(f"{k} {v}" for k, v in sorted(entry.versions.items()) if k in ("torch", "python", "device"))
    name = _doc(source or "a shardfuzz corpus entry")
    summary, versions = _doc(summary), _doc(versions)
    contracts = []
    if uses.reshard_contract():
        contracts.append(
            "the parameters of every fully_shard unit must be sharded iff its reshard_after_forward is True"
        )
    if uses.dtypes:
        contracts.append("each module must see its unit's param_dtype parameters and each unit return its output_dtype")
    if uses.comp.replicates:
        contracts.append("replicate must manage exactly the parameters that no fully_shard holds")
    after_forward = ("; and right after the first forward " + "; ".join(contracts)) if contracts else ""
    if variant is not None:
        norms = " (FSDP1's local gradient shards are not)" if uses.sharded_grads or variant.sharded_grads else ""
        what = f"""Every rank trains the model below twice, from the same weights, batches and RNG state:
run A {describe_composition(uses)}, and run B {describe_composition(variant)}. The change must not
change numerics: every rank's losses and gradient norms{norms}, and the full parameters after every
step, of run B must agree with run A's within rtol={tol.rtol!r}, atol={tol.atol!r} ({training.dtype.value})."""
    elif uses.reference:
        replicas = " Parameters held whole on every rank must be bitwise equal across ranks." if uses.replicas else ""
        norms = " (FSDP1's local gradient shards are not)" if uses.sharded_grads else ""
        what = f"""Every rank trains the model below {describe_composition(uses)}, and the same plain
model whose gradients are averaged over the ranks by an all_reduce per step (data parallelism,
nothing to get wrong), each on its own slice of the same batches, from the same weights and RNG
state. Every rank's losses and gradient norms{norms}, and the full parameters after every step,
must agree within rtol={tol.rtol!r}, atol={tol.atol!r} ({training.dtype.value}){after_forward}.{replicas}"""
    else:
        what = f"""Every rank trains the model below {describe_composition(uses)} with
MixedPrecisionPolicy; on every rank, right after the first forward, {"; ".join(contracts)}.
Numerics are not compared against a full-precision reference (shardfuzz's mixed_precision
property judges these contracts only); an exception on any rank is a failure too."""
    what = "\n".join(textwrap.fill(p.replace("\n", " "), 96, break_on_hyphens=False) for p in what.split("\n\n"))
    return f'''#!/usr/bin/env python3
"""Reproducer for {name} (generated by `python -m fuzz repro`).

Recorded failure ({entry.status}; reproduced {entry.reproduced}/{entry.reruns} re-runs):
{_doc(_wrap_signature(entry.signature))}
{summary}
Found with {versions or "unknown versions"}; backend {entry.backend}, {case.world_size} ranks.

{what}

    torchrun --nproc-per-node {case.world_size} THIS_FILE.py [--backend gloo|nccl]

gloo on CPU by default; nccl (one GPU per rank) with --backend nccl or REPRO_BACKEND=nccl.
Exit status 0: everything agrees (the failure does not reproduce); 1: it does; 2: bad usage.
"""'''


def _docstring(text: str, indent: str = "    ") -> str:
    """A docstring line (or lines, wrapped at 100 columns) for generated code, with its newline."""
    lines = textwrap.wrap(text, 100 - len(indent) - 3, break_on_hyphens=False)
    return indent + '"""' + f"\n{indent}".join(lines) + '"""\n'


def _doc(text: str) -> str:
    """``text`` made safe inside a triple-quoted docstring (messages can hold quotes, backslashes)."""
    return text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')


def render_imports(*sides: _Uses) -> str:
    """The imports of a script that trains under each of ``sides`` (one composition, or the two
    of a metamorphic case)."""
    apis = {api for u in sides for api, _ in u.comp.steps()} | (
        {"checkpoint"} if any(u.comp.checkpoints for u in sides) else set()
    )
    shards = any(u.comp.shards for u in sides)
    fsdp1 = any(u.fsdp1 for u in sides)
    lines = ["import argparse", "import faulthandler", "import json", "import os", "import sys"]
    if any(u.no_sync or (u.fsdp1 and u.reference) for u in sides):
        lines.append("from contextlib import nullcontext")
    lines += [
        "",
        "import torch",
        "import torch.distributed as dist",
        "import torch.nn.functional as F",
        "from torch import nn",
    ]
    composable = sorted(apis & {"checkpoint", "replicate"})
    if composable:
        lines.append(f"from torch.distributed._composable import {', '.join(composable)}")
    if any(u.mesh for u in sides):
        lines.append("from torch.distributed.device_mesh import init_device_mesh")
    mp = any(_uses_mp(u.comp) for u in sides)
    fsdp = (["fully_shard"] if shards else []) + (["MixedPrecisionPolicy"] if mp else [])
    if fsdp1:
        lines.append("from torch.distributed.fsdp import FullyShardedDataParallel as FSDP")
        fsdp.append("ShardingStrategy")
    if fsdp:
        # isort's order: classes before functions
        lines.append(f"from torch.distributed.fsdp import {', '.join(sorted(fsdp, key=lambda n: (n[0].islower(), n)))}")
    if any(u.fsdp1 and u.comp.auto_wrap for u in sides):
        lines.append("from torch.distributed.fsdp.wrap import ModuleWrapPolicy")
    if any(u.dtensor for u in sides):
        shard = ", Shard" if any(spec.shard_dim for u in sides for spec in u.comp.shards) else ""
        meta = ", distribute_tensor" if any(u.comp.meta_init for u in sides) else ""
        lines.append(f"from torch.distributed.tensor import DTensor{shard}{meta}")
    if any(u.ddp for u in sides):
        lines.append("from torch.nn.parallel import DistributedDataParallel as DDP")
    return "\n".join(lines)


def _uses_mp(comp: Composition) -> bool:
    return any(spec.mixed_precision is not None for spec in comp.shards)


def _constants(entry: Entry, uses: _Uses, *others: _Uses) -> str:
    """The script's constants; ``others``: the other compositions a script trains under, whose
    meshes are named by their suffixes too (``MESH_SHAPE_B``)."""
    case = entry.case
    training = uses.body.training
    tol = tolerance_for(training.dtype.value)
    out = f"""
# the failure shardfuzz saw, and the check that disagreed
RECORDED = {_long_str(entry.signature)}
RECORDED_CHECK = {_q(entry.details.get("check"))}
WORLD_SIZE = {case.world_size}
SEED = {case.seed}
WIDTH = {uses.body.tree.width}
STEPS = {training.steps}
MICROBATCHES = {training.grad_accum}  # per optimizer step
BATCH_PER_RANK = {training.batch_per_rank}
SAME_INPUT = {training.same_input}  # every rank trains on the first slice (else on its own)
DTYPE = torch.{training.dtype.value}
"""
    if uses.skips:
        at: dict[tuple[int, int], list[str]] = {}
        for skip in training.skips:
            at.setdefault((skip.step, skip.microbatch), []).append(skip.path)
        rows = "".join(f"    {key!r}: {_q(paths)},\n" for key, paths in sorted(at.items()))
        out += "# (step, microbatch) -> the modules left out of that forward (their parent Block skips them)\n"
        out += "SKIPS = {\n" + rows + "}\n"
    if uses.unfreeze:
        steps: dict[int, list[str]] = {}
        for u in training.unfreeze:
            steps.setdefault(u.step, []).append(u.path)
        rows = "".join(f"    {step!r}: {_q(paths)},\n" for step, paths in sorted(steps.items()))
        out += "# step -> frozen leaves whose parameters train from then on (the optimizer holds them from the start)\n"
        out += "UNFREEZE = {\n" + rows + "}\n"
    if uses.compares:
        out += f"RTOL, ATOL = {tol.rtol!r}, {tol.atol!r}  # shardfuzz's tolerance policy for {training.dtype.value}\n"
    for side in (uses, *others):
        mesh = side.mesh
        names = f"{side.const('MESH_SHAPE')}, {side.const('MESH_DIM_NAMES')}"
        if mesh is not None and len(mesh) == 2:
            out += f'{names} = {mesh!r}, ("replicate", "shard")  # HSDP: replicas of shard groups\n'
        elif mesh is not None:
            out += f'{names} = (WORLD_SIZE,), ("shard",)\n'
    return out + f"TIMEOUT_S = {TIMEOUT_S}\n"


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

_SKIPPING_BLOCK_CLASS = '''
class Block(nn.Module):
    """Runs its children in order, except those named in ``skipped`` (set per microbatch by
    set_skipped), then * scale (a parameter of its own), + shift (a buffer) and + its input
    (residual), each if it has it."""

    def __init__(self, *children, residual=False, scale=False, shift=False):
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)
        self.residual = residual
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(WIDTH)) if scale else None
        if shift:
            self.register_buffer("shift", 0.1 * torch.randn(WIDTH))
        else:
            self.shift = None
        self.skipped = frozenset()

    def forward(self, x):
        y = x
        for name, child in self.named_children():
            if name not in self.skipped:
                y = child(y)
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


def render_classes(tree: ModuleTree, *, skips: bool = False) -> str:
    """The module classes the tree needs beyond torch.nn (with ``skips``, every block is a Block
    that can leave children out of forward)."""
    nodes = _nodes(tree)
    out = []
    if skips:
        out.append(_SKIPPING_BLOCK_CLASS)
    elif any(isinstance(n, Block) and not _is_plain(n) for n in nodes):
        out.append(_BLOCK_CLASS)
    if any(isinstance(n, Leaf) and n.kind is LeafKind.CONV1D for n in nodes):
        out.append(_CONV_CLASS)
    return "\n\n\n".join(s.strip("\n") for s in out)


def render_model(tree: ModuleTree, *, skips: bool = False) -> str:
    body = render_node(tree.root, "", 1, skips=skips)
    return (
        "def build_model():\n"
        '    """Submodule names are the case\'s paths (commented), as model.get_submodule(path) finds them."""\n'
        f"    return {body.lstrip()}\n"
    )


def render_node(node: Node, path: str, depth: int, *, skips: bool = False) -> str:
    pad = "    " * depth
    if isinstance(node, Leaf):
        expr = LEAF_RENDERERS[node.kind](node)
        return pad + expr + (".requires_grad_(False)" if node.frozen else "")
    lines = []
    for i, child in enumerate(node.children):
        child_path = f"{path}.{i}" if path else str(i)
        lines.append(render_node(child, child_path, depth + 1, skips=skips) + f",  # {_q(child_path)}")
    opts = [name for name, on in (("residual", node.residual), ("scale", node.scale), ("shift", node.buffer)) if on]
    cls = "nn.Sequential" if not opts and not skips else "Block"
    tail = "".join(f"{pad}    {name}=True,\n" for name in opts)
    return f"{pad}{cls}(\n" + "\n".join(lines) + "\n" + tail + f"{pad})"


# -- the composition ----------------------------------------------------------------------------


def render_composition(uses: _Uses) -> str:
    """compose(): the composable API calls in the order the fuzzer applies them
    (``Composition.steps()``), or the wrapper; then the contracts they promise."""
    comp = uses.comp
    out = [render_placement_fn(dim, uses) for dim in sorted({spec.shard_dim for spec in comp.shards if spec.shard_dim})]
    if uses.wrapper:
        calls = [f"    checkpoint({_module(p)})" for p in comp.checkpoints]  # before wrapping, as the ranks do
        calls.append(render_wrapper(uses))
        doc = "Checkpoint on submodules, then the wrapper" if comp.checkpoints else "The wrapper"
        doc += " over the whole model; returns it."
    else:
        specs = {spec.path: spec for spec in comp.shards}
        policies = _policy_names(comp)
        calls = [_call(f"{name} = MixedPrecisionPolicy", render_mp_args(mp)) for mp, name in policies.items()]
        for api, path in comp.steps():
            if api == "fully_shard":
                calls.append(render_fully_shard(specs[path], policies, uses.suffix))
            elif api == "checkpoint":
                calls.append(f"    checkpoint({_module(path)})")
            else:
                args = [_module(path), 'device_ids=None if device.type == "cpu" else [device]']
                if comp.find_unused:
                    args.append("find_unused_parameters=True")
                calls.append(_call("replicate", args))
        order = (
            ["checkpoint", "fully_shard", "replicate"]
            if comp.checkpoint_first
            else ["fully_shard", "replicate", "checkpoint"]
        )
        used = {api for api, _ in comp.steps()}
        order_text = ", ".join(api for api in order if api in used)
        if comp.shards:
            sharded = comp.sharded_paths
            tops = [p for p in sharded if not any(q != p and (q == "" or p.startswith(q + ".")) for q in sharded)]
            calls.append(f"    return model, [{', '.join(_module(p) for p in tops)}]")
            doc = f"Deepest modules first, per module {order_text}; returns the model and its outermost FSDP modules."
        else:
            calls.append("    return model")
            doc = f"Deepest modules first, per module {order_text}."
    head = f"def {uses.fn('compose')}(model, mesh, device):\n"
    out.append(head + _docstring(doc) + "".join(f"{call}\n" for call in calls))
    out.append(render_contracts(uses))
    return "\n\n\n".join(s.strip("\n") for s in out if s.strip())


def _module(path: str) -> str:
    return "model" if path == "" else f"model.get_submodule({_q(path)})"


def render_placement_fn(dim: int, uses: _Uses) -> str:
    return f'''
def shard_dim_{dim}{uses.suffix}(param):
    """Shard({dim}) where dim {dim} splits evenly over the ranks of a shard group, else the default
    Shard(0): fully_shard supports uneven sharding on dim 0 only."""
    if param.ndim > {dim} and param.shape[{dim}] % {uses.const("MESH_SHAPE")}[-1] == 0:
        return Shard({dim})
    return None
'''


def _policy_names(comp: Composition) -> dict[MixedPrecision, str]:
    """A variable name per distinct MixedPrecisionPolicy, in the order fully_shard first uses them."""
    specs = {spec.path: spec for spec in comp.shards}
    used = [specs[path].mixed_precision for api, path in comp.steps() if api == "fully_shard"]
    distinct = list(dict.fromkeys(mp for mp in used if mp is not None))
    return {mp: "mp_policy" if len(distinct) == 1 else f"mp_policy_{i}" for i, mp in enumerate(distinct, 1)}


def render_fully_shard(spec: ShardSpec, policies: dict[MixedPrecision, str], suffix: str = "") -> str:
    modules = [_module(p) for p in spec.paths]
    target = f"[{', '.join(modules)}]" if spec.group else modules[0]
    kwargs = [target, "mesh=mesh", f"reshard_after_forward={spec.reshard_after_forward!r}"]
    if spec.shard_dim:
        kwargs.append(f"shard_placement_fn=shard_dim_{spec.shard_dim}{suffix}")
    if spec.mixed_precision is not None:
        kwargs.append(f"mp_policy={policies[spec.mixed_precision]}")
    return _call("fully_shard", kwargs)


def _call(head: str, args: list[str], indent: str = "    ") -> str:
    """``head(args)`` on one line at ``indent`` if it fits in 100 columns, else one argument a line."""
    one = f"{indent}{head}({', '.join(args)})"
    if len(one) <= 100:
        return one
    return f"{indent}{head}(\n" + "".join(f"{indent}    {a},\n" for a in args) + f"{indent})"


def render_mp_args(mp: MixedPrecision) -> list[str]:
    """MixedPrecisionPolicy's arguments for the fields the case sets (None is torch's default)."""
    args = [
        f"{name}=torch.{getattr(mp, name).value}"
        for name in ("param_dtype", "reduce_dtype", "output_dtype")
        if getattr(mp, name) is not None
    ]
    if not mp.cast_forward_inputs:
        args.append("cast_forward_inputs=False")
    return args


def render_wrapper(uses: _Uses) -> str:
    comp = uses.comp
    if comp.wrapper is Wrapper.DDP:
        args = ["model", 'device_ids=None if device.type == "cpu" else [device]']
        return _call("return DDP", args + (["find_unused_parameters=True"] if comp.find_unused else []))
    kwargs = ["model", f"sharding_strategy=ShardingStrategy.{_FSDP1_STRATEGIES[comp.wrapper]}"]
    if comp.wrapper is Wrapper.FSDP1_HYBRID_SHARD:
        kwargs.append("device_mesh=mesh")
    if comp.auto_wrap:
        kwargs.append("auto_wrap_policy=ModuleWrapPolicy({nn.Sequential})")  # every block: Block is one too
    kwargs += ["device_id=device", "use_orig_params=True"]
    return _call("return FSDP", kwargs)


def render_contracts(uses: _Uses) -> str:
    """The contracts as tables the checks read, each only if the case has something under it."""
    out = []
    reshard = uses.reshard_contract()
    if reshard:
        rows = "".join(f"    {_q(unit)}: ({raf}, {_names(mods)}),\n" for unit, (raf, mods) in reshard.items())
        out.append(
            "# fully_shard unit (its first module) -> (reshard_after_forward, modules whose own parameters it holds)\n"
            "RESHARD_CONTRACT = {\n" + rows + "}\n"
        )
    outputs = uses.output_dtype_contract()
    if outputs:
        rows = "".join(f"    {_q(unit)}: {_q(dtype)},\n" for unit, dtype in outputs.items())
        out.append(
            "# fully_shard unit -> the dtype its output must have (output_dtype)\nOUTPUT_DTYPE_CONTRACT = {\n"
            + rows
            + "}\n"
        )
    params = uses.param_dtype_contract()
    if params:
        rows = "".join(f"    {_q(unit)}: ({_q(dtype)}, {_names(mods)}),\n" for unit, (dtype, mods) in params.items())
        out.append(
            "# fully_shard unit -> (param_dtype, the modules it is the innermost unit of, which must see\n"
            "# parameters of that dtype as their forward starts)\nPARAM_DTYPE_CONTRACT = {\n" + rows + "}\n"
        )
    replicated = uses.replicate_contract()
    if replicated:
        rows = "".join(f"    {_q(path)}: {_names(names)},\n" for path, names in replicated.items())
        out.append(
            "# replicated module -> the parameters replicate must manage: exactly those no fully_shard holds\n"
            "REPLICATE_CONTRACT = {\n" + rows + "}\n"
        )
    return "\n".join(out)


def _owned(member: str, modules: list[str], units: list[str]) -> list[str]:
    out = []
    for sub in modules:
        if not (sub == member or member == "" or sub.startswith(member + ".")):
            continue
        nested = [o for o in units if o != member and (member == "" or o.startswith(member + "."))]
        if sub != member and any(sub == o or sub.startswith(o + ".") for o in nested):
            continue
        out.append(sub)
    return out


# -- training -----------------------------------------------------------------------------------


def render_optimizer(uses: _Uses, *others: _Uses) -> str:
    training = uses.body.training
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
    if uses.unfreeze:
        head = (
            "def make_optimizer(net, later):\n"
            '    """Over the trainable parameters and the frozen ones in ``later`` (unfrozen later)."""\n'
            "    held = {id(p) for ps in later.values() for p in ps}\n"
            "    params = [p for p in net.parameters() if p.requires_grad or id(p) in held]\n"
        )
    else:
        head = "def make_optimizer(net):\n    params = [p for p in net.parameters() if p.requires_grad]\n"
    out = (
        head
        + groups
        + f"    return {ctor}\n\n\n"
        + f"SET_TO_NONE = {training.set_to_none!r}  # zero_grad(set_to_none=...)\n"
    )
    sync = training.accum_sync
    if any(side.comp.shards for side in (uses, *others)):
        grad_sync, all_reduce = sync is not AccumSync.NO_GRAD_SYNC, sync is AccumSync.ALWAYS
        out += (
            f"# On a step's microbatches before the last (accum_sync={sync.value}): set_requires_gradient_sync(...),\n"
            f"# set_requires_all_reduce(...) on the outermost FSDP modules; the last one always reduces.\n"
            f"GRADIENT_SYNC_BEFORE_LAST, ALL_REDUCE_BEFORE_LAST = {grad_sync}, {all_reduce}\n"
        )
    elif uses.wrapper and sync is AccumSync.NO_ALL_REDUCE and training.grad_accum > 1:
        out += (
            f"# accum_sync={sync.value}: {uses.comp.wrapper.value} has no switch for it; like shardfuzz's ranks, this\n"
            "# reduces gradients on every microbatch.\n"
        )
    return out


def render_training(uses: _Uses) -> str:
    parts = (_BATCHES, render_helpers(uses), render_meta(uses), render_train(uses))
    return "\n\n\n".join(s.strip("\n") for s in parts if s.strip())


def render_meta(uses: _Uses) -> str:
    """compose_from_meta(), when the case builds its model on the meta device."""
    if not uses.comp.meta_init:
        return ""
    got, ret = ("net, roots", "model, net, roots") if uses.comp.shards else ("net", "model, net")
    return (
        f"def {uses.fn('compose_from_meta')}(values, mesh, device):\n"
        '    """The model built on the meta device and composed there; then to_empty and the\n'
        "    seeded values copied in, each sharded parameter through distribute_tensor with its\n"
        '    own mesh and placements. FSDP2 initialises lazily at the first forward."""\n'
        '    with torch.device("meta"):\n'
        "        model = build_model()\n"
        "    model.to(DTYPE)\n"
        f"    {got} = {uses.fn('compose')}(model, mesh, device)\n"
        "    model.to_empty(device=device)\n"
        "    with torch.no_grad():\n"
        "        for name, t in [*model.named_parameters(), *model.named_buffers()]:\n"
        "            src = values[name]\n"
        "            t.copy_(distribute_tensor(src, t.device_mesh, t.placements) if isinstance(t, DTensor) else src)\n"
        f"    return {ret}\n"
    )


_BATCHES = '''
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
'''

_FULL = """
def full(t):
    return t.full_tensor() if isinstance(t, DTensor) else t
"""

_PARAMETER = '''
def parameter(model, name):
    """A parameter by its plain-model name, as an attribute: FSDP1 can leave one registered as a
    plain tensor view (a frozen one under NO_SHARD after backward), which named_parameters()
    then skips (pytorch/pytorch#85831)."""
    owner, _, attr = name.rpartition(".")
    return getattr(model.get_submodule(owner), attr)
'''

_WATCH_DTYPES = '''
def watch_dtypes(model):
    """Hooks for the first forward: the dtype of the parameters each module of
    PARAM_DTYPE_CONTRACT sees as its forward starts, and of each unit's output."""
    seen = {"param_dtypes": {}, "output_dtypes": {}}

    def on_start(name):
        def hook(module, args):
            seen["param_dtypes"].setdefault(name, str(next(module.parameters(False)).dtype).removeprefix("torch."))

        return hook

    def on_output(unit):
        def hook(module, args, output):
            seen["output_dtypes"].setdefault(unit, str(output.dtype).removeprefix("torch."))

        return hook

    units, modules = {OUTPUT_DTYPES}, {PARAM_MODULES}
    hooks = [model.get_submodule(u).register_forward_hook(on_output(u)) for u in units]
    hooks += [model.get_submodule(m).register_forward_pre_hook(on_start(m)) for m in modules]
    return seen, hooks
'''


_SET_SKIPPED = '''
def set_skipped(blocks, paths):
    """Leave the modules at ``paths`` out of forward until the next call (the rest run)."""
    skipped = {p: set() for p in blocks}
    for path in paths:
        parent, _, name = path.rpartition(".")
        skipped[parent].add(name)
    for p, block in blocks.items():
        if block.skipped != skipped[p]:
            block.skipped = frozenset(skipped[p])
'''

_UNFROZEN_LATER = '''
def unfrozen_later(net):
    """Per path of UNFREEZE: the parameters of that (frozen) leaf as the composed model holds
    them, found by their plain-model names (the numeric parts) through any wrapper."""
    out = {path: [] for paths in UNFREEZE.values() for path in paths}
    for name, p in net.named_parameters():
        owner = ".".join(c for c in name.split(".")[:-1] if c.isdigit())
        if owner in out:
            out[owner].append(p)
    return out
'''


def render_helpers(uses: _Uses) -> str:
    out = []
    if uses.skips:
        out.append(_SET_SKIPPED)
    if uses.unfreeze:
        out.append(_UNFROZEN_LATER)
    if uses.dtensor:
        out.append(_FULL)
    if uses.fsdp1:
        out.append(_PARAMETER)
    if uses.dtypes:
        outputs = "OUTPUT_DTYPE_CONTRACT" if uses.output_dtype_contract() else "[]"
        modules = "[m for _, ms in PARAM_DTYPE_CONTRACT.values() for m in ms]" if uses.param_dtype_contract() else "[]"
        out.append(_WATCH_DTYPES.replace("{OUTPUT_DTYPES}", outputs).replace("{PARAM_MODULES}", modules))
    if uses.contracts:
        out.append(render_after_forward(uses))
    return "\n\n\n".join(s.strip("\n") for s in out)


def render_after_forward(uses: _Uses) -> str:
    lines = [
        "def contracts_after_forward(model" + (", watched" if uses.dtypes else "") + "):",
        '    """What the contracts are about, right after the first forward."""',
    ]
    if uses.dtypes:
        lines += ["    seen, hooks = watched", "    for h in hooks:", "        h.remove()"]
    lines.append("    return {")
    if uses.reshard_contract():
        lines += [
            '        "sharded": {  # per unit: is each of its parameters registered sharded (a DTensor)?',
            "            unit: [isinstance(p, DTensor) for m in ms for p in model.get_submodule(m).parameters(False)]",
            "            for unit, (_, ms) in RESHARD_CONTRACT.items()",
            "        },",
        ]
    if uses.comp.replicates:
        lines += [
            '        "replicated": {  # per replicated module: the parameters replicate manages',
            '            path: sorted(getattr(replicate.state(model.get_submodule(path)), "_param_names", []))',
            "            for path in REPLICATE_CONTRACT",
            "        },",
        ]
    if uses.dtypes:
        lines.append("        **seen,")
    lines.append("    }")
    return "\n".join(lines) + "\n"


def _render_compile(uses: _Uses) -> list[str]:
    """torch.compile of the composed model (never of the reference), after a reset of Dynamo."""
    if not uses.compiled:
        return []
    backend = _q(uses.body.training.compile.value)
    if uses.reference:
        return [
            f"    forward = torch.compile(net, backend={backend}) if composed else net",
        ]
    return [f"    forward = torch.compile(net, backend={backend})"]


def render_train(uses: _Uses) -> str:
    comp = uses.comp
    ref = uses.reference
    what = describe_composition(uses)
    if ref:
        lines = [
            "def train(composed, rank, device, mesh):",
            _docstring(f"One run: {what} (composed), or plain with gradients all-reduced (reference).").rstrip("\n"),
        ]
    else:
        run = f"Run {uses.suffix.lstrip('_').upper()}," if uses.suffix else "The run"
        lines = [f"def {uses.fn('train')}(rank, device, mesh):", _docstring(f"{run} {what}.").rstrip("\n")]
    lines += ["    torch.manual_seed(SEED)", "    with device:", "        model = build_model()", "    model.to(DTYPE)"]
    blocks = "    blocks = {n: m for n, m in model.named_modules() if isinstance(m, Block)}  # by plain-model path"
    if uses.skips and not comp.meta_init:
        lines.append(blocks)
    if comp.meta_init:
        got = "model, net, roots" if comp.shards else "model, net"
        plain = "net, roots = model, []" if comp.shards else "net = model"
        if ref:
            lines += [
                "    if composed:",
                f"        {got} = compose_from_meta(model.state_dict(), mesh, device)",
                "    else:",
                f"        {plain}",
            ]
        else:
            lines.append(f"    {got} = {uses.fn('compose_from_meta')}(model.state_dict(), mesh, device)")
    elif uses.fsdp1:
        lines.append("    names = [n for n, _ in model.named_parameters()]  # before FSDP1 wraps anything")
    if comp.meta_init:
        pass  # composed in compose_from_meta above
    elif comp.shards:
        lines.append(
            "    net, roots = compose(model, mesh, device) if composed else (model, [])"
            if ref
            else f"    net, roots = {uses.fn('compose')}(model, mesh, device)"
        )
    else:
        lines.append(
            "    net = compose(model, mesh, device) if composed else model"
            if ref
            else f"    net = {uses.fn('compose')}(model, mesh, device)"
        )
    if uses.skips and comp.meta_init:
        lines.append(blocks)
    if uses.dtypes:
        lines.append(
            "    watched = watch_dtypes(model) if composed else None" if ref else "    watched = watch_dtypes(model)"
        )
    if uses.unfreeze:
        lines += ["    later = unfrozen_later(net)", "    opt = make_optimizer(net, later)"]
    else:
        lines.append("    opt = make_optimizer(net)")
    lines += [
        *_render_compile(uses),
        "    torch.manual_seed((SEED * 7919 + rank + 1) % 2**63)  # dropout masks: "
        + ("same in both runs of a rank" if ref else "the fuzzer's seed for this rank"),
        '    run = {"losses": [], "grad_norms": [], "params": []}',
        "    for s, step in enumerate(batches(rank, device)):"
        if uses.skips or uses.unfreeze
        else "    for step in batches(rank, device):",
    ]
    if uses.unfreeze:
        lines += [
            "        for path in UNFREEZE.get(s, []):",
            "            for p in later[path]:",
            "                p.requires_grad_(True)",
        ]
    lines += ["        step_losses = []", "        for i, (x, y) in enumerate(step):"]
    if uses.skips:
        lines.append("            set_skipped(blocks, SKIPS.get((s, i), []))")
    if comp.shards or uses.no_sync:
        lines.append("            last = i == len(step) - 1")
    if comp.shards:
        lines += [
            "            for m in roots:",
            "                m.set_requires_gradient_sync(last or GRADIENT_SYNC_BEFORE_LAST)",
            "                m.set_requires_all_reduce(last or ALL_REDUCE_BEFORE_LAST)",
        ]
    pad = "            "
    if uses.no_sync:
        no_sync = (
            "net.no_sync() if composed and not last else nullcontext()"
            if ref
            else "net.no_sync() if not last else nullcontext()"
        )
        lines.append(f"{pad}with {no_sync}:  # accum_sync=no_grad_sync")
        pad += "    "
    lines.append(f"{pad}out = {'forward' if uses.compiled else 'net'}(x)")
    if uses.contracts:
        watched = ", watched" if uses.dtypes else ""
        cond = 'composed and "contract" not in run' if ref else '"contract" not in run'
        lines += [f"{pad}if {cond}:", f'{pad}    run["contract"] = contracts_after_forward(model{watched})']
    lines += [f"{pad}loss = F.mse_loss(out.to(y.dtype), y)", f"{pad}loss.backward()"]
    lines.append("            step_losses.append(loss.item())")
    if ref:
        lines += [
            "        if not composed:",
            "            for p in model.parameters():",
            "                if p.grad is not None:",
            "                    dist.all_reduce(p.grad)",
            "                    p.grad /= WORLD_SIZE",
        ]
    grad = "full(p.grad)" if uses.dtensor else "p.grad"
    norm = [
        "norm = torch.zeros((), dtype=torch.float64)",
        "for p in net.parameters():",
        "    if p.grad is not None:",
        f"        norm += {grad}.double().pow(2).sum().cpu()",
        'run["grad_norms"].append(float(norm.sqrt()))',
    ]
    if uses.sharded_grads and ref:
        lines += ["        if composed:  # FSDP1 keeps local shards of gradients: not compared"]
        lines += ['            run["grad_norms"].append(float("nan"))', "        else:"]
        lines += [f"            {line}" for line in norm]
    elif uses.sharded_grads:
        lines += ['        run["grad_norms"].append(float("nan"))  # FSDP1 keeps local shards of gradients']
    else:
        lines += [f"        {line}" for line in norm]
    lines += [
        "        opt.step()",
        "        opt.zero_grad(set_to_none=SET_TO_NONE)",
        '        run["losses"].append(step_losses)',
    ]
    values = ".detach().double().cpu().flatten().tolist()"
    if uses.fsdp1:
        lines += [
            "        with FSDP.summon_full_params(net)" + (" if composed else nullcontext():" if ref else ":"),
            f"            params = {{n: parameter(model, n){values} for n in names}}",
        ]
    else:
        value = "full(p)" if uses.dtensor else "p"
        lines.append(f"        params = {{n: {value}{values} for n, p in model.named_parameters()}}")
    lines += ["        if rank == 0:", '            run["params"].append(params)']
    if uses.replicas:  # (parity only)
        dtensor = " if not isinstance(p, DTensor)" if uses.dtensor else ""
        lines += [
            "    if composed:  # the parameters each rank holds whole",
            '        run["local"] = {',
            f"            n: p{values}",
            f"            for n, p in net.named_parameters(){dtensor}",
            "        }",
        ]
    lines.append("    return run")
    return "\n".join(lines) + "\n"


# -- the checks ---------------------------------------------------------------------------------

_WORST_MISMATCH = '''
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
'''

_COMPARE = """
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
"""

_REPLICAS = """
    for rank, (got, _) in enumerate(runs[1:], start=1):
        for name, values in runs[0][0]["local"].items():
            if got["local"].get(name) != values:
                return "replicas", f"replica of {name} on rank {rank} differs from rank 0's"
"""

_RESHARD_CHECK = """
{pad}reshard, _ = RESHARD_CONTRACT[unit]
{pad}flags = seen["sharded"][unit]
{pad}if flags and any(f != reshard for f in flags):
{pad}    state = "sharded" if reshard else "unsharded"
{pad}    return "contract-reshard", (
{pad}        f"fully_shard({unit!r}, reshard_after_forward={reshard}): "
{pad}        f"parameters not {state} after forward ({flags})"
{pad}    )
"""

_OUTPUT_DTYPE_CHECK = """
{pad}got = seen["output_dtypes"].get(unit)
{pad}if got is not None and got != OUTPUT_DTYPE_CONTRACT[unit]:
{pad}    return "contract-output-dtype", (
{pad}        f"fully_shard({unit!r}) with output_dtype={OUTPUT_DTYPE_CONTRACT[unit]} returned {got}"
{pad}    )
"""

_PARAM_DTYPE_CHECK = """
{pad}dtype, modules = PARAM_DTYPE_CONTRACT[unit]
{pad}for m in modules:
{pad}    got = seen["param_dtypes"].get(m)
{pad}    if got is not None and got != dtype:
{pad}        return "contract-param-dtype", f"{m!r} ran forward with {got} parameters under param_dtype={dtype}"
"""

_REPLICATE_CHECK = """
    for path, expected in REPLICATE_CONTRACT.items():
        if seen["replicated"][path] != expected:
            return "contract-replicate", (
                f"replicate({path!r}) manages {seen['replicated'][path]}, "
                f"expected exactly those fully_shard does not: {expected}"
            )
"""


def render_checks(uses: _Uses) -> str:
    if uses.metamorphic:
        doc = _docstring(
            "(check, message) for the first disagreement of run B with run A, in the fuzzer's order "
            "(per rank losses and gradient norms, then rank 0's parameters), or None."
        )
        check = "def check(runs):\n" + doc.rstrip("\n") + _COMPARE + "    return None\n"
        return _WORST_MISMATCH.strip("\n") + "\n\n\n" + check
    out = []
    if uses.reference:
        out.append(_WORST_MISMATCH)
    if uses.contracts:
        out.append(render_check_contracts(uses))
    if uses.reference:
        tail = ""
        if uses.replicas:
            tail += _REPLICAS.lstrip("\n")
        tail += '    return check_contracts(runs[0][0]["contract"])\n' if uses.contracts else "    return None\n"
        order = "per rank losses and gradient norms, then rank 0's parameters"
        order += ", the replicas" if uses.replicas else ""
        order += ", rank 0's contracts" if uses.contracts else ""
        doc = _docstring(f"(check, message) for the first disagreement, in the fuzzer's order ({order}), or None.")
        out.append("def check(runs):\n" + doc.rstrip("\n") + _COMPARE + tail)
    else:
        body = (
            "    for rank, run in enumerate(runs):\n"
            '        failed = check_contracts(run["contract"])\n'
            "        if failed:\n"
            '            return failed[0], f"rank {rank}: {failed[1]}"\n'
            if uses.contracts
            else ""
        )
        out.append(
            "def check(runs):\n"
            '    """(check, message) for the first rank whose contracts fail, or None (mixed_precision judges\n'
            '    every rank\'s contracts and no numerics)."""\n' + body + "    return None\n"
        )
    return "\n\n\n".join(s.strip("\n") for s in out)


def render_check_contracts(uses: _Uses) -> str:
    """Per fully_shard call in the case's order: reshard, output dtype, parameter dtype (as
    fuzz.properties.parity.check_contracts goes), then replicate's."""
    parts: list[tuple[dict[str, Any], str, str]] = [
        (uses.reshard_contract(), "RESHARD_CONTRACT", _RESHARD_CHECK),
        (uses.output_dtype_contract(), "OUTPUT_DTYPE_CONTRACT", _OUTPUT_DTYPE_CHECK),
        (uses.param_dtype_contract(), "PARAM_DTYPE_CONTRACT", _PARAM_DTYPE_CHECK),
    ]
    used = [(table, name, text) for table, name, text in parts if table]
    lines = [
        "def check_contracts(seen):",
        '    """(check, message) for the first contract that does not hold, in the fuzzer\'s order, or None."""',
    ]
    if len(used) == 1:
        _, name, text = used[0]
        lines.append(f"    for unit in {name}:")
        lines.append(text.strip("\n").replace("{pad}", "        "))
    elif used:
        units = [spec.path for spec in uses.comp.shards if any(spec.path in table for table, _, _ in used)]
        lines.append(f"    for unit in {_q(units)}:  # fully_shard calls, in the case's order")
        for _, name, text in used:
            lines.append(f"        if unit in {name}:")
            lines.append(text.strip("\n").replace("{pad}", "            "))
    if uses.comp.replicates:
        lines.append(_REPLICATE_CHECK.strip("\n"))
    lines.append("    return None")
    return "\n".join(lines) + "\n"


# -- main ---------------------------------------------------------------------------------------

_MAIN_START = """
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
"""

_MAIN_END = """    except Exception as e:  # say so, then let the traceback through (torchrun exits 1)
        name = f"{type(e).__module__}.{type(e).__qualname__}"
        verdict = "REPRODUCED" if f":{name}@" in RECORDED else "FAIL"
        print(f"{verdict} (rank {rank}): {name}: {e}; the recorded failure was {RECORDED}", flush=True)
        raise
    runs = [None] * WORLD_SIZE
    dist.all_gather_object(runs, mine)
    failed = check(runs) if rank == 0 else None
    if rank == 0:
{print_losses}
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


def render_main(uses: _Uses, variant: _Uses | None = None) -> str:
    if variant is not None:  # metamorphic: run A (the composition), then run B (the variant)
        meshes = ""
        for side, name in ((uses, "mesh_a"), (variant, "mesh_b")):
            if side.mesh is not None:
                shape, dims = side.const("MESH_SHAPE"), side.const("MESH_DIM_NAMES")
                meshes += f"    {name} = init_device_mesh(device.type, {shape}, mesh_dim_names={dims})\n"
            else:
                meshes += f"    {name} = None  # {side.comp.wrapper.value} runs on the default process group\n"
        run = (
            f"        mine = ({uses.fn('train')}(rank, device, mesh_a), {variant.fn('train')}(rank, device, mesh_b))\n"
        )
        losses = (
            '        for step, (a, b) in enumerate(zip(runs[0][0]["losses"], runs[0][1]["losses"])):\n'
            '            print(f"rank 0 step {step}: loss {a} (A), {b} (B)")'
        )
        return _MAIN_START + meshes + "    try:\n" + run + _MAIN_END.replace("{print_losses}", losses)
    if uses.mesh is not None:
        mesh = "    mesh = init_device_mesh(device.type, MESH_SHAPE, mesh_dim_names=MESH_DIM_NAMES)\n"
    else:
        mesh = f"    mesh = None  # {uses.comp.wrapper.value} runs on the default process group\n"
    if uses.reference:
        run = "        mine = (train(True, rank, device, mesh), train(False, rank, device, mesh))\n"
        losses = (
            '        for step, (got, ref) in enumerate(zip(runs[0][0]["losses"], runs[0][1]["losses"])):\n'
            '            print(f"rank 0 step {step}: loss {got}, reference {ref}")'
        )
    else:
        run = "        mine = train(rank, device, mesh)\n"
        losses = (
            '        for step, got in enumerate(runs[0]["losses"]):\n'
            '            print(f"rank 0 step {step}: loss {got}")'
        )
    return _MAIN_START + mesh + "    try:\n" + run + _MAIN_END.replace("{print_losses}", losses)


#: Body kind -> renderer; a kind missing here is refused.
RENDERERS: dict[str, Callable[[Entry, str], str]] = {"parity": render_parity, "metamorphic": render_metamorphic}
#: Body kinds refused on purpose, with why.
REFUSED: dict[str, str] = {
    "fault": "fault cases are the rank pool's self-test (an injected fault), not a torch bug; nothing to reproduce"
}
