"""The checks the state-dict and DCP judges share (:mod:`fuzz.properties.state_dict`,
:mod:`fuzz.properties.dcp_checks`): exact comparison of what a load restored (model, optimizer
state, param groups, requires_grad), of what get_optimizer_state_dict returned, of a checkpoint
reloaded elsewhere, and resume equivalence within the dtype's tolerance; each returns the
failure, named by property, check and call, or None.
"""

from __future__ import annotations

from typing import Any

from fuzz import known
from fuzz.model import (
    Case,
    Composition,
    DcpBody,
    StateDictBody,
    Wrapper,
    is_fsdp1,
    is_plain,
)
from fuzz.signature import Failure, Signature, failure_from_outcome
from fuzz.tolerance import first_mismatch, judged_prefix, tolerance_for
from fuzz.verdict import Outcome


def failure_of_outcome(prop: str, outcome: Outcome) -> Failure:
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


def mismatch(prop: str, check: str, where: str, summary: str, **details: Any) -> Failure:
    return Failure("mismatch", str(Signature("mismatch", prop, check, where)), summary, {"check": check, **details})


def first_difference(got: Any, want: Any, path: str = "") -> str:
    """Where two JSON values first differ, e.g. ``['0.weight']['exp_avg'][3]: 0.5 != 0.25``."""
    if isinstance(got, dict) and isinstance(want, dict):
        for key in sorted(set(got) | set(want), key=str):
            if key not in got:
                return f"{path}[{key!r}] is missing"
            if key not in want:
                return f"{path}[{key!r}] is unexpected"
            diff = first_difference(got[key], want[key], f"{path}[{key!r}]")
            if diff:
                return diff
        return ""
    if isinstance(got, list) and isinstance(want, list):
        if len(got) != len(want):
            return f"{path} has {len(got)} elements, expected {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            diff = first_difference(g, w, f"{path}[{i}]")
            if diff:
                return diff
        return ""
    return "" if got == want else f"{path}: {got!r} != {want!r}"


def exact(prop: str, check: str, where: str, what: str, got: Any, want: Any, **details: Any) -> Failure | None:
    diff = first_difference(got, want)
    if not diff:
        return None
    return mismatch(
        prop, check, where, f"{what} differs after the load: {diff}", observed=got, expected=want, **details
    )


def where_of(comp: Composition) -> str:
    if comp.wrapper is not Wrapper.NONE:
        return comp.wrapper.value
    if is_plain(comp):
        return "plain"
    name = "+".join(api for api, used in (("fully_shard", comp.shards), ("replicate", comp.replicates)) if used)
    return name + (":hsdp" if comp.mesh else "") + (":spmd" if comp.spmd else "")


def check_model(
    prop: str, where: str, saved: dict[str, Any], loaded: dict[str, Any], fresh: dict[str, Any] | None, dropped: list
) -> Failure | None:
    """Loaded model == saved, except dropped keys, which keep their fresh values."""
    want = dict(saved["model"])
    for key in dropped:
        if fresh is not None and "model" in fresh:
            want[key] = fresh["model"][key]
    return exact(prop, "model", where, "the model (parameters and buffers)", loaded["model"], want, dropped=dropped)


def check_optimizer(
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
        return exact(prop, check, where, "the optimizer state", first["loaded"]["optimizer"], first[want]["optimizer"])
    if want == "saved" and source != target:
        return None
    for rank, obs in enumerate(observations):
        failure = exact(
            prop,
            check,
            where,
            f"rank {rank}'s local optimizer state (FSDP1, one layout)",
            holding_elements(obs["loaded"]["optimizer_local"]),
            holding_elements(obs[want]["optimizer_local"]),
            rank=rank,
        )
        if failure is not None:
            return failure
    return None


def holding_elements(local: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """An FSDP1 rank's local optimizer state without the parameters that have no elements on
    that rank (their per-element states, exp_avg or momentum_buffer, are empty). Whether such a
    parameter has an entry at all depends on who touched the optimizer, not on what was
    saved: training gives it none (no gradient reaches an empty shard), while
    get/set_optimizer_state_dict first run a zero-lr step on a rank whose optimizer has no
    state yet (torch's _init_optim_state), which gives it one, with step 1 and empty tensors;
    FSDP.optim_state_dict_to_load hands that rank nothing for it. No value of the model
    depends on such an entry."""
    return {name: entry for name, entry in local.items() if not any(v == [] for v in entry.values())}


def same_operations(source: Composition, target: Composition) -> bool:
    """Whether resumed training runs the uninterrupted run's operations (see the docstring)."""
    return source == target and not source.replicates and source.wrapper is not Wrapper.DDP


def check_resume(prop: str, where: str, case: Case, same: bool, observations: list[dict[str, Any]]) -> Failure | None:
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
            return mismatch(
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
        diff = first_difference(got_p, want_p)
        if diff:
            return mismatch(
                prop,
                known.RESUME_PARAMS,
                where,
                f"parameters after resuming differ from the uninterrupted run's: {diff}",
            )
        return None
    for name, want_v in want_p.items():
        bad_p = first_mismatch(got_p.get(name, []), want_v, tol)
        if bad_p is not None:
            return mismatch(
                prop,
                known.RESUME_PARAMS,
                where,
                f"{name}[{bad_p.index}] is {bad_p.actual!r} after resuming, uninterrupted {bad_p.expected!r} "
                f"(error {bad_p.error:.3g} > allowed {bad_p.allowed:.3g})",
                param=name,
            )
    return None


def check_requires_grad(prop: str, where: str, observations: list[dict[str, Any]]) -> Failure | None:
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
            return mismatch(
                prop,
                "requires_grad",
                where,
                f"rank {rank}: the load changed requires_grad of {changed} (before: {[before[n] for n in changed]})",
                rank=rank,
            )
    return None


def check_taken_optimizer(prop: str, where: str, taken: Any, state: Any) -> Failure | None:
    """get_optimizer_state_dict returns the optimizer's state keyed by FQN: every parameter
    that has state in ``optimizer.state``, with the same entries and values, frozen
    parameters included (StateDictOptions documents no option that leaves them out of the
    optimizer state dict)."""
    diff = first_difference(taken, state)
    if not diff:
        return None
    return mismatch(
        prop,
        "taken_optimizer",
        where,
        f"get_optimizer_state_dict returned a state that differs from the optimizer's own: {diff}",
        observed=taken,
        expected=state,
    )


def check_reloaded(
    prop: str, where: str, reloaded: dict[str, Any], model: dict[str, Any], check: str, into: str
) -> Failure | None:
    """The checkpoint's model entry, loaded where it was not saved (``into``): on one process
    into a plain model (``no_dist``, check ``reload_one_rank``), or by half of the ranks into a
    model fully_shard shards over them (``dcp.load(..., process_group=...)``, check
    ``reload_half_world``). DCP reshards at load time, so every key of the loading model's
    state dict comes back with the value saved (the source's parameters and persistent
    buffers, gathered in full)."""
    want = {k: model.get(k) for k in reloaded}
    diff = first_difference(reloaded, want)
    if not diff:
        return None
    return mismatch(prop, check, where, f"the checkpoint loaded {into} differs from the model saved: {diff}")
