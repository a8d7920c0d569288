"""The properties of a user's own model (``--model FILE.py:NAME``; docs/user_models.md):

- ``user_parity``: the model composed (fully_shard / replicate / checkpoint over its named
  submodules, 1D or HSDP meshes) trains like a deep copy of it trained as the plain all-reduce
  reference on the same batches: losses, gradient norms and parameters step by step under the
  dtype's tolerance (:mod:`fuzz.tolerance`), the reshard-after-forward contract, replicas equal.
  Judged by :mod:`fuzz.properties.parity`'s own checks.
- ``user_state``: model and optimizer state taken with ``get_state_dict`` after training, moved
  in memory or through a DCP checkpoint into a fresh model built from another seed (the same
  layout, or another one) and loaded with ``set_state_dict``: the state read back equals the
  saved one exactly, forward outputs after the load equal those before the save, and one more
  step from the loaded state (losses, parameters) equals one more step of the uninterrupted run
  (exactly in the same layout; under the dtype's tolerance in another).

Without a model (``python -m fuzz explore`` without ``--model``, the health run, tests that
sample every property) the cases are drawn over the shipped example, :data:`EXAMPLE`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, cast

from fuzz.model import Case, ModuleTree
from fuzz.model.user import RoundTrip, UserParityBody, UserStateBody
from fuzz.properties.parity import (
    api_of,
    check_contracts,
    check_replicas,
    compare_runs,
    composition_features,
    mismatch_failure,
    optimizer_gain,
    training_features,
)
from fuzz.properties.spec import Property
from fuzz.signature import Failure, failure_from_outcome
from fuzz.tolerance import Tolerance, first_mismatch, tolerance_for
from fuzz.verdict import Outcome

#: The model drawn over where none is named: the small transformer that ships in examples/.
EXAMPLE = f"{Path(__file__).resolve().parents[2] / 'examples' / 'tiny_transformer.py'}:tiny_transformer"
EXACT = Tolerance(rtol=0.0, atol=0.0)
#: The properties that take a user's model (``--model`` runs these).
NAMES = ("user_parity", "user_state")


def _cases(name: str) -> Any:
    def cases(*, world_size: int, model: Any = None, **kwargs: Any) -> Any:
        import strategies

        return getattr(strategies, name)(EXAMPLE if model is None else model, world_size=world_size, **kwargs)

    return cases


def judge_user_parity(case: Case, outcome: Outcome) -> Failure | None:
    if not outcome.ok:
        return failure_from_outcome(case.property, outcome)
    body = case.body
    assert isinstance(body, UserParityBody)
    obs = outcome.observations
    api = api_of(body.composition, None, body.training, case.world_size)
    contracts = obs[0].get("contracts")
    # check_contracts reads the tree only for replicate's parameter names and mixed precision,
    # which user cases do not record or draw: the reshard-after-forward contract is what it checks.
    no_tree = cast(ModuleTree, None)
    return (
        (check_contracts(case.property, body.composition, no_tree, contracts) if contracts is not None else None)
        or compare_runs(
            case.property, obs, tolerance_for(body.training.dtype.value), api, gain=optimizer_gain(body.training)
        )
        or check_replicas(case.property, obs)
    )


def _difference(saved: Any, loaded: Any, where: str) -> str | None:
    """Where the state read back differs from the saved one (exactly), or None."""
    if isinstance(saved, dict) and isinstance(loaded, dict):
        if set(saved) != set(loaded):
            missing, extra = sorted(set(saved) - set(loaded)), sorted(set(loaded) - set(saved))
            return f"{where or 'the state'}: keys missing after the load {missing[:5]}, unexpected {extra[:5]}"
        if set(saved) == {"dtype", "shape", "values"}:
            if (saved["dtype"], saved["shape"]) != (loaded["dtype"], loaded["shape"]):
                return (
                    f"{where}: {loaded['dtype']} {loaded['shape']} after the load, "
                    f"{saved['dtype']} {saved['shape']} saved"
                )
            bad = first_mismatch(loaded["values"], saved["values"], EXACT)
            if bad is not None:
                return f"{where}[{bad.index}] is {bad.actual!r} after the load, {bad.expected!r} saved"
            return None
        for key in saved:
            found = _difference(saved[key], loaded[key], f"{where}.{key}" if where else key)
            if found is not None:
                return found
        return None
    if isinstance(saved, list) and isinstance(loaded, list) and len(saved) == len(loaded):
        for i, (s, lo) in enumerate(zip(saved, loaded)):
            found = _difference(s, lo, f"{where}[{i}]")
            if found is not None:
                return found
        return None
    return None if saved == loaded else f"{where}: {loaded!r:.80} after the load, {saved!r:.80} saved"


def judge_user_state(case: Case, outcome: Outcome) -> Failure | None:
    if not outcome.ok:
        return failure_from_outcome(case.property, outcome)
    body = case.body
    assert isinstance(body, UserStateBody)
    family = "dcp" if body.mode is RoundTrip.DCP else "dsd"
    first = outcome.observations[0]
    found = _difference(first["saved"], first["loaded"], "")
    if found is not None:
        return mismatch_failure(case.property, "state", family, f"state dict: {found}")
    # Forward in the same layout runs the same operations on the same values: exact. In another
    # layout (replicate for fully_shard, another mesh) the dtype's policy.
    tol = EXACT if body.target is None else tolerance_for(body.training.dtype.value)
    # The step after the load reduces its gradients afresh: replicate's DDP reducer of the loaded
    # model groups them in its first buckets, the uninterrupted one in the buckets it rebuilt after
    # its first iteration, and a sum over three or more ranks rounds by its grouping (gloo at 4
    # ranks: replicate on the root alone, SGD, float32, 5.8e-11 apart in one weight after the
    # step). Over two ranks a sum is one addition, exact in any order.
    resume_tol = tol if case.world_size <= 2 else tolerance_for(body.training.dtype.value)
    for rank, obs in enumerate(outcome.observations):
        bad = first_mismatch(obs["after"], obs["before"], tol)
        if bad is not None:
            return mismatch_failure(
                case.property,
                "outputs",
                family,
                f"rank {rank}: forward output[{bad.index}] after the load is {bad.actual!r}, before the save "
                f"{bad.expected!r} (error {bad.error:.3g} > allowed {bad.allowed:.3g})",
                rank=rank,
            )
        resumed, uninterrupted = obs["resumed"], obs["uninterrupted"]
        bad = first_mismatch(resumed["losses"], uninterrupted["losses"], resume_tol)
        if bad is not None:
            return mismatch_failure(
                case.property,
                "resume",
                family,
                f"rank {rank}: the loss of the step after the load is {bad.actual!r}, uninterrupted {bad.expected!r}",
                rank=rank,
            )
    after = first["uninterrupted"].get("params", {})
    for name, want in after.items():
        bad = first_mismatch(first["resumed"]["params"].get(name, []), want, resume_tol)
        if bad is not None:
            return mismatch_failure(
                case.property,
                "resume",
                family,
                f"{name}[{bad.index}] after a step from the loaded state is {bad.actual!r}, uninterrupted "
                f"{bad.expected!r} (error {bad.error:.3g} > allowed {bad.allowed:.3g})",
                param=name,
            )
    return None


def _kinds(spec: str) -> dict[str, str]:
    """Module paths to class names, where the driver can describe the model (else none)."""
    from fuzz.errors import ShardfuzzError
    from fuzz.user_model import describe

    try:
        return {m.path: m.kind for m in describe(spec, "model").modules}
    except ShardfuzzError:
        return {}


def features(case: Case) -> list[str]:
    body = case.body
    assert isinstance(body, (UserParityBody, UserStateBody))
    comp = body.composition
    target, _, name = body.model.rpartition(":")
    out = [f"user:model:{os.path.basename(target)}:{name}"]
    out += composition_features(comp, case.world_size) + training_features(body.training)
    kinds = _kinds(body.model)
    for path in [s.path for s in comp.shards]:
        out.append(f"user:fully_shard:{kinds.get(path, '?')}")
    out += [f"user:replicate:{kinds.get(p, '?')}" for p in comp.replicates]
    out += [f"user:checkpoint:{kinds.get(p, '?')}" for p in comp.checkpoints]
    out.append(f"user:wrapped:{min(case.size[0], 6)}")
    if isinstance(body, UserStateBody):
        out.append(f"user_state:{body.mode.value}")
        out.append("user_state:full_state_dict" if body.full_state_dict else "user_state:sharded_state_dict")
        if body.cpu_offload:
            out.append("user_state:cpu_offload")
        if body.target is not None:
            out.append("user_state:other_layout")
    return sorted(set(out))


USER_PARITY = Property(
    name="user_parity",
    description="the user's model (--model FILE.py:NAME) composed trains like its plain all-reduce reference",
    cases=_cases("user_parity_cases"),
    judge=judge_user_parity,
    features=features,
    body=UserParityBody,
    repro="fuzz.repro.script:render",
)
USER_STATE = Property(
    name="user_state",
    description="the user's model: get/set_state_dict and DCP round trips restore model and optimizer exactly",
    cases=_cases("user_state_cases"),
    judge=judge_user_state,
    features=features,
    body=UserStateBody,
    repro="fuzz.repro.script:render",
)
#: The properties this module defines (collected by :mod:`fuzz.properties`).
PROPERTIES = (USER_PARITY, USER_STATE)
