"""The user's own model as case data: the spec that names it, what a driver learned of it (its
modules, which hold parameters, which share one), the rules a composition over it must keep,
and the bodies of the ``user_parity`` and ``user_state`` properties.

A model is named by a spec, ``FILE.py:NAME`` or ``module.path:NAME``, NAME a zero-argument
callable returning ``(model, batch_fn, loss_fn)`` (docs/user_models.md). Cases carry the spec
string and compositions over the model's named submodules (``layers.0.attn``), never the model:
they stay JSON, and every rank builds the model itself, seeded from the case.

Imports only the standard library and the model; :func:`load_factory` executes the user's file,
which imports torch, only when called (on a rank, or in the driver's checks).
"""

from __future__ import annotations

import enum
import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from fuzz.errors import CaseError, InvalidArgument
from fuzz.model.case import Body
from fuzz.model.composition import Composition
from fuzz.model.rules import checkpoint_over_replicate
from fuzz.model.training import AccumSync, Compile, Training
from fuzz.model.tree import contains, is_ancestor

#: What a spec names (``--model``): a file or a module, then ``:NAME``.
SPEC_FORMS = "FILE.py:NAME or module.path:NAME"


def parse_spec(spec: str, argument: str = "--model") -> tuple[str, str]:
    """``(target, name)`` of a spec; InvalidArgument naming ``argument`` if it has no such form."""
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name.isidentifier():
        raise InvalidArgument(
            f"{argument} {spec!r}: expected {SPEC_FORMS}, NAME a callable returning (model, batch_fn, loss_fn)"
        )
    if not target.endswith(".py") and not all(part.isidentifier() for part in target.split(".")):
        raise InvalidArgument(f"{argument} {spec!r}: {target!r} is neither a .py file nor a dotted module path")
    return target, name


#: Loaded modules by spec target, with the file's modification time (a changed file is loaded anew).
_LOADED: dict[str, tuple[float, Any]] = {}


def load_factory(spec: str, argument: str = "--model") -> Callable[[], Any]:
    """The callable a spec names. A file is executed as a module of its own (its directory put on
    ``sys.path`` first, as Python does for a script), once per modification time; a dotted path
    is imported. InvalidArgument, naming ``argument``, for a file that does not exist, a module
    that cannot be imported, or a NAME that is missing or not callable."""
    target, name = parse_spec(spec, argument)
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            where = f" (from {os.getcwd()})" if not path.is_absolute() else ""
            raise InvalidArgument(f"{argument} {spec!r}: file {target} does not exist{where}")
        module = _load_file(path.resolve(), spec, argument)
    else:
        try:
            module = importlib.import_module(target)
        except Exception as e:  # what the user's module raises as it is imported
            raise InvalidArgument(
                f"{argument} {spec!r}: cannot import module {target!r}: {type(e).__name__}: {e}"
            ) from None
    factory = getattr(module, name, None)
    if factory is None:
        found = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))[:10]
        raise InvalidArgument(f"{argument} {spec!r}: {target} has no {name!r} (callables there: {found})")
    if not callable(factory):
        raise InvalidArgument(
            f"{argument} {spec!r}: {name!r} is not callable (a {type(factory).__name__}); "
            "name a function returning (model, batch_fn, loss_fn)"
        )
    return factory


def _load_file(path: Path, spec: str, argument: str) -> Any:
    mtime = path.stat().st_mtime
    key = str(path)
    cached = _LOADED.get(key)
    if cached is not None and cached[0] == mtime:
        return cached[1]
    module_name = "shardfuzz_user_" + hashlib.sha256(key.encode()).hexdigest()[:12]
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise InvalidArgument(f"{argument} {spec!r}: {path} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(loader_spec)
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    sys.modules[module_name] = module  # dataclasses and pickling look their module up there
    try:
        loader_spec.loader.exec_module(module)
    except Exception as e:
        sys.modules.pop(module_name, None)
        raise InvalidArgument(f"{argument} {spec!r}: executing {path} raised {type(e).__name__}: {e}") from None
    _LOADED[key] = (mtime, module)
    return module


def digest(params: Sequence[tuple[str, Sequence[int]]]) -> str:
    """A fingerprint of a model's parameters (names and shapes): a case drawn for one model
    refuses to run on another that the spec names later (the file was edited)."""
    text = ";".join(f"{n}:{'x'.join(map(str, s))}" for n, s in params)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class UserModule:
    """One named submodule of the user's model (``""`` is the root)."""

    path: str
    #: Its class name (for features: which kinds of module a composition wraps).
    kind: str = ""
    #: Holds parameters of its own (not only in submodules).
    owns: bool = False
    #: Holds a trainable parameter of its own.
    trainable: bool = False
    #: Holds a trainable parameter of its own that a forward and backward left without gradient.
    unused: bool = False
    #: Holds parameters at all, its own or its submodules'.
    holds: bool = False
    #: How often one forward of the model calls it (0: a container such as a ModuleList, which
    #: fully_shard, replicate and checkpoint cannot hook).
    calls: int = 1


@dataclass(frozen=True)
class ModelInfo:
    """What the driver learned of a model by building it (:mod:`fuzz.user_model`): the data
    strategies draw compositions from and :func:`check_user_composition` checks them against."""

    spec: str
    modules: tuple[UserModule, ...]
    #: Groups of module paths that hold one parameter between them (weight tying).
    shared: tuple[tuple[str, ...], ...] = ()
    digest: str = ""
    #: The model trains in float64 too (``model.to(torch.float64)``, floating inputs cast).
    float64: bool = True

    def module(self, path: str) -> UserModule | None:
        return next((m for m in self.modules if m.path == path), None)


def _owner(path: str, members: Sequence[str]) -> str | None:
    """The innermost unit member at or above ``path``."""
    best: str | None = None
    for m in members:
        if contains(m, path) and (best is None or is_ancestor(best, m)):
            best = m
    return best


def composition_problem(info: ModelInfo, comp: Composition) -> str | None:
    """Why ``comp`` is not a composition the properties can judge over ``info``'s model, or None.
    Each rule cites what decides it:

    - every parameter is under a fully_shard or replicate unit (else its ranks diverge by design);
    - a module gets fully_shard or replicate once, not both, and paths name modules;
    - a replicate unit keeps a trainable parameter of its own (DDP refuses a module without one);
    - the modules sharing a parameter (tied weights) belong to one unit: FSDP2 and DDP manage a
      parameter in one unit, and a tied parameter split over two is not a documented use;
    - no checkpoint at or above a replicate'd module (:func:`fuzz.model.rules.checkpoint_over_replicate`);
    - fully_shard / replicate only on modules holding parameters; no wrappers, tensor
      parallelism, knobs, options, SPMD or meta-device init yet (docs/user_models.md).
    """
    paths = {m.path: m for m in info.modules}
    for name, group in (
        ("shards", [s.path for s in comp.shards]),
        ("replicates", comp.replicates),
        ("checkpoints", comp.checkpoints),
    ):
        for p in group:
            if p not in paths:
                return f"{name}: {p!r} names no module of {info.spec} (e.g. {sorted(paths)[:8]})"
            if group.count(p) > 1:
                return f"{name}: {p!r} appears twice"
    if any(s.group or s.ignored or s.offload or s.mixed_precision is not None or s.shard_dim for s in comp.shards):
        return "shards: groups, ignored_params, offload, mixed precision and shard_dim are not drawn for user models"
    if (
        comp.wrapper.value != "none"
        or comp.tp
        or comp.spmd
        or comp.meta_init
        or comp.knobs.is_set
        or comp.replicate_options.is_set
    ):
        return (
            "wrappers, tensor parallelism, SPMD, meta init, knobs and replicate options are not drawn for user models"
        )
    members = [s.path for s in comp.shards] + list(comp.replicates)
    both = set(comp.replicates) & {s.path for s in comp.shards}
    if both:
        return f"{sorted(both)[0]!r} gets both fully_shard and replicate"
    for m in members:
        if not paths[m].holds:
            return f"{m!r} holds no parameters"
    for m in [*members, *comp.checkpoints]:
        if not paths[m].calls:
            return f"{m!r} is not called by forward (a container): its hooks would never run"
    owners = {m.path: _owner(m.path, members) for m in info.modules if m.owns}
    for path, owner in owners.items():
        if owner is None:
            return f"the parameters of {path!r} are under no fully_shard or replicate"
    for r in comp.replicates:
        if not any(owner == r and paths[p].trainable for p, owner in owners.items()):
            return f"replicate({r!r}) is left no trainable parameter of its own to manage"
    for group in info.shared:
        units = {owners.get(p, _owner(p, members)) for p in group}
        if len(units) > 1:
            return (
                f"the modules {list(group)} share a parameter but belong to different units {sorted(map(str, units))}"
            )
    over = checkpoint_over_replicate(comp)
    if over is not None:
        return (
            f"checkpoints: {over[1]!r} holds replicate({over[2]!r}), whose forward its recomputation would call again"
        )
    unused = any(m.unused and owners.get(m.path) in comp.replicates for m in info.modules)
    if unused and not comp.find_unused:
        return "replicate over parameters that get no gradient needs find_unused"
    return None


def check_user_composition(info: ModelInfo, comp: Composition, where: str = "composition") -> None:
    problem = composition_problem(info, comp)
    if problem is not None:
        raise CaseError(where, problem)


def _check_training(training: Training, comp: Composition) -> None:
    if training.skips or training.unfreeze or training.compile is not Compile.NONE:
        raise CaseError("training", "skips, unfreezing and compile are not drawn for user models")
    if training.clip_grad_norm is not None or training.eval_forward:
        raise CaseError("training", "gradient clipping and eval forwards are not drawn for user models yet")
    if training.accum_sync is AccumSync.NO_ALL_REDUCE and not comp.mesh:
        raise CaseError("training.accum_sync", "no_all_reduce needs an HSDP (replicate, shard) mesh")
    if training.accum_sync is not AccumSync.ALWAYS and comp.replicates:
        raise CaseError("training.accum_sync", "replicate() has no gradient-sync switch; use always")


def _wrapped(comp: Composition) -> int:
    return len(comp.shards) + len(comp.replicates) + len(comp.checkpoints)


@dataclass(frozen=True)
class UserParityBody(Body):
    """Train the user's model composed and a deep copy of it as the plain all-reduce reference,
    on the batches ``batch_fn`` draws, step by step (``fuzz._rank.user``)."""

    KIND: ClassVar[str] = "user_parity"
    PROGRAM: ClassVar[str] = "fuzz._rank.user:run_user_parity"
    model: str
    composition: Composition
    training: Training = field(default_factory=Training)
    #: :func:`digest` of the model the case was drawn for ("" skips the check).
    digest: str = ""

    def __post_init__(self) -> None:
        parse_spec(self.model, "model")
        _check_training(self.training, self.composition)

    @property
    def size(self) -> tuple[int, int]:
        return _wrapped(self.composition), self.training.steps

    def validate_for(self, world_size: int) -> None:
        from fuzz.model.rules import check_mesh

        check_mesh(self.composition, world_size)


class RoundTrip(str, enum.Enum):
    """How the state moves from the trained model to a fresh one."""

    IN_MEMORY = "in_memory"  # get_state_dict -> set_state_dict
    DCP = "dcp"  # get_state_dict -> dcp.save; dcp.load -> set_state_dict


@dataclass(frozen=True)
class UserStateBody(Body):
    """Train the composed model ``training.steps`` steps, take model and optimizer state with
    ``get_state_dict``, move it (:class:`RoundTrip`) into a fresh model built from another seed
    under ``target`` (None: the same composition) and load it with ``set_state_dict``; the state
    read back must equal the saved one exactly, forward outputs after the load those before the
    save, and one more step from the loaded state one more step of the uninterrupted run
    (``fuzz._rank.user``)."""

    KIND: ClassVar[str] = "user_state"
    PROGRAM: ClassVar[str] = "fuzz._rank.user:run_user_state"
    model: str
    composition: Composition
    training: Training = field(default_factory=Training)
    mode: RoundTrip = RoundTrip.IN_MEMORY
    full_state_dict: bool = False
    cpu_offload: bool = False
    target: Composition | None = None
    digest: str = ""

    def __post_init__(self) -> None:
        parse_spec(self.model, "model")
        _check_training(self.training, self.composition)
        if self.training.grad_accum != 1:
            raise CaseError("training.grad_accum", "the round trip trains one microbatch per step")
        if self.full_state_dict and self.cpu_offload:
            # full + cpu_offload leaves the state on rank 0 only; loading it needs
            # broadcast_from_rank0 (not drawn yet)
            raise CaseError("cpu_offload", "not drawn with full_state_dict")
        if self.mode is RoundTrip.DCP and self.full_state_dict:
            raise CaseError("full_state_dict", "DCP saves the sharded state dict (full_state_dict=False)")
        if self.mode is RoundTrip.IN_MEMORY and self.target is not None and not self.full_state_dict:
            # a sharded state dict is moved into another layout through DCP, which reshards
            raise CaseError("target", "into another layout in memory: the full state dict (full_state_dict=True)")

    @property
    def size(self) -> tuple[int, int]:
        return _wrapped(self.composition) + (0 if self.target is None else _wrapped(self.target)), self.training.steps

    def validate_for(self, world_size: int) -> None:
        from fuzz.model.rules import check_mesh

        check_mesh(self.composition, world_size)
        if self.target is not None:
            check_mesh(self.target, world_size, "target")
