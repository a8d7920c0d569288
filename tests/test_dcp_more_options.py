"""More of DCP's surface: an explicit ``DefaultStager(StagingOptions(...))`` as async_save's
``async_stager``, the process-based async checkpointer, saves without collectives
(``use_collectives=False``, loaded back through each rank's own metadata), and
format_utils' ``BroadcastingTorchSaveReader`` with ``DynamicMetaLoadPlanner`` (a torch.save
file of rank 0 loaded into every rank).

Hand-built cases on the pool show each path runs and passes the dcp judge (the exact round
trip); the rules refuse what the documented API does not support; old corpus JSON decodes to
the defaults; the draws reach every new option.
"""

from __future__ import annotations

import copy
import dataclasses
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from fuzz.errors import CaseError
from fuzz.model import Case, Composition, DcpBody, DcpItem, Overwrite, Wrapper, case_from_json, case_to_json
from fuzz.model.state_dict import StagerOptions
from fuzz.pool import RankPool
from fuzz.properties.state_dict import features_dcp, judge_dcp
from tests.test_dcp_options import ENTRIES, _dcp
from tests.test_state_dict import fsdp, reversed_orders

# --------------------------------------------------------------------------------- rules, codec


def test_defaults_are_todays_behaviour() -> None:
    """A body without the new fields (every corpus entry) decodes to the defaults, which pass
    nothing new to torch; the new fields survive the codec."""
    body = _dcp()
    data = case_to_json(Case("dcp", 2, 1, body))
    for name in ("stager", "process_checkpointer", "use_collectives", "torch_save_reader"):
        del data["body"][name]
    old = case_from_json(data).body
    assert old == body and old.stager is None and old.use_collectives and not old.process_checkpointer
    assert not old.torch_save_reader
    assert not {f for f in features_dcp(Case("dcp", 2, 1, body)) if f.startswith(("async_stager", "use_coll"))}
    new = _dcp(
        async_save=True,
        stager=StagerOptions(use_shared_memory=True, use_async_staging=True),
        process_checkpointer=True,
        use_collectives=False,
        target=fsdp("1"),
    )
    case = Case("dcp", 2, 3, new)
    assert case_from_json(copy.deepcopy(case_to_json(case))) == case


def test_rules_refuse_what_the_api_does_not_support() -> None:
    with pytest.raises(CaseError, match="stager"):
        _dcp(stager=StagerOptions())  # an async_save option
    with pytest.raises(CaseError, match="process_checkpointer"):
        _dcp(process_checkpointer=True)
    # Without collectives each rank reads only what it saved: a sharded save goes into the
    # same layout only, a full one offloaded to rank 0 not at all.
    with pytest.raises(CaseError, match="same layout"):
        _dcp(use_collectives=False)
    with pytest.raises(CaseError, match="rank 0 only"):
        _dcp(use_collectives=False, save_full_state_dict=True, save_cpu_offload=True)
    with pytest.raises(CaseError, match="overwrite"):
        _dcp(use_collectives=False, target=fsdp("1"), overwrite=Overwrite.TRUE)
    _dcp(use_collectives=False, target=fsdp("1"))
    _dcp(use_collectives=False, source=Composition(), target=fsdp("0", "2"))  # plain tensors: any target
    # BroadcastingTorchSaveReader: tensors only, the full state dict, plain tensors loaded
    tensors: dict[str, Any] = {
        "entries": (DcpItem.MODEL, DcpItem.EXTRA),
        "save_full_state_dict": True,
        "storage_objects": False,
        "torch_save_reader": True,
    }
    with pytest.raises(CaseError, match="entries"):
        _dcp(**{**tensors, "entries": ENTRIES})
    with pytest.raises(CaseError, match="plain tensors"):
        _dcp(**tensors)  # sharded into DTensors: the torch bug of the reader
    with pytest.raises(CaseError, match="plain tensors"):
        _dcp(**tensors, load_full_state_dict=True, load_cpu_offload=True)
    with pytest.raises(CaseError, match="async_save"):
        _dcp(**tensors, load_full_state_dict=True, async_save=True)
    with pytest.raises(CaseError, match="torch_save_reader"):
        _dcp(**tensors, target=Composition(wrapper=Wrapper.FSDP1_NO_SHARD))
    _dcp(**tensors, load_full_state_dict=True)
    _dcp(**tensors, target=Composition(wrapper=Wrapper.DDP))


# --------------------------------------------------------------------------------- on the pool


def _passes(pool: RankPool, case: Case) -> Any:
    outcome = pool.run(case)
    assert outcome.ok, outcome.describe()
    failure = judge_dcp(case, outcome)
    assert failure is None, failure
    return outcome


@pytest.mark.parametrize("in_flight", [False, True], ids=["one_save", "in_flight"])
def test_an_explicit_stager_round_trips_exactly(rank_pool: RankPool, check_case: Any, in_flight: bool) -> None:
    """DefaultStager(StagingOptions(use_shared_memory, use_async_staging)) staging one save, or
    two saves in flight while the source trains on (it waits for staging_completion first)."""
    stager = StagerOptions(use_shared_memory=True, use_async_staging=True)
    body = _dcp(
        async_save=True,
        stager=stager,
        async_saves=2 if in_flight else 0,
        orders=reversed_orders(len(ENTRIES), rank_pool.world_size),
    )
    case = Case("dcp", rank_pool.world_size, 61, body)
    assert {"async_stager", "async_stager:shared_memory", "async_stager:async_staging"} <= set(features_dcp(case))
    check_case(case)


@pytest.mark.parametrize("async_save", [False, True], ids=["save", "async_save"])
def test_saves_without_collectives_load_back_exactly(rank_pool: RankPool, async_save: bool) -> None:
    """use_collectives=False: each rank writes its own metadata (no global .metadata), and
    dcp.load reads it back on every rank, into the same layout."""
    body = _dcp(
        source=fsdp("1"),
        target=fsdp("1"),
        use_collectives=False,
        async_save=async_save,
        orders=reversed_orders(len(ENTRIES), rank_pool.world_size),
    )
    case = Case("dcp", rank_pool.world_size, 62, body)
    assert f"use_collectives:false:{'async_save' if async_save else 'save'}" in features_dcp(case)
    _passes(rank_pool, case)


def test_a_torch_save_file_loads_through_the_broadcasting_reader(rank_pool: RankPool) -> None:
    """Rank 0 torch.save's the full model state dict and the extra tensor; every rank loads it
    with BroadcastingTorchSaveReader and DynamicMetaLoadPlanner into a full state dict of a
    fully_shard'ed target (and the judge sees a wrong model)."""
    body = _dcp(
        entries=(DcpItem.EXTRA, DcpItem.MODEL),
        save_full_state_dict=True,
        load_full_state_dict=True,
        storage_objects=False,
        torch_save_reader=True,
        orders=reversed_orders(2, rank_pool.world_size),
    )
    case = Case("dcp", rank_pool.world_size, 63, body)
    assert "format_utils:broadcasting_torch_save_reader" in features_dcp(case)
    outcome = _passes(rank_pool, case)

    def nudge(obs: list[dict[str, Any]]) -> None:
        model = obs[0]["loaded"]["model"]
        model[sorted(model)[0]][0] += 1.0

    ranks = [dataclasses.replace(r, observation=copy.deepcopy(r.observation)) for r in outcome.ranks]
    tampered = dataclasses.replace(outcome, ranks=ranks)
    nudge(tampered.observations)
    failure = judge_dcp(case, tampered)
    assert failure is not None and failure.signature == "mismatch:dcp:model@save", failure


def test_the_process_checkpointer_round_trips_and_ends_its_processes(rank_pool: RankPool) -> None:
    """async_checkpointer_type=PROCESS: every rank's save runs in a checkpointing process of
    its own, which is ended after the case (no process left in the pool's ranks)."""
    body = _dcp(target=fsdp("1"), async_save=True, process_checkpointer=True, steps_after=1)
    case = Case("dcp", rank_pool.world_size, 64, body)
    assert "async_checkpointer:process" in features_dcp(case)
    outcome = _passes(rank_pool, case)
    for obs in outcome.observations:
        assert obs["checkpoint_process"]["started"] and not obs["checkpoint_process"]["alive_after"]
    ranks = [dataclasses.replace(r, observation=copy.deepcopy(r.observation)) for r in outcome.ranks]
    tampered = dataclasses.replace(outcome, ranks=ranks)
    tampered.observations[1]["checkpoint_process"]["alive_after"] = True
    failure = judge_dcp(case, tampered)
    assert failure is not None and failure.signature == "mismatch:dcp:checkpoint_process@async_save", failure


# --------------------------------------------------------------------------------- draw rates


def _draw_counts(make: Any, n: int) -> Counter[str]:
    """Features of up to ``n`` bodies ``make(draw)`` (derandomized, generation only), and
    ``cases``: how many were drawn."""
    counts: Counter[str] = Counter()

    @settings(
        max_examples=n,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def collect(data: st.DataObject) -> None:
        body = make(data.draw)
        assert isinstance(body, DcpBody)
        counts["cases"] += 1
        counts.update(features_dcp(Case("dcp", 2, 0, body)))

    collect()
    return counts


def test_the_new_options_are_drawn() -> None:
    """The draws of the new options over fixed bodies that can take them (drawing whole dcp
    cases until the rare ones show would take minutes): an explicit stager one async save in
    four, the process checkpointer one in 50 (never both pinned memory and non-blocking copies
    without an accelerator), use_collectives=False one in three, and the torch.save variant."""
    from strategies._state_dict import _async_options, _rank_local, _torch_save_variant

    async_body = _dcp(async_save=True, target=fsdp("1"), source=fsdp("1"))
    counts = _draw_counts(lambda draw: _rank_local(draw, _async_options(draw, async_body, False)), 150)
    n = counts["cases"]
    assert 0.1 * n < counts["async_stager"] < 0.45 * n, dict(counts)
    assert counts["async_stager:shared_memory"] and counts["async_stager:async_staging"], dict(counts)
    assert counts["async_stager:pinned_memory"] == counts["async_stager:non_blocking_copy"] == 0
    # seconds a case: rare (that dcp cases reach it is checked by test_api_surface's search)
    assert counts["async_checkpointer:process"] < 0.06 * n, dict(counts)
    assert 0.15 * n < counts["use_collectives:false:async_save"] < 0.55 * n, dict(counts)
    with_gpu = _draw_counts(lambda draw: _async_options(draw, async_body, True), 100)
    assert with_gpu["async_stager:pinned_memory"] and with_gpu["async_stager:non_blocking_copy"], dict(with_gpu)
    sharded = _dcp(target=Composition(wrapper=Wrapper.DDP), load_full_state_dict=False)
    variants = _draw_counts(lambda draw: _torch_save_variant(draw, sharded, 2), 50)
    # every draw is a valid variant (a small space: Hypothesis stops once it has seen it all)
    assert variants["format_utils:broadcasting_torch_save_reader"] == variants["cases"] > 0, dict(variants)
