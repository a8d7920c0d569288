"""Strategies over a user's own model: compositions over its named submodules, trainings, state
round trips (:mod:`fuzz.model.user`).

Shrinking goes to the fewest wrapped modules and steps: the units beside the root's and the
checkpointed modules are lists that Hypothesis shortens element by element, each unit a
(path, api, reshard_after_forward) triple; a unit that would break a rule
(:func:`fuzz.model.user.composition_problem`) is left out where it is met, so every list
draws a valid composition and a shorter list a smaller one. Steps and the batch shrink to 1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from hypothesis import strategies as st

from fuzz.model import Case, Composition, Dtype, Optimizer, ShardSpec, Training
from fuzz.model.rules import checkpoint_over_replicate
from fuzz.model.user import ModelInfo, RoundTrip, UserParityBody, UserStateBody, composition_problem
from fuzz.user_model import describe, spec_of
from strategies._cases import trainings
from strategies._validation import check_bounds, check_world_size

APIS = ("fully_shard", "replicate")


def model_info(model: str | Callable[[], Any] | ModelInfo) -> ModelInfo:
    """``model`` (a spec, a factory, or what :func:`fuzz.user_model.describe` returned) checked
    and described; InvalidArgument naming what is wrong."""
    if isinstance(model, ModelInfo):
        return model
    return describe(spec_of(model), "model")


def _compose(info: ModelInfo, units: list[tuple[str, str, bool]], checkpoints: list[str], **kw: Any) -> Composition:
    shards = tuple(ShardSpec(path, reshard_after_forward=raf) for path, api, raf in units if api == "fully_shard")
    replicates = tuple(path for path, api, _ in units if api == "replicate")
    unused = any(m.unused for m in info.modules)
    return Composition(
        shards=shards,
        replicates=replicates,
        checkpoints=tuple(checkpoints),
        find_unused=unused and bool(replicates),
        **kw,
    )


@st.composite
def user_compositions(
    draw: st.DrawFn, model: str | Callable[[], Any] | ModelInfo, *, world_size: int = 2, max_units: int = 4
) -> Composition:
    """fully_shard or replicate on the root, up to ``max_units - 1`` more units on submodules
    that hold parameters and run forward, checkpoint on up to three modules (before or after
    fully_shard), reshard_after_forward True or False per unit, and an HSDP (2, world_size / 2)
    mesh where the world size allows one."""
    info = model_info(model)
    check_world_size(world_size)
    check_bounds("max_units", max_units, "max_units", max_units, floor=1, ceiling=16)
    callable_ = [m for m in info.modules if m.calls]
    holders = [m.path for m in callable_ if m.path and m.holds]
    raf = st.sampled_from((True, False))  # shrinks to torch's default
    root = (draw(st.sampled_from(APIS)), draw(raf))
    triples = st.tuples(st.sampled_from(holders), st.sampled_from(APIS), raf) if holders else st.nothing()
    inner = draw(st.lists(triples, max_size=max_units - 1, unique_by=lambda t: t[0]))
    checkpoints = draw(st.lists(st.sampled_from([m.path for m in callable_]), max_size=3, unique=True))
    kw: dict[str, Any] = {"checkpoint_first": draw(st.booleans())}
    if world_size >= 4 and world_size % 2 == 0 and draw(st.booleans()):
        kw["mesh"] = (2, world_size // 2)
    units = [("", root[0], root[1])]
    for unit in inner:
        if composition_problem(info, _compose(info, [*units, unit], [], **kw)) is None:
            units.append(unit)
    comp = _compose(info, units, checkpoints, **kw)
    while (over := checkpoint_over_replicate(comp)) is not None:  # the units win; the checkpoint goes
        comp = replace(comp, checkpoints=tuple(c for c in comp.checkpoints if c != over[1]))
    if kw.get("mesh") and not comp.shards:
        comp = replace(comp, mesh=())
    problem = composition_problem(info, comp)
    if problem is not None:  # the root alone keeps every rule on a model describe() accepted
        raise AssertionError(f"drew an invalid composition over {info.spec}: {problem}")
    return comp


def _fit(training: Training, info: ModelInfo) -> Training:
    """Float32 with SGD where the model does not train in float64 (Adam is paired with float64,
    fuzz.tolerance)."""
    if not info.float64 and training.dtype is Dtype.FLOAT64:
        training = replace(training, dtype=Dtype.FLOAT32, optimizer=Optimizer.SGD, momentum=0.9)
    return training


def _case(prop: str, world_size: int, body: Any) -> Any:
    return st.builds(
        Case, property=st.just(prop), world_size=st.just(world_size), seed=st.integers(0, 2**32), body=body
    )


@st.composite
def _parity_body(draw: st.DrawFn, info: ModelInfo, world_size: int, max_steps: int, max_units: int) -> UserParityBody:
    comp = draw(user_compositions(info, world_size=world_size, max_units=max_units))
    training = draw(trainings(max_steps=max_steps, max_batch_per_rank=2, composition=comp))
    return UserParityBody(model=info.spec, composition=comp, training=_fit(training, info), digest=info.digest)


def user_parity_cases(
    model: str | Callable[[], Any] | ModelInfo,
    *,
    world_size: int = 2,
    max_steps: int = 3,
    max_units: int = 4,
    **_: Any,
) -> st.SearchStrategy[Case]:
    """``user_parity`` cases over ``model`` (a spec ``FILE.py:NAME`` / ``module.path:NAME``, or
    the factory itself, a module-level callable returning ``(model, batch_fn, loss_fn)``)."""
    info = model_info(model)
    check_bounds("max_steps", max_steps, "max_steps", max_steps, floor=1, ceiling=16)
    return _case("user_parity", world_size, _parity_body(info, world_size, max_steps, max_units))


@st.composite
def _state_body(draw: st.DrawFn, info: ModelInfo, world_size: int, max_steps: int, max_units: int) -> UserStateBody:
    comp = draw(user_compositions(info, world_size=world_size, max_units=max_units))
    training = _fit(draw(trainings(max_steps=max_steps, max_batch_per_rank=2, accumulation=False)), info)
    if training.optimizer is Optimizer.SGD and not training.momentum:
        training = replace(training, momentum=0.9)  # an optimizer with state to move
    mode = draw(st.sampled_from(RoundTrip))
    target = draw(st.none() | user_compositions(info, world_size=world_size, max_units=max_units))
    if mode is RoundTrip.DCP:
        full, offload = False, draw(st.booleans())
    elif target is not None:
        full, offload = True, False  # into another layout: the full state dict, documented for that
    else:
        full = draw(st.booleans())
        offload = False if full else draw(st.booleans())
    return UserStateBody(
        model=info.spec,
        composition=comp,
        training=training,
        mode=mode,
        full_state_dict=full,
        cpu_offload=offload,
        target=target,
        digest=info.digest,
    )


def user_state_cases(
    model: str | Callable[[], Any] | ModelInfo,
    *,
    world_size: int = 2,
    max_steps: int = 3,
    max_units: int = 4,
    **_: Any,
) -> st.SearchStrategy[Case]:
    """``user_state`` cases over ``model`` (as :func:`user_parity_cases` takes it): state dict and
    DCP round trips of model and optimizer, into the same layout or another one."""
    info = model_info(model)
    check_bounds("max_steps", max_steps, "max_steps", max_steps, floor=1, ceiling=16)
    return _case("user_state", world_size, _state_body(info, world_size, max_steps, max_units))


def user_cases(
    model: str | Callable[[], Any] | ModelInfo, *, world_size: int = 2, max_steps: int = 3, max_units: int = 4
) -> st.SearchStrategy[Case]:
    """Cases of every property over a user's model: ``user_parity`` and ``user_state``."""
    info = model_info(model)
    kw = {"world_size": world_size, "max_steps": max_steps, "max_units": max_units}
    return user_parity_cases(info, **kw) | user_state_cases(info, **kw)
