"""The known-bug registry: every torch bug the suite has found, in one place.

One :class:`KnownBug` record per bug (:mod:`fuzz.known_bugs`): its id, the upstream issue or
pull request (or "none found" after a search), the odds at which strategies keep drawing it,
whether it ends the ranks (an exception, crash or hang) or leaves them alive (a wrong value),
the condition under which a case meets it (over the predicates of :mod:`fuzz.known_conditions`),
the tag a mismatch it causes carries and the state-dict checks it renames. Every list here is
derived from the records: :data:`BUGS`, :data:`CONDITIONS`, the tags of :func:`mismatch_tags`
and the renames of :func:`renaming`. Strategies ask the conditions to keep known bugs rare,
judges to name a mismatch by the degenerate setup it comes from (``:shard1``,
``:unfrozen-unresharded``), health runs to skip cases that would end their ranks, and corpus
entries name their record by ``"bug"``. In the spirit of Hypothesis's ``internal/compat.py``:
quirks live in one place, callers ask by name; this module re-exports the records, the
predicates and the record type, so callers import ``fuzz.known`` only.

A bug fixed upstream leaves its record and its corpus entries here until the oldest torch the
suite supports has the fix; the entries' tests then fail (strict xfail), which is the signal
to retire them.

Imports only the standard library, the model, the verdict types and the other known_* modules.
"""

from __future__ import annotations

from collections.abc import Callable

from fuzz.known_bugs import (
    BROADCAST_EMPTY,
    CACHED_STAGING_NEEDS_ACCELERATOR,
    CACHED_STAGING_PINNED_METADATA,
    CHECKPOINT_DEBUG,
    COMPILED_UNFREEZE_PLAIN,
    DELAY_ALL_REDUCE_ROOT,
    DELAY_BUFFER_FLOAT32,
    DIVIDE_FACTOR_TWICE,
    DTENSOR_CONV_PARTIAL,
    DTENSOR_MSE_LOSS,
    FLAT_FULL_OPTIM,
    FOREACH_MIXED,
    FROZEN_INT_RESHARD,
    FROZEN_OPTIM_STATE_DROPPED,
    FSDP1_ASYNC_DEFAULT_STAGER,
    FSDP1_COMPILE_SHARDED_GRAD,
    FSDP1_DCP_EMPTY_SHARD,
    FSDP1_DCP_STATELESS,
    FSDP1_FROZEN_UNIT,
    FSDP1_FULL_OFFLOAD,
    FSDP1_HSDP_OPTIMIZER_LOAD,
    FSDP1_HSDP_RANK0_BROADCAST,
    FSDP1_HSDP_SHARD1,
    FSDP1_UNFROZEN_FROZEN_UNIT,
    FUSED_CUSTOM_NAME,
    FUSED_IGNORE_FROZEN,
    FUSED_OPTIM_KEYS,
    GROUP_FORCED_IN_RECOMPUTE,
    INT_RESHARD_DIM1,
    MP_FROZEN_AT_LAZY_INIT,
    MP_NEVER_RUN_NO_SYNC,
    MP_UNIFORM_GRAD_DTYPE,
    PLAN_CACHE_FAILED_SAVE,
    RECORDS,
    SAC_OVER_FSDP_UNIT,
    STAGER_REUSED_AFTER_CLOSE,
    STATELESS_FULL,
    UNFROZEN_UNRESHARDED,
    UNUSED_NO_ALL_REDUCE,
)
from fuzz.known_conditions import (
    broadcast_empty,
    broadcast_empty_app,
    broadcast_empty_combined,
    cache_staged,
    checkpoint_debug,
    compiled_unfreeze_ignored,
    default_stager_copies_sharded,
    delayed_all_reduce,
    delayed_not_float32,
    divide_factor_twice,
    flat_full_optimizer,
    foreach_over_mixed,
    foreach_over_mixed_case,
    frozen_int_reshard_unit,
    frozen_state_dropped,
    fsdp1_async_default_stager,
    fsdp1_compiled_with_sharded_grads,
    fsdp1_dcp_empty_shard,
    fsdp1_dcp_stateless,
    fsdp1_frozen_source,
    fsdp1_frozen_unit,
    fsdp1_full_offload,
    fsdp1_hsdp_2d,
    fsdp1_shard1,
    fsdp1_shard1_full_offload_load,
    fsdp1_unfrozen_in_frozen_unit,
    full_offload_gathers,
    fused_custom_name,
    fused_ignore_frozen,
    fused_in_optimizer,
    group_recomputed_in_part,
    hsdp_optimizer_load,
    int_reshard_dim1,
    never_run_under_no_sync,
    optimizer_holds_unresharded,
    plan_cache_failed_save,
    selective_over_unit,
    shard1,
    spmd_mse_loss,
    spmd_tp_conv,
    stager_reused,
    stateless_full,
    stateless_full_path,
    stateless_optimizer,
    unfrozen_in_frozen_mp_unit,
    unfrozen_unresharded_unit,
    unresharded_frozen,
    unused_no_all_reduce,
)
from fuzz.known_record import (
    ALL_CHECKS,
    FIXED_ENV,
    FIXES,
    KNOWN_BUG_ODDS,
    KNOWN_HANG_ODDS,
    NONE_FOUND,
    OPTIMIZER_CHECKS,
    RESUME_CHECKS,
    RESUME_LOSS,
    RESUME_PARAMS,
    SAVE_CALL,
    AnyOf,
    Condition,
    KnownBug,
    OfBody,
    OfCase,
    OfComposition,
    OfTraining,
    OfTree,
    OfTreeAndTraining,
    Patch,
    compositions,
    fix_of,
    fix_written_for,
    fixed,
    present,
    release,
)
from fuzz.model import Case, Composition, DcpBody, ModuleTree, StateDictBody, Training
from fuzz.verdict import Stall

#: The records, by id. Corpus entries name them by ``id``.
BUGS: dict[str, KnownBug] = {b.id: b for b in RECORDS}

#: Every bug whose condition a case can meet, with that condition over the whole case: the one
#: place that says which bugs a case meets (:func:`bugs_met`, :func:`known_bug`,
#: :func:`ends_ranks` and :func:`explains` all read it), in the records' order.
CONDITIONS: tuple[tuple[KnownBug, Callable[[Case], bool]], ...] = tuple(
    (b, b.condition.met) for b in RECORDS if b.condition is not None
)

#: The bugs whose tag a training mismatch's API family can carry (:func:`mismatch_tags`).
TAGGED: tuple[KnownBug, ...] = tuple(b for b in RECORDS if b.tag and (b.condition or b.tag_setup))

#: The bugs whose record renames a state-dict or DCP judge's mismatch (:func:`renaming`).
RENAMING: tuple[KnownBug, ...] = tuple(b for b in RECORDS if b.renames)


def get(bug_id: str) -> KnownBug:
    """The record of ``bug_id``; KeyError names the ids there are."""
    try:
        return BUGS[bug_id]
    except KeyError:
        raise KeyError(f"no known bug {bug_id!r}; known: {sorted(BUGS)}") from None


def meets(case: Case, bug: KnownBug) -> bool:
    """Whether ``case`` meets ``bug``'s condition (False for a bug without one here)."""
    return bug.id not in fixed() and any(b is bug and condition(case) for b, condition in CONDITIONS)


def _met_in_order(case: Case) -> list[KnownBug]:
    absent = fixed()
    return [bug for bug, condition in CONDITIONS if bug.id not in absent and condition(case)]


def known_bug(case: Case) -> str | None:
    """The id of the first known bug (in :data:`CONDITIONS` order) a state_dict or dcp case
    meets, whatever its symptom; None for other properties' cases."""
    if not isinstance(case.body, (StateDictBody, DcpBody)):
        return None
    return next((bug.id for bug in _met_in_order(case)), None)


def ends_ranks(case: Case) -> str | None:
    """The id of a known bug the case would run into in a way that ends its ranks (an exception
    or a hang), if the case tells; mismatches leave the ranks alive and are not named here."""
    return next((bug.id for bug in _met_in_order(case) if bug.ends_ranks), None)


def bugs_met(case: Case) -> list[KnownBug]:
    """Every known bug whose condition the case meets, through any of its compositions, in
    registry order."""
    met = {bug.id for bug in _met_in_order(case)}
    return [b for b in BUGS.values() if b.id in met]


def explains(case: Case, kind: str, check: str = "") -> list[KnownBug]:
    """The known bugs that account for a *mismatch* in ``case``: those whose condition the case
    meets and which show as wrong values. A bug shows through whatever the case checks (a loss,
    a parameter, an optimizer state after a load) and through any layout on the other side of
    a comparison, so a mismatch there is that bug, not a new one. Exceptions, crashes and hangs
    are matched by their own detail instead (:func:`fuzz.signature.same_bug`): an error in a
    case that merely meets a bug's condition may well be another bug. A ``training_only`` bug
    accounts for a state-dict or DCP case's mismatch only where ``check`` (the failed check,
    as its signature names it) compares trainings of two different compositions."""
    if kind != "mismatch":
        return []
    bugs = [b for b in bugs_met(case) if kind in b.symptoms]
    body = case.body
    if isinstance(body, (StateDictBody, DcpBody)) and not (check in RESUME_CHECKS and body.source != body.target):
        # a round trip, or a resume into the same composition: both sides meet it alike
        bugs = [b for b in bugs if not b.training_only]
    return bugs


# --------------------------------------------------------------------------- what judges name


def mismatch_tags(
    comp: Composition, tree: ModuleTree | None = None, training: Training | None = None, world_size: int = 2
) -> str:
    """The tags a training mismatch's API family carries (``:shard1:frozen-int-reshard``): the
    degenerate setups the case meets, since known bugs live there. A corpus entry that marks a
    tagged family known then matches only cases that meet its setup, and hides no other
    mismatch (:func:`fuzz.signature.same_bug`). A setup's tag (:attr:`KnownBug.tag_setup`) is
    written whatever is fixed; a bug whose fix the ranks run under is not there to tag."""
    absent = fixed()
    tags = ""
    for bug in TAGGED:
        if bug.tag_setup is not None:
            met = bug.tag_setup.met_by(comp, tree, training, world_size)
        else:
            condition = None if bug.id in absent else bug.condition
            met = condition is not None and condition.met_by(comp, tree, training, world_size)
        if met:
            tags += bug.tag
    return tags


def base_tags(base: Composition, tree: ModuleTree, training: Training, world_size: int, api: str) -> str:
    """The tags a metamorphic mismatch, charged to the variant's API family ``api``, also takes
    from the base composition: those of the bugs met through it whose record says so
    (:attr:`KnownBug.tags_through_base`) and which ``api`` does not carry yet."""
    return "".join(
        b.tag
        for b in TAGGED
        if b.tags_through_base
        and b.tag not in api
        and b.condition is not None
        and b.condition.met_by(base, tree, training, world_size)
    )


def state_tags(case: Case) -> str:
    """The tags a state-dict or DCP judge adds to the call it charges a mismatch to: those of the
    bugs that rename every check (:data:`ALL_CHECKS`) whose condition a side of the case meets,
    whatever is fixed (``:shard1``: the setup's name, as :func:`mismatch_tags` writes it)."""
    return "".join(b.tag for b in RENAMING if b.renames == ALL_CHECKS and b.condition and b.condition.met(case))


def renaming(case: Case, check: str, signature: str) -> KnownBug | None:
    """The known bug a state-dict or DCP judge names a mismatch of ``check`` (signature
    ``signature``) after (:attr:`KnownBug.renames`): the last, in registry order, of the bugs
    whose record renames that check and whose condition the case meets, or, for a bug that
    renames every check, whose tag the signature carries."""
    for bug in reversed(RENAMING):
        if bug.renames == ALL_CHECKS:
            if signature.endswith(bug.tag):
                return bug
        elif check in bug.renames and meets(case, bug):
            return bug
    return None


# --------------------------------------------------------------------------- docs

#: The lines around the table of :func:`upstream_table` in a doc (docs/known_bugs.md,
#: docs/state_dict.md); tests/test_known.py checks that the doc holds the table as generated.
UPSTREAM_TABLE_START = "<!-- upstream table: generated from fuzz/known_bugs.py by fuzz.known.upstream_table -->"
UPSTREAM_TABLE_END = "<!-- end of the generated upstream table -->"


def upstream_table(doc: str) -> str:
    """The Markdown table of the upstream state of every record whose ``docs`` is ``doc``
    (record, upstream reference or "none found", how it relates, what is known of its fix),
    between :data:`UPSTREAM_TABLE_START` and :data:`UPSTREAM_TABLE_END`: the registry's words,
    which a doc shows instead of restating them."""
    rows = [
        UPSTREAM_TABLE_START,
        "",
        "| record | upstream | relation | state |",
        "| --- | --- | --- | --- |",
    ]
    for bug in RECORDS:
        if bug.docs != doc:
            continue
        cells = (f"`{bug.id}`", bug.upstream, bug.relation, bug.state or "")
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join([*rows, "", UPSTREAM_TABLE_END])


# --------------------------------------------------------------------------- deadlocks in stacks


#: The signature detail of :data:`BROADCAST_EMPTY` (rank 0 broadcasts state other ranks skipped).
ALONE_IN_BROADCAST = "torch/distributed/_state_dict_utils.py:_broadcast_state_dict:rank0-alone"


def rank0_alone_in_broadcast(stacks: list[str]) -> bool:
    """Rank 0 is inside _broadcast_state_dict and some other rank is not: the ranks disagreed
    about whether to broadcast (:data:`BROADCAST_EMPTY`), a deadlock whatever it shows as."""
    inside = ["_broadcast_state_dict" in s for s in stacks]
    return bool(inside) and inside[0] and not all(inside)


#: :data:`BROADCAST_EMPTY` seen in the ranks' stack samples: rank 0 has waited alone in the
#: broadcast for 3 s, 10 s into the case. Collectives keep ranks within a second or so of each
#: other, so a healthy case does not hold that pattern; the known bug ends in about 14 s, not at
#: the deadline.
ALONE_IN_BROADCAST_STALL = Stall(
    name="rank 0 alone in _broadcast_state_dict", deadlocked=rank0_alone_in_broadcast, after=10.0, hold=3.0
)


#: What callers may ask by name: the registry's queries, the records, the predicates and the record type.
__all__ = [
    "ALL_CHECKS",
    "ALONE_IN_BROADCAST",
    "ALONE_IN_BROADCAST_STALL",
    "BROADCAST_EMPTY",
    "BUGS",
    "CACHED_STAGING_NEEDS_ACCELERATOR",
    "CACHED_STAGING_PINNED_METADATA",
    "CHECKPOINT_DEBUG",
    "COMPILED_UNFREEZE_PLAIN",
    "CONDITIONS",
    "DELAY_ALL_REDUCE_ROOT",
    "DELAY_BUFFER_FLOAT32",
    "DIVIDE_FACTOR_TWICE",
    "DTENSOR_CONV_PARTIAL",
    "DTENSOR_MSE_LOSS",
    "FIXED_ENV",
    "FIXES",
    "FLAT_FULL_OPTIM",
    "FOREACH_MIXED",
    "FROZEN_INT_RESHARD",
    "FROZEN_OPTIM_STATE_DROPPED",
    "FSDP1_ASYNC_DEFAULT_STAGER",
    "FSDP1_COMPILE_SHARDED_GRAD",
    "FSDP1_DCP_EMPTY_SHARD",
    "FSDP1_DCP_STATELESS",
    "FSDP1_FROZEN_UNIT",
    "FSDP1_FULL_OFFLOAD",
    "FSDP1_HSDP_OPTIMIZER_LOAD",
    "FSDP1_HSDP_RANK0_BROADCAST",
    "FSDP1_HSDP_SHARD1",
    "FSDP1_UNFROZEN_FROZEN_UNIT",
    "FUSED_CUSTOM_NAME",
    "FUSED_IGNORE_FROZEN",
    "FUSED_OPTIM_KEYS",
    "GROUP_FORCED_IN_RECOMPUTE",
    "INT_RESHARD_DIM1",
    "KNOWN_BUG_ODDS",
    "KNOWN_HANG_ODDS",
    "MP_FROZEN_AT_LAZY_INIT",
    "MP_NEVER_RUN_NO_SYNC",
    "MP_UNIFORM_GRAD_DTYPE",
    "NONE_FOUND",
    "OPTIMIZER_CHECKS",
    "PLAN_CACHE_FAILED_SAVE",
    "RECORDS",
    "RENAMING",
    "RESUME_CHECKS",
    "RESUME_LOSS",
    "RESUME_PARAMS",
    "SAC_OVER_FSDP_UNIT",
    "SAVE_CALL",
    "STAGER_REUSED_AFTER_CLOSE",
    "STATELESS_FULL",
    "TAGGED",
    "UNFROZEN_UNRESHARDED",
    "UNUSED_NO_ALL_REDUCE",
    "AnyOf",
    "Condition",
    "KnownBug",
    "OfBody",
    "OfCase",
    "OfComposition",
    "OfTraining",
    "OfTree",
    "OfTreeAndTraining",
    "Patch",
    "base_tags",
    "broadcast_empty",
    "broadcast_empty_app",
    "broadcast_empty_combined",
    "bugs_met",
    "cache_staged",
    "checkpoint_debug",
    "compiled_unfreeze_ignored",
    "compositions",
    "default_stager_copies_sharded",
    "delayed_all_reduce",
    "delayed_not_float32",
    "divide_factor_twice",
    "ends_ranks",
    "explains",
    "fix_of",
    "fix_written_for",
    "fixed",
    "flat_full_optimizer",
    "foreach_over_mixed",
    "foreach_over_mixed_case",
    "frozen_int_reshard_unit",
    "frozen_state_dropped",
    "fsdp1_async_default_stager",
    "fsdp1_compiled_with_sharded_grads",
    "fsdp1_dcp_empty_shard",
    "fsdp1_dcp_stateless",
    "fsdp1_frozen_source",
    "fsdp1_frozen_unit",
    "fsdp1_full_offload",
    "fsdp1_hsdp_2d",
    "fsdp1_shard1",
    "fsdp1_shard1_full_offload_load",
    "fsdp1_unfrozen_in_frozen_unit",
    "full_offload_gathers",
    "fused_custom_name",
    "fused_ignore_frozen",
    "fused_in_optimizer",
    "get",
    "group_recomputed_in_part",
    "hsdp_optimizer_load",
    "int_reshard_dim1",
    "known_bug",
    "meets",
    "mismatch_tags",
    "never_run_under_no_sync",
    "optimizer_holds_unresharded",
    "plan_cache_failed_save",
    "present",
    "rank0_alone_in_broadcast",
    "release",
    "renaming",
    "selective_over_unit",
    "shard1",
    "spmd_mse_loss",
    "spmd_tp_conv",
    "stager_reused",
    "state_tags",
    "stateless_full",
    "stateless_full_path",
    "stateless_optimizer",
    "unfrozen_in_frozen_mp_unit",
    "unfrozen_unresharded_unit",
    "unresharded_frozen",
    "unused_no_all_reduce",
]
