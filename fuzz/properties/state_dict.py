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
    DEFAULT_FQN_MODIFIERS,
    Api,
    Case,
    Composition,
    DcpBody,
    DcpItem,
    DcpMode,
    ModuleTree,
    Overwrite,
    StateDictBody,
    Wrapper,
    dcp_root,
    is_fsdp1,
    is_plain,
    tensor_kind,
)
from fuzz.properties import Property, register, strategy
from fuzz.properties.parity import SPMD_FEATURE
from fuzz.signature import Failure, Signature, failure_from_outcome
from fuzz.tolerance import first_mismatch, judged_prefix, tolerance_for
from fuzz.verdict import Outcome

# Round trips remove their checkpoints; one killed mid-case (a hang, a crash) cannot.
atexit.register(shutil.rmtree, dcp_root(os.getpid()), ignore_errors=True)


#: What FileSystemWriter(overwrite=False) raises on an existing checkpoint (a RuntimeError in its
#: prepare_local_plan, which DCP reports as a CheckpointException on every rank).
ALREADY_EXISTS = "Checkpoint already exists"


def _failure(prop: str, outcome: Outcome) -> Failure:
    """failure_from_outcome, with one refinement. When rank 0 is inside _broadcast_state_dict
    (rank 0 sends, the others receive) and another rank is not, the ranks disagreed about
    whether to broadcast: a deadlock, whatever it shows as. The rank that skipped runs on into
    its next collective, so the outcome is a hang in rank 0's broadcast or a crash or error
    wherever the other rank's next collective mismatched it; a signature from where the ranks
    happen to stop would split one bug into many. This one names the mechanism instead."""
    failure = failure_from_outcome(prop, outcome)
    texts = [(r.stack or "") + (r.traceback or "") for r in outcome.ranks]
    if known.rank0_alone_in_broadcast(texts):
        skipped = [r.rank for r, t in zip(outcome.ranks, texts) if "_broadcast_state_dict" not in t]
        return Failure(
            "hang",
            str(Signature("hang", prop, where=known.ALONE_IN_BROADCAST)),
            f"rank 0 broadcasts state in _broadcast_state_dict that rank(s) {skipped} skipped ({failure.summary})",
            failure.details,
        )
    return failure


def _mismatch(prop: str, check: str, where: str, summary: str, **details: Any) -> Failure:
    return Failure("mismatch", str(Signature("mismatch", prop, check, where)), summary, {"check": check, **details})


def _first_difference(got: Any, want: Any, path: str = "") -> str:
    """Where two JSON values first differ, e.g. ``['0.weight']['exp_avg'][3]: 0.5 != 0.25``."""
    if isinstance(got, dict) and isinstance(want, dict):
        for key in sorted(set(got) | set(want), key=str):
            if key not in got:
                return f"{path}[{key!r}] is missing"
            if key not in want:
                return f"{path}[{key!r}] is unexpected"
            diff = _first_difference(got[key], want[key], f"{path}[{key!r}]")
            if diff:
                return diff
        return ""
    if isinstance(got, list) and isinstance(want, list):
        if len(got) != len(want):
            return f"{path} has {len(got)} elements, expected {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            diff = _first_difference(g, w, f"{path}[{i}]")
            if diff:
                return diff
        return ""
    return "" if got == want else f"{path}: {got!r} != {want!r}"


def _exact(prop: str, check: str, where: str, what: str, got: Any, want: Any, **details: Any) -> Failure | None:
    diff = _first_difference(got, want)
    if not diff:
        return None
    return _mismatch(
        prop, check, where, f"{what} differs after the load: {diff}", observed=got, expected=want, **details
    )


def _where(comp: Composition) -> str:
    if comp.wrapper is not Wrapper.NONE:
        return comp.wrapper.value
    if is_plain(comp):
        return "plain"
    name = "+".join(api for api, used in (("fully_shard", comp.shards), ("replicate", comp.replicates)) if used)
    return name + (":hsdp" if comp.mesh else "") + (":spmd" if comp.spmd else "")


def _check_model(
    prop: str, where: str, saved: dict[str, Any], loaded: dict[str, Any], fresh: dict[str, Any] | None, dropped: list
) -> Failure | None:
    """Loaded model == saved, except dropped keys, which keep their fresh values."""
    want = dict(saved["model"])
    for key in dropped:
        if fresh is not None and "model" in fresh:
            want[key] = fresh["model"][key]
    return _exact(prop, "model", where, "the model (parameters and buffers)", loaded["model"], want, dropped=dropped)


def _check_optimizer(
    prop: str,
    where: str,
    source: Composition,
    target: Composition,
    observations: list[dict[str, Any]],
    want: str,
    check: str = "optimizer",
) -> Failure | None:
    """The loaded optimizer state against the ``want`` observation (``saved``, or ``fresh``
    for an optimizer left out of the load): gathered to full, or, under FSDP1, each rank's
    local shards, comparable only between the same layout (another layout is judged by
    resuming: every state entry takes part in the next steps)."""
    if not is_fsdp1(target):
        first = observations[0]
        return _exact(prop, check, where, "the optimizer state", first["loaded"]["optimizer"], first[want]["optimizer"])
    if want == "saved" and source != target:
        return None
    for rank, obs in enumerate(observations):
        failure = _exact(
            prop,
            check,
            where,
            f"rank {rank}'s local optimizer state (FSDP1, one layout)",
            _holding_elements(obs["loaded"]["optimizer_local"]),
            _holding_elements(obs[want]["optimizer_local"]),
            rank=rank,
        )
        if failure is not None:
            return failure
    return None


def _holding_elements(local: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """An FSDP1 rank's local optimizer state without the parameters that have no elements on
    that rank (their per-element states, exp_avg or momentum_buffer, are empty). Whether such a
    parameter has an entry at all depends on who touched the optimizer, not on what was
    saved: training gives it none (no gradient reaches an empty shard), while
    get/set_optimizer_state_dict first run a zero-lr step on a rank whose optimizer has no
    state yet (torch's _init_optim_state), which gives it one, with step 1 and empty tensors;
    FSDP.optim_state_dict_to_load hands that rank nothing for it. No value of the model
    depends on such an entry."""
    return {name: entry for name, entry in local.items() if not any(v == [] for v in entry.values())}


def _same_operations(source: Composition, target: Composition) -> bool:
    """Whether resumed training runs the uninterrupted run's operations (see the docstring)."""
    return source == target and not source.replicates and source.wrapper is not Wrapper.DDP


def _check_resume(prop: str, where: str, case: Case, same: bool, observations: list[dict[str, Any]]) -> Failure | None:
    body = case.body
    assert isinstance(body, (StateDictBody, DcpBody))
    tol = tolerance_for(body.training.dtype.value)
    diverged = False
    for rank, obs in enumerate(observations):
        if "losses_target" not in obs:
            return None
        got, want = obs["losses_target"], obs["losses_source"]
        # judged up to where the uninterrupted run overflows (fuzz.tolerance.judged_prefix)
        judged = judged_prefix(want)
        diverged = diverged or judged < len(want)
        bad = (
            first_mismatch(got[:judged], want[:judged], tol)
            if not same
            else next((i for i, (g, w) in enumerate(zip(got[:judged], want[:judged])) if g != w), None)
        )
        if bad is not None:
            return _mismatch(
                prop,
                known.RESUME_LOSS,
                where,
                f"rank {rank}: losses after the load {got} differ from the uninterrupted run's {want} "
                + ("(must be equal: same composition)" if same else f"(beyond {tol})"),
                rank=rank,
                observed=got,
                expected=want,
            )
    first = observations[0]
    got_p, want_p = first["final_target"], first["final_source"]
    if diverged or any(judged_prefix(v) < len(v) for v in want_p.values()):
        return None  # the uninterrupted run overflowed: its final parameters say nothing
    if same:
        diff = _first_difference(got_p, want_p)
        if diff:
            return _mismatch(
                prop,
                known.RESUME_PARAMS,
                where,
                f"parameters after resuming differ from the uninterrupted run's: {diff}",
            )
        return None
    for name, want_v in want_p.items():
        bad_p = first_mismatch(got_p.get(name, []), want_v, tol)
        if bad_p is not None:
            return _mismatch(
                prop,
                known.RESUME_PARAMS,
                where,
                f"{name}[{bad_p.index}] is {bad_p.actual!r} after resuming, uninterrupted {bad_p.expected!r} "
                f"(error {bad_p.error:.3g} > allowed {bad_p.allowed:.3g})",
                param=name,
            )
    return None


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
    return _named_by_known_bug(case, _judge_dcp(case, outcome))


def _judge_state_dict(case: Case, outcome: Outcome) -> Failure | None:
    if not outcome.ok:
        return _failure(case.property, outcome)
    body = case.body
    assert isinstance(body, StateDictBody)
    prop, where = case.property, body.api.value + known.state_tags(case)
    observations = outcome.observations
    first = observations[0]
    saved, loaded, dropped = first["saved"], first["loaded"], first["dropped"]
    failure = _check_requires_grad(prop, where, observations)
    if failure is None:
        failure = _check_model_keys(prop, where, body, first.get("model_keys"))
    if failure is None and "flat_optimizer" in first:
        failure = _check_flat_optimizer(prop, where, first["flat_optimizer"])
    if failure is None and "taken_optimizer" in first:
        failure = _check_taken_optimizer(prop, where, first["taken_optimizer"], saved["optimizer"])
    if failure is None:
        failure = _check_model(prop, where, saved, loaded, first.get("fresh"), dropped)
    if failure is None:
        failure = _check_optimizer(prop, where, body.source, body.target, observations, "saved")
    for rank, obs in enumerate(observations):
        if failure is None:
            failure = _exact(
                prop, "groups", where, f"rank {rank}'s param groups", obs["loaded"]["groups"], obs["saved"]["groups"]
            )
        result = obs["load_result"]
        if failure is None and (result["unexpected"] or set(result["missing"]) - set(dropped)):
            failure = _mismatch(
                prop, "load_result", where, f"rank {rank}: the load reported {result}; keys left out: {dropped}"
            )
    if failure is None and not dropped:
        failure = _exact(prop, "probe", where, "the forward output on the fixed input", loaded["probe"], saved["probe"])
    if failure is None and not dropped:
        failure = _check_resume(prop, where, case, _same_operations(body.source, body.target), observations)
    return failure


def _check_requires_grad(prop: str, where: str, observations: list[dict[str, Any]]) -> Failure | None:
    """A load keeps each parameter's requires_grad: nn.Module.load_state_dict documents that
    even with ``assign=True`` "the requires_grad field of Parameter ... from the module is
    preserved", and DCP loads in place. Compared on the parameters registered both before and
    after the load (FSDP1 may register a frozen one as a plain tensor view for a while)."""
    for rank, obs in enumerate(observations):
        seen = obs.get("requires_grad")
        if seen is None:
            continue
        before, after = seen["before"], seen["after"]
        changed = sorted(n for n in before.keys() & after.keys() if before[n] != after[n])
        if changed:
            return _mismatch(
                prop,
                "requires_grad",
                where,
                f"rank {rank}: the load changed requires_grad of {changed} (before: {[before[n] for n in changed]})",
                rank=rank,
            )
    return None


def _check_taken_optimizer(prop: str, where: str, taken: Any, state: Any) -> Failure | None:
    """get_optimizer_state_dict returns the optimizer's state keyed by FQN: every parameter
    that has state in ``optimizer.state``, with the same entries and values, frozen
    parameters included (StateDictOptions documents no option that leaves them out of the
    optimizer state dict)."""
    diff = _first_difference(taken, state)
    if not diff:
        return None
    return _mismatch(
        prop,
        "taken_optimizer",
        where,
        f"get_optimizer_state_dict returned a state that differs from the optimizer's own: {diff}",
        observed=taken,
        expected=state,
    )


def _check_reloaded(
    prop: str, where: str, reloaded: dict[str, Any], model: dict[str, Any], check: str, into: str
) -> Failure | None:
    """The checkpoint's model entry, loaded where it was not saved (``into``): on one process
    into a plain model (``no_dist``, check ``reload_one_rank``), or by half of the ranks into a
    model fully_shard shards over them (``dcp.load(..., process_group=...)``, check
    ``reload_half_world``). DCP reshards at load time, so every key of the loading model's
    state dict comes back with the value saved (the source's parameters and persistent
    buffers, gathered in full)."""
    want = {k: model.get(k) for k in reloaded}
    diff = _first_difference(reloaded, want)
    if not diff:
        return None
    return _mismatch(prop, check, where, f"the checkpoint loaded {into} differs from the model saved: {diff}")


def _check_model_keys(prop: str, where: str, body: StateDictBody, observed: dict[str, Any] | None) -> Failure | None:
    """The keys get_model_state_dict returned are the model's own state-dict keys: the keys
    fused modules' hooks make, which the method ``StateDictOptions.dsd_fqn_modifiers`` names
    tells the API about (pytorch/pytorch#146557); with ``ignore_frozen_params``, "the returned
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
    else:
        check, what = "dsd_fqn_modifiers", "get_model_state_dict of a model with fused modules returned keys"
        summary = f"{what} {extra} its state dict does not have and lacks {missing}"
    return _mismatch(prop, check, where, summary, observed=keys, expected=want)


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
    diff = _first_difference(flat, want)
    if not diff:
        return None
    return _mismatch(
        prop,
        "flatten_optimizer_state_dict",
        where,
        f"the flattened optimizer state dict differs from the nested one, flattened as documented: {diff}",
    )


def _judge_dcp(case: Case, outcome: Outcome) -> Failure | None:
    if not outcome.ok:
        return _failure(case.property, outcome)
    body = case.body
    assert isinstance(body, DcpBody)
    prop, observations = case.property, outcome.observations
    where = ("async_save" if body.async_save else "save") + known.state_tags(case)
    for rank, obs in enumerate(observations):
        if obs.get("in_place"):
            return _mismatch(prop, "in_place", "load", f"rank {rank}: {obs['in_place']}")
    if body.mode is not DcpMode.ROUND_TRIP:
        return None
    failure = _check_dcp_options(prop, where, body, observations) or _check_requires_grad(prop, where, observations)
    if failure is not None:
        return failure
    if body.overwrite is Overwrite.FALSE:
        failure = _check_refusal(prop, where, observations)
        if failure is not None:
            return failure
    loaded_entries = [e for e in body.entries if e not in body.skip]
    model_loaded = DcpItem.MODEL in loaded_entries or DcpItem.APP in loaded_entries
    optim_loaded = DcpItem.OPTIMIZER in loaded_entries or DcpItem.APP in loaded_entries
    first = observations[0]
    saved, loaded, fresh, dropped = first["saved"], first["loaded"], first.get("fresh"), first["dropped"]
    if "taken_optimizer" in saved:
        failure = _check_taken_optimizer(prop, where, saved["taken_optimizer"], saved["optimizer"])
    if failure is None and "reloaded" in first:
        into = "on one process into a plain model"
        failure = _check_reloaded(prop, where, first["reloaded"], saved["model"], "reload_one_rank", into)
    for obs in observations:
        if failure is None and "reloaded_half" in obs:
            half = obs["reloaded_half"]
            into = f"by {half['ranks']} of the ranks into a model sharded over them"
            failure = _check_reloaded(prop, where, half["values"], saved["model"], "reload_half_world", into)
    if failure is not None:
        return failure
    if model_loaded:
        failure = _check_model(prop, where, saved, loaded, fresh, dropped)
    else:
        failure = _exact(
            prop, "skipped_model", where, "the model (not loaded)", loaded["model"], (fresh or {})["model"]
        )
    if failure is None and optim_loaded:
        failure = _check_optimizer(prop, where, body.source, body.target, observations, "saved")
    elif failure is None and is_fsdp1(body.target):
        failure = _check_optimizer(prop, where, body.source, body.target, observations, "fresh", "skipped_optimizer")
    elif failure is None and fresh is not None and "optimizer" in fresh:
        failure = _exact(
            prop,
            "skipped_optimizer",
            where,
            "the optimizer state (not loaded)",
            loaded["optimizer"],
            fresh["optimizer"],
        )
    for rank, obs in enumerate(observations):
        if failure is not None:
            break
        want_groups = obs["saved"]["groups"] if optim_loaded else obs["fresh"]["groups"]
        failure = _exact(prop, "groups", where, f"rank {rank}'s param groups", obs["loaded"]["groups"], want_groups)
        for key in ("scalars", "counter", "extra"):
            if failure is None and key in obs["loaded"]:
                got, want = obs["loaded"][key], obs["saved"][key]
                if key == "counter":
                    if got.get("agreed") != got["value"]:
                        failure = _mismatch(prop, "counter", where, f"rank {rank}: ranks loaded different values {got}")
                        break
                    got = {k: v for k, v in got.items() if k != "agreed"}
                    want = {k: v for k, v in want.items() if k != "agreed"}
                failure = _exact(prop, key, where, f"rank {rank}'s {key} entry", got, want)
    if failure is None and model_loaded and not dropped:
        failure = _exact(prop, "probe", where, "the forward output on the fixed input", loaded["probe"], saved["probe"])
    if failure is None:
        failure = _check_resume(prop, where, case, _same_operations(body.source, body.target), observations)
    return failure


#: What DefaultLoadPlanner raises for a key of the loaded dict the checkpoint lacks
#: (without allow_partial_load); DcpBody.absent's key is "absent".
MISSING_KEY = "Missing key in checkpoint state_dict: absent"


def _check_dcp_options(prop: str, where: str, body: DcpBody, observations: list[dict[str, Any]]) -> Failure | None:
    """The oracles of the options that have one beyond the exact round trip: absent (with and
    without allow_partial_load), dedup_save_to_lowest_rank, the format_utils conversion, and
    the checkpointing process of AsyncCheckpointerType.PROCESS ended after the case."""
    if body.process_checkpointer:
        failure = _check_checkpoint_process(prop, where, observations)
        if failure is not None:
            return failure
    if body.absent:
        failure = _check_absent(prop, where, body, observations)
        if failure is not None:
            return failure
    if body.save_planner is not None and body.save_planner.dedup_save_to_lowest_rank:
        failure = _check_dedup(prop, where, observations)
        if failure is not None:
            return failure
    if body.convert:
        return _check_converted(prop, where, body, observations[0])
    return None


def _check_checkpoint_process(prop: str, where: str, observations: list[dict[str, Any]]) -> Failure | None:
    """async_save(async_checkpointer_type=PROCESS) started a checkpointing process on every
    rank, and it ended when asked to (TERMINATE, as the process object's own cleanup does):
    the pool's ranks run case after case, so none may be left behind."""
    for rank, obs in enumerate(observations):
        ended = obs.get("checkpoint_process", {})
        if not ended.get("started") or ended.get("alive_after"):
            return _mismatch(
                prop,
                "checkpoint_process",
                where,
                f"rank {rank}: the checkpointing process of AsyncCheckpointerType.PROCESS "
                + ("was never started" if not ended.get("started") else "was still alive after TERMINATE and SIGTERM"),
                observed=ended,
            )
    return None


def _check_absent(prop: str, where: str, body: DcpBody, observations: list[dict[str, Any]]) -> Failure | None:
    """DefaultLoadPlanner documents allow_partial_load: "If False, will raise a runtime error if
    a key is present in state_dict, but not in the checkpoint". With it, the load succeeds and
    the key's tensor is left as it was; without it, every rank gets the error (dcp.load raises
    it inside its plan's reduce-scatter, so as a CheckpointException on every rank)."""
    allowed = body.load_planner is not None and body.load_planner.allow_partial_load
    for rank, obs in enumerate(observations):
        absent = obs["absent"]
        refusal = absent["refusal"]
        if allowed and refusal is not None:
            return _mismatch(
                prop,
                "allow_partial_load",
                where,
                f"rank {rank}: dcp.load with allow_partial_load=True refused a key the checkpoint lacks: "
                f"{refusal['type']}: {refusal['message'][:500]}",
            )
        if allowed and absent["after"] != absent["before"]:
            return _mismatch(
                prop,
                "allow_partial_load",
                where,
                f"rank {rank}: the key the checkpoint lacks changed in the load: {absent['after']} "
                f"(was {absent['before']})",
            )
        if not allowed and refusal is None:
            return _mismatch(
                prop,
                "allow_partial_load",
                where,
                f"rank {rank}: dcp.load without allow_partial_load loaded a dict with a key the checkpoint lacks",
            )
        if not allowed and (
            not refusal["type"].endswith(".CheckpointException") or MISSING_KEY not in refusal["message"]
        ):
            return _mismatch(
                prop,
                "allow_partial_load",
                where,
                f"rank {rank}: dcp.load without allow_partial_load raised {refusal['type']}: "
                f"{refusal['message'][:500]} (expected CheckpointException {MISSING_KEY!r})",
            )
    return None


def _check_dedup(prop: str, where: str, observations: list[dict[str, Any]]) -> Failure | None:
    """DefaultSavePlanner(dedup_save_to_lowest_rank=True): an item that several ranks' local
    plans hold (replicated) is written once, by the lowest of those ranks, and every planned
    item is written. FileSystemWriter names rank r's files ``__<r>_<n>.distcp``."""
    holders: dict[str, list[int]] = {}
    for rank, obs in enumerate(observations):
        for item in obs["dedup"]["local_items"]:
            holders.setdefault(repr(item), []).append(rank)
    written: dict[str, str] = {}
    for fqn, offset, relative_path in observations[0]["dedup"]["written"]:
        key = repr([fqn, offset])
        if key in written:
            return _mismatch(prop, "dedup", where, f"item {key} is written twice: {written[key]}, {relative_path}")
        written[key] = relative_path
        if key not in holders:
            return _mismatch(prop, "dedup", where, f"item {key} is written ({relative_path}) but no rank planned it")
        lowest = min(holders[key])
        if not relative_path.startswith(f"__{lowest}_"):
            return _mismatch(
                prop,
                "dedup",
                where,
                f"item {key}, planned by ranks {sorted(holders[key])}, is written to {relative_path}, "
                f"not by rank {lowest} (dedup_save_to_lowest_rank=True)",
            )
    unwritten = sorted(set(holders) - set(written))
    if unwritten:
        return _mismatch(prop, "dedup", where, f"items planned but not written: {unwritten[:5]}")
    return None


def _check_converted(prop: str, where: str, body: DcpBody, first: dict[str, Any]) -> Failure | None:
    """format_utils.dcp_to_torch_save: the torch.save file, read with torch.load, holds the
    checkpoint's state in full: the model's parameters and buffers as the full tensors the
    source held, the optimizer's state and param groups, the scalars and the extra tensor.
    (torch_save_to_dcp, the way back, is judged by the load of its checkpoint: the exact round
    trip.)"""
    converted, saved = first["convert"], first["saved"]
    if DcpItem.MODEL in body.entries or DcpItem.APP in body.entries:
        failure = _exact(
            prop, "dcp_to_torch_save", where, "the model in the torch.save file", converted.get("model"), saved["model"]
        )
        if failure is not None:
            return failure
    if (DcpItem.OPTIMIZER in body.entries or DcpItem.APP in body.entries) and "optimizer" in saved:
        failure = _exact(
            prop,
            "dcp_to_torch_save",
            where,
            "the optimizer state in the torch.save file",
            converted.get("optimizer"),
            saved["optimizer"],
        )
        if failure is None:
            failure = _exact(
                prop,
                "dcp_to_torch_save",
                where,
                "the param groups in the torch.save file",
                converted.get("groups"),
                saved["groups"],
            )
        if failure is not None:
            return failure
    for key in ("scalars", "extra"):
        if DcpItem(key) in body.entries:
            failure = _exact(
                prop,
                "dcp_to_torch_save",
                where,
                f"the {key} entry in the torch.save file",
                converted.get(key),
                saved[key],
            )
            if failure is not None:
                return failure
    return None


def _check_refusal(prop: str, where: str, observations: list[dict[str, Any]]) -> Failure | None:
    """FileSystemWriter(overwrite=False) over an existing checkpoint: the documented refusal
    (CheckpointException "Checkpoint already exists") on every rank, and the existing
    checkpoint left as it was."""
    for rank, obs in enumerate(observations):
        refusal = obs["overwrite"]["refusal"]
        if refusal is None:
            return _mismatch(
                prop, "overwrite", where, f"rank {rank}: FileSystemWriter(overwrite=False) saved over a checkpoint"
            )
        if not refusal["type"].endswith(".CheckpointException") or ALREADY_EXISTS not in refusal["message"]:
            return _mismatch(
                prop,
                "overwrite",
                where,
                f"rank {rank}: FileSystemWriter(overwrite=False) over a checkpoint raised {refusal['type']}: "
                f"{refusal['message'][:500]} (expected CheckpointException {ALREADY_EXISTS!r})",
            )
    if not observations[0]["overwrite"]["untouched"]:
        return _mismatch(prop, "overwrite", where, "the refused save (overwrite=False) changed the existing checkpoint")
    return None


def _layout_features(source: Composition, target: Composition) -> list[str]:
    out = [f"source:{_where(source)}", f"target:{_where(target)}"]
    if source == target:
        out.append("reshard:none")
    elif source.mesh != target.mesh and not is_plain(source) and not is_plain(target):
        out.append("reshard:mesh")
    elif tensor_kind(source) != tensor_kind(target):
        out.append(f"reshard:{tensor_kind(source)}->{tensor_kind(target)}")
    else:
        out.append("reshard:composition")
    for comp in (source, target):
        if any(s.shard_dim for s in comp.shards):
            out.append("shard_placement_fn")
        if comp.checkpoints:
            out.append("activation_checkpoint")
        if comp.spmd:
            out.append(SPMD_FEATURE)
        if comp.auto_wrap:
            out.append("fsdp1:auto_wrap")
        if known.fsdp1_shard1(comp):
            out.append("fsdp1:hybrid_shard1")
    return out


def _schedule_features(body: StateDictBody | DcpBody) -> list[str]:
    """requires_grad:freeze / :unfreeze, and :before_save / :after_save for where a change falls."""
    out = []
    for c in body.requires_grad:
        out.append("requires_grad:" + ("unfreeze" if c.trainable else "freeze"))
        out.append("requires_grad:" + ("before_save" if c.step < body.training.steps else "after_save"))
    return out


def _optimizer_features(tree: ModuleTree, frozen_in_optimizer: bool, empty_group: bool) -> list[str]:
    out = []
    if any(getattr(n, "frozen", False) for n in tree.paths().values()):
        out.append("frozen:in_optimizer" if frozen_in_optimizer else "frozen:model_only")
    if empty_group:
        out.append("param_groups:empty")
    return out


def features_state_dict(case: Case) -> list[str]:
    body = case.body
    assert isinstance(body, StateDictBody)
    s, ld = body.save, body.load
    out = [
        f"api:{body.api.value}",
        "state_dict:full" if s.full_state_dict else "state_dict:sharded",
        f"optimizer:{body.training.optimizer.value}",
        f"param_groups:{body.training.param_groups}",
        f"steps_after:{min(body.steps_after, 2)}",
    ]
    out += [f"save:{n}" for n, on in (("cpu_offload", s.cpu_offload),) if on]
    # FSDP1's own API reads broadcast_from_rank0 as its configs' rank0_only (fsdp1:rank0_only)
    broadcast = ld.broadcast_from_rank0 and body.api is not Api.FSDP1
    out += [f"load:{n}" for n, on in (("cpu_offload", ld.cpu_offload), ("broadcast_from_rank0", broadcast)) if on]
    out.append("strict" if ld.strict else "non-strict" + (":drop" if body.drop else ""))
    if s.ignore_frozen_params:
        out.append("save:ignore_frozen_params")
    if s.flatten_optimizer_state_dict:
        out.append("flatten_optimizer_state_dict")
    if body.fused:
        # dsd_fqn_modifiers: the option passed (a method of another name than torch's default)
        out.append("fused" if body.fqn_modifiers == DEFAULT_FQN_MODIFIERS else "fused:dsd_fqn_modifiers")
    if body.api is Api.FSDP1 and ld.broadcast_from_rank0:
        out.append("fsdp1:rank0_only")
    if body.target_meta_init:
        out.append("meta_init")
    fsdp1_sides = [side for side, comp in (("source", body.source), ("target", body.target)) if is_fsdp1(comp)]
    if fsdp1_sides and body.api is not Api.FSDP1:
        # get/set_*_state_dict on FSDP1 models: e.g. split:fsdp1_source, combined:fsdp1_both
        out.append(f"{body.api.value}:fsdp1_{'both' if len(fsdp1_sides) == 2 else fsdp1_sides[0]}")
    out += _optimizer_features(body.tree, body.frozen_in_optimizer, body.empty_group) + _schedule_features(body)
    return sorted(set(out + _layout_features(body.source, body.target)))


def features_dcp(case: Case) -> list[str]:
    body = case.body
    assert isinstance(body, DcpBody)
    out = [f"entry:{e.value}" for e in body.entries]
    out.append("orders:differ" if len(set(body.orders)) > 1 else "orders:same")
    out.append("async_save" if body.async_save else "save")
    out.append("storage:objects" if body.storage_objects else "storage:checkpoint_id")
    out.append(f"save:{'full' if body.save_full_state_dict else 'sharded'}")
    out.append(f"load:{'full' if body.load_full_state_dict else 'sharded'}")
    out += ["save:cpu_offload"] * body.save_cpu_offload + ["load:cpu_offload"] * body.load_cpu_offload
    out += [f"skip:{e.value}" for e in body.skip]
    if body.drop:
        out.append("drop")
    if body.module_stateful:
        out.append("module_stateful")
    if body.target_meta_init:
        out.append("meta_init")
    if len(body.collective_entries()) > 1:
        out.append("collective_statefuls:several")
    if body.patched:
        out.append("patched")
    fsdp1_sides = [side for side, comp in (("source", body.source), ("target", body.target)) if is_fsdp1(comp)]
    if fsdp1_sides:
        # how an FSDP1 side's state moves: e.g. fsdp1:app:target, fsdp1:patched:both, fsdp1:classic:both
        how = "classic" if body.classic_fsdp1 else "patched" if body.patched else "app"
        out.append(f"fsdp1:{how}:{'both' if len(fsdp1_sides) == 2 else fsdp1_sides[0]}")
    if body.classic_fsdp1 and DcpItem.OPTIMIZER in body.entries:
        out.append(f"api:{Api.FSDP1.value}")
    if body.overwrite is not Overwrite.NONE:
        out.append(f"overwrite:{body.overwrite.value}")
    if body.reloads_elsewhere():
        out.append("reload:one_rank")
        if body.reloads_in_half_world(case.world_size):
            out.append("reload:half_world")
    if body.async_saves:
        out.append("async:in_flight")
        out.append(f"async:saves:{body.async_saves}")
    if body.cache_staged:
        out.append("async:cached")
    if body.no_dist:
        out.append("no_dist")
        if body.async_save:
            out.append("no_dist:async_save")
    out += _optimizer_features(body.tree, body.frozen_in_optimizer, body.empty_group) + _schedule_features(body)
    out += _dcp_option_features(body)
    return sorted(set(out + _layout_features(body.source, body.target)))


def _dcp_option_features(body: DcpBody) -> list[str]:
    """FileSystemWriter's I/O options, the planners' options, absent keys, format_utils."""
    out = [f"writer:{name}" for name in body.writer.changed()]
    sp, lp = body.save_planner, body.load_planner
    if sp is not None:
        out.append("save_planner")
        out += ["save_planner:dedup_save_to_lowest_rank"] * sp.dedup_save_to_lowest_rank
        out += ["save_planner:enable_plan_caching"] * sp.enable_plan_caching
        out += ["save_planner:flatten_sharded_tensors:false"] * (not sp.flatten_sharded_tensors)
    if lp is not None:
        out.append("load_planner")
        out += ["load_planner:allow_partial_load"] * lp.allow_partial_load
        out += ["load_planner:flatten_sharded_tensors:false"] * (not lp.flatten_sharded_tensors)
    if body.absent:
        out.append("absent:allowed" if lp is not None and lp.allow_partial_load else "absent:refused")
    if body.convert:
        out.append("format_utils:convert")
    if body.own_group:
        out.append("process_group:own")
    if body.stager is not None:
        out += body.stager.features()
    if body.process_checkpointer:
        out.append("async_checkpointer:process")
    if not body.use_collectives:
        out.append("use_collectives:false:" + ("async_save" if body.async_save else "save"))
    if body.torch_save_reader:
        out.append("format_utils:broadcasting_torch_save_reader")
    return out


STATE_DICT = register(
    Property(
        name="state_dict",
        description="get/set_*_state_dict (and FSDP2's own) move model and optimizer state exactly, across layouts",
        cases=strategy("state_dict_cases"),
        judge=judge_state_dict,
        features=features_state_dict,
        stall=known.ALONE_IN_BROADCAST_STALL,
        body=StateDictBody,
        repro="fuzz.repro.script:render",
    )
)

DCP = register(
    Property(
        name="dcp",
        description="DCP save/async_save/load with Stateful objects and per-rank key orders round-trip exactly",
        cases=strategy("dcp_cases"),
        judge=judge_dcp,
        features=features_dcp,
        stall=known.ALONE_IN_BROADCAST_STALL,
        body=DcpBody,
        repro="fuzz.repro.script:render",
    )
)
