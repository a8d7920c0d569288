"""The DCP property's judge (:func:`judge_dcp_checks`, named by :func:`fuzz.properties.state_dict.judge_dcp`):
a round trip through dcp.save / async_save / load judged exactly, with the checks of the DCP
options (writer, planners, partial loads, dedup, format_utils conversion, the checkpointer
process, overwrite's refusal) beside the state-dict checks both properties share
(:mod:`fuzz.properties.state_dict_checks`).
"""

from __future__ import annotations

from typing import Any

from fuzz import known
from fuzz.model import (
    Case,
    DcpBody,
    DcpItem,
    DcpMode,
    Overwrite,
    is_fsdp1,
)
from fuzz.properties.state_dict_checks import (
    check_model,
    check_optimizer,
    check_reloaded,
    check_requires_grad,
    check_resume,
    check_taken_optimizer,
    exact,
    failure_of_outcome,
    mismatch,
    same_operations,
)
from fuzz.signature import Failure
from fuzz.verdict import Outcome

#: What FileSystemWriter(overwrite=False) raises on an existing checkpoint (a RuntimeError in its
#: prepare_local_plan, which DCP reports as a CheckpointException on every rank).
ALREADY_EXISTS = "Checkpoint already exists"


def judge_dcp_outcome(case: Case, outcome: Outcome) -> Failure | None:
    if not outcome.ok:
        return failure_of_outcome(case.property, outcome)
    body = case.body
    assert isinstance(body, DcpBody)
    prop, observations = case.property, outcome.observations
    where = ("async_save" if body.async_save else "save") + known.state_tags(case)
    for rank, obs in enumerate(observations):
        if obs.get("in_place"):
            return mismatch(prop, "in_place", "load", f"rank {rank}: {obs['in_place']}")
    if body.mode is not DcpMode.ROUND_TRIP:
        return None
    failure = _check_dcp_options(prop, where, body, observations) or check_requires_grad(prop, where, observations)
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
        failure = check_taken_optimizer(prop, where, saved["taken_optimizer"], saved["optimizer"])
    if failure is None and "reloaded" in first:
        into = "on one process into a plain model"
        failure = check_reloaded(prop, where, first["reloaded"], saved["model"], "reload_one_rank", into)
    for obs in observations:
        if failure is None and "reloaded_half" in obs:
            half = obs["reloaded_half"]
            into = f"by {half['ranks']} of the ranks into a model sharded over them"
            failure = check_reloaded(prop, where, half["values"], saved["model"], "reload_half_world", into)
    if failure is not None:
        return failure
    if model_loaded:
        failure = check_model(prop, where, saved, loaded, fresh, dropped)
    else:
        failure = exact(prop, "skipped_model", where, "the model (not loaded)", loaded["model"], (fresh or {})["model"])
    if failure is None and optim_loaded:
        failure = check_optimizer(prop, where, body.source, body.target, observations, "saved")
    elif failure is None and is_fsdp1(body.target):
        failure = check_optimizer(prop, where, body.source, body.target, observations, "fresh", "skipped_optimizer")
    elif failure is None and fresh is not None and "optimizer" in fresh:
        failure = exact(
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
        failure = exact(prop, "groups", where, f"rank {rank}'s param groups", obs["loaded"]["groups"], want_groups)
        for key in ("scalars", "counter", "extra"):
            if failure is None and key in obs["loaded"]:
                got, want = obs["loaded"][key], obs["saved"][key]
                if key == "counter":
                    if got.get("agreed") != got["value"]:
                        failure = mismatch(prop, "counter", where, f"rank {rank}: ranks loaded different values {got}")
                        break
                    got = {k: v for k, v in got.items() if k != "agreed"}
                    want = {k: v for k, v in want.items() if k != "agreed"}
                failure = exact(prop, key, where, f"rank {rank}'s {key} entry", got, want)
    if failure is None and model_loaded and not dropped:
        failure = exact(prop, "probe", where, "the forward output on the fixed input", loaded["probe"], saved["probe"])
    if failure is None:
        failure = check_resume(prop, where, case, same_operations(body.source, body.target), observations)
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
            return mismatch(
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
            return mismatch(
                prop,
                "allow_partial_load",
                where,
                f"rank {rank}: dcp.load with allow_partial_load=True refused a key the checkpoint lacks: "
                f"{refusal['type']}: {refusal['message'][:500]}",
            )
        if allowed and absent["after"] != absent["before"]:
            return mismatch(
                prop,
                "allow_partial_load",
                where,
                f"rank {rank}: the key the checkpoint lacks changed in the load: {absent['after']} "
                f"(was {absent['before']})",
            )
        if not allowed and refusal is None:
            return mismatch(
                prop,
                "allow_partial_load",
                where,
                f"rank {rank}: dcp.load without allow_partial_load loaded a dict with a key the checkpoint lacks",
            )
        if not allowed and (
            not refusal["type"].endswith(".CheckpointException") or MISSING_KEY not in refusal["message"]
        ):
            return mismatch(
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
            return mismatch(prop, "dedup", where, f"item {key} is written twice: {written[key]}, {relative_path}")
        written[key] = relative_path
        if key not in holders:
            return mismatch(prop, "dedup", where, f"item {key} is written ({relative_path}) but no rank planned it")
        lowest = min(holders[key])
        if not relative_path.startswith(f"__{lowest}_"):
            return mismatch(
                prop,
                "dedup",
                where,
                f"item {key}, planned by ranks {sorted(holders[key])}, is written to {relative_path}, "
                f"not by rank {lowest} (dedup_save_to_lowest_rank=True)",
            )
    unwritten = sorted(set(holders) - set(written))
    if unwritten:
        return mismatch(prop, "dedup", where, f"items planned but not written: {unwritten[:5]}")
    return None


def _check_converted(prop: str, where: str, body: DcpBody, first: dict[str, Any]) -> Failure | None:
    """format_utils.dcp_to_torch_save: the torch.save file, read with torch.load, holds the
    checkpoint's state in full: the model's parameters and buffers as the full tensors the
    source held, the optimizer's state and param groups, the scalars and the extra tensor.
    (torch_save_to_dcp, the way back, is judged by the load of its checkpoint: the exact round
    trip.)"""
    converted, saved = first["convert"], first["saved"]
    if DcpItem.MODEL in body.entries or DcpItem.APP in body.entries:
        failure = exact(
            prop, "dcp_to_torch_save", where, "the model in the torch.save file", converted.get("model"), saved["model"]
        )
        if failure is not None:
            return failure
    if (DcpItem.OPTIMIZER in body.entries or DcpItem.APP in body.entries) and "optimizer" in saved:
        failure = exact(
            prop,
            "dcp_to_torch_save",
            where,
            "the optimizer state in the torch.save file",
            converted.get("optimizer"),
            saved["optimizer"],
        )
        if failure is None:
            failure = exact(
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
            failure = exact(
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
            return mismatch(
                prop, "overwrite", where, f"rank {rank}: FileSystemWriter(overwrite=False) saved over a checkpoint"
            )
        if not refusal["type"].endswith(".CheckpointException") or ALREADY_EXISTS not in refusal["message"]:
            return mismatch(
                prop,
                "overwrite",
                where,
                f"rank {rank}: FileSystemWriter(overwrite=False) over a checkpoint raised {refusal['type']}: "
                f"{refusal['message'][:500]} (expected CheckpointException {ALREADY_EXISTS!r})",
            )
    if not observations[0]["overwrite"]["untouched"]:
        return mismatch(prop, "overwrite", where, "the refused save (overwrite=False) changed the existing checkpoint")
    return None
