"""State-dict and checkpoint properties: ``state_dict`` and ``dcp``.

Both train a model under one composition, move its state into a fresh model and optimizer
(built with other weights and other hyperparameters) under a possibly different composition,
and judge:

- round trip, exactly (equality, no tolerance): every parameter and buffer gathered to full,
  every optimizer state entry (exp_avg, exp_avg_sq, step, momentum_buffer) gathered to full
  (from an FSDP1 source, whose state only FSDP.optim_state_dict gathers: what
  get_optimizer_state_dict took from it; into an FSDP1 target: each rank's local shards,
  between one layout),
  every param group's hyperparameters on every rank, and the output of a forward on a fixed
  input. What get_optimizer_state_dict returned is judged on its own too, before any load:
  the optimizer's whole state by FQN, each parameter's entries as ``optimizer.state`` holds
  them (frozen parameters' state included: the API documents no exception), so a state the
  getter loses is not blamed on the setter. Keys left out of a load keep their fresh
  values; entries left out of a partial DCP load leave their objects untouched; Stateful
  objects and plain tensors come back exactly, and what was passed to ``dcp.load`` was
  loaded in place. A DCP checkpoint's model entry loads into a plain model on one process
  (``no_dist``, another world size and layout) with the values saved, exactly.
- resume equivalence: both models train on, on the same data. With the same composition on
  both sides the same operations run in the same order, so losses and final parameters must
  be equal exactly. Across compositions the gradient reductions are grouped differently
  (other flat buffers, another mesh, all-reduce instead of reduce-scatter), so the sums are
  associated differently and may differ in the last bits: then the dtype's policy of
  :mod:`fuzz.tolerance` applies, as in the training properties. The same holds for DDP and
  replicate even between equal compositions: DDP rebuilds its gradient bucket after its first
  iteration, so the freshly wrapped resumed model (in its first iteration) lays the all-reduce
  buffer out differently from the uninterrupted one, and with more than two ranks gloo's ring
  all-reduce associates each element's sum by its place in that buffer.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import shutil
from typing import Any

from fuzz import known
from fuzz.model import (
    Case,
    DcpBody,
    StateDictBody,
    dcp_root,
)
from fuzz.properties.dcp_checks import (
    judge_dcp_outcome,
)
from fuzz.properties.spec import Property, strategy
from fuzz.properties.state_dict_checks import (
    check_model,
    check_optimizer,
    check_requires_grad,
    check_resume,
    check_taken_optimizer,
    exact,
    failure_of_outcome,
    first_difference,
    mismatch,
    same_operations,
)
from fuzz.properties.state_dict_features import (
    features_dcp,
    features_state_dict,
)
from fuzz.signature import Failure, Signature
from fuzz.verdict import Outcome

# Round trips remove their checkpoints; one killed mid-case (a hang, a crash) cannot.
atexit.register(shutil.rmtree, dcp_root(os.getpid()), ignore_errors=True)


def _named_by_known_bug(case: Case, failure: Failure | None) -> Failure | None:
    """A mismatch that a known bug's record renames (:attr:`fuzz.known.KnownBug.renames`,
    :func:`fuzz.known.renaming`), named by that bug: whichever check meets the bug first (the
    model after the load, the optimizer state, resuming), it is one bug. A bug that renames the
    checks downstream of an optimizer load (its state loaded wrong or left out) names the call
    (``mismatch:dcp:save:<tag>``, ``mismatch:state_dict:set_optimizer_state_dict:<tag>``), and
    a wrong model after the load keeps its own signature; one that renames every check (FSDP1
    HYBRID_SHARD with a shard dimension of size 1, whose gradients are never averaged across
    replicas) keeps the API family and its tags and leaves the check out, as the training
    properties' signatures do."""
    if failure is None or failure.kind != "mismatch":
        return failure
    bug = known.renaming(case, str(failure.details.get("check", "")), failure.signature)
    if bug is None:
        return failure
    if bug.renamed_at:
        where = bug.renamed_at
        if where == known.SAVE_CALL and isinstance(case.body, DcpBody) and case.body.async_save:
            where = "async_save"
        renamed = Signature("mismatch", case.property, where=where, tags=(bug.tag.lstrip(":"),))
    else:
        signature = Signature.parse(failure.signature)
        assert signature is not None and signature.where
        family, *tags = signature.where.split(":")
        renamed = Signature("mismatch", case.property, where=family, tags=(*tags, *signature.tags))
    return dataclasses.replace(failure, signature=str(renamed))


def judge_state_dict(case: Case, outcome: Outcome) -> Failure | None:
    return _named_by_known_bug(case, _judge_state_dict(case, outcome))


def judge_dcp(case: Case, outcome: Outcome) -> Failure | None:
    return _named_by_known_bug(case, judge_dcp_outcome(case, outcome))


def _judge_state_dict(case: Case, outcome: Outcome) -> Failure | None:
    if not outcome.ok:
        return failure_of_outcome(case.property, outcome)
    body = case.body
    assert isinstance(body, StateDictBody)
    prop, where = case.property, body.api.value + known.state_tags(case)
    observations = outcome.observations
    first = observations[0]
    saved, loaded, dropped = first["saved"], first["loaded"], first["dropped"]
    failure = check_requires_grad(prop, where, observations)
    if failure is None:
        failure = check_model_keys(prop, where, body, first.get("model_keys"))
    if failure is None and "flat_optimizer" in first:
        failure = _check_flat_optimizer(prop, where, first["flat_optimizer"])
    if failure is None and "taken_optimizer" in first:
        failure = check_taken_optimizer(prop, where, first["taken_optimizer"], saved["optimizer"])
    if failure is None:
        failure = check_model(prop, where, saved, loaded, first.get("fresh"), dropped)
    if failure is None:
        failure = check_optimizer(prop, where, body.source, body.target, observations, "saved")
    for rank, obs in enumerate(observations):
        if failure is None:
            failure = exact(
                prop, "groups", where, f"rank {rank}'s param groups", obs["loaded"]["groups"], obs["saved"]["groups"]
            )
        result = obs["load_result"]
        if failure is None and (result["unexpected"] or set(result["missing"]) - set(dropped)):
            failure = mismatch(
                prop, "load_result", where, f"rank {rank}: the load reported {result}; keys left out: {dropped}"
            )
    if failure is None and not dropped:
        failure = exact(prop, "probe", where, "the forward output on the fixed input", loaded["probe"], saved["probe"])
    if failure is None and not dropped:
        failure = check_resume(prop, where, case, same_operations(body.source, body.target), observations)
    return failure


def check_model_keys(prop: str, where: str, body: StateDictBody, observed: dict[str, Any] | None) -> Failure | None:
    """The keys get_model_state_dict returned are the model's own state-dict keys: the keys
    fused modules' hooks make, which the method ``StateDictOptions.dsd_fqn_modifiers`` names
    tells the API about (pytorch/pytorch#146557); for a tree with a tied weight or a
    non-persistent buffer, the plain model's (both names of the tied weight, no
    non-persistent buffer: nn.Module.state_dict's contract); with ``ignore_frozen_params``, "the returned
    state_dict won't contain any frozen parameters": less exactly the frozen parameters
    (buffers and trainable parameters all kept)."""
    if observed is None:
        return None
    keys, want = observed["keys"], observed["expected"]
    if keys == want:
        return None
    extra, missing = sorted(set(keys) - set(want)), sorted(set(want) - set(keys))
    if body.save.ignore_frozen_params:
        check, what = "ignore_frozen_params", "get_model_state_dict(ignore_frozen_params=True) returned keys"
        summary = f"{what} {extra} it should leave out and lacks {missing}"
    elif body.fused:
        check, what = "dsd_fqn_modifiers", "get_model_state_dict of a model with fused modules returned keys"
        summary = f"{what} {extra} its state dict does not have and lacks {missing}"
    else:
        check = "state_dict_keys"
        summary = f"the state dict taken has keys {extra} the plain model's does not have and lacks {missing}"
    return mismatch(prop, check, where, summary, observed=keys, expected=want)


def _check_flat_optimizer(prop: str, where: str, observed: dict[str, Any]) -> Failure | None:
    """StateDictOptions(flatten_optimizer_state_dict=True), as torch's _flatten_optim_state_dict
    documents the format: the nested state dict's ``state[fqn][key]`` is ``state.<fqn>.<key>``
    and every param group's hyperparameter ``k`` is ``param_groups.<fqn>.<k>`` for each of
    its parameters, nothing else. (That set_optimizer_state_dict takes it back is judged by the
    round trip.)"""
    flat, nested = observed["flat"], observed["nested"]
    want: dict[str, Any] = {}
    for fqn, state in nested["state"].items():
        for key, value in state.items():
            want[f"state.{fqn}.{key}"] = value
    for group in nested["param_groups"]:
        for fqn in group.get("params", []):
            for key, value in group.items():
                if key != "params":
                    want[f"param_groups.{fqn}.{key}"] = value
    diff = first_difference(flat, want)
    if not diff:
        return None
    return mismatch(
        prop,
        "flatten_optimizer_state_dict",
        where,
        f"the flattened optimizer state dict differs from the nested one, flattened as documented: {diff}",
    )


STATE_DICT = Property(
    name="state_dict",
    description="get/set_*_state_dict (and FSDP2's own) move model and optimizer state exactly, across layouts",
    cases=strategy("state_dict_cases"),
    judge=judge_state_dict,
    features=features_state_dict,
    stall=known.ALONE_IN_BROADCAST_STALL,
    body=StateDictBody,
    repro="fuzz.repro.script:render",
)

DCP = Property(
    name="dcp",
    description="DCP save/async_save/load with Stateful objects and per-rank key orders round-trip exactly",
    cases=strategy("dcp_cases"),
    judge=judge_dcp,
    features=features_dcp,
    stall=known.ALONE_IN_BROADCAST_STALL,
    body=DcpBody,
    repro="fuzz.repro.script:render",
)
#: The properties this module defines (collected by :mod:`fuzz.properties`).
PROPERTIES = (STATE_DICT, DCP)
