"""DCP's and the state-dict functions' options beyond the defaults: FileSystemWriter's I/O
options, explicit DefaultSavePlanner / DefaultLoadPlanner (dedup_save_to_lowest_rank,
enable_plan_caching, flatten_sharded_tensors, allow_partial_load), a key the checkpoint lacks
(``absent``), format_utils' dcp_to_torch_save / torch_save_to_dcp (``convert``), a process
group of the ranks' own (``own_group``), and
StateDictOptions' ignore_frozen_params and flatten_optimizer_state_dict.

Hand-built cases on the pool show each option runs and is judged; each oracle is shown able to
fail, by a deliberately wrong observation handed to the judge (or a planted fault in torch,
where the mutant harness is beside the checkout), and the draw rates are checked.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings

from fuzz import known
from fuzz.errors import CaseError
from fuzz.explore import run_case
from fuzz.model import (
    Api,
    Block,
    Case,
    Composition,
    DcpBody,
    DcpItem,
    Dtype,
    Leaf,
    LeafKind,
    LoadPlannerOptions,
    ModuleTree,
    Optimizer,
    Options,
    SavePlannerOptions,
    StateDictBody,
    Training,
    Wrapper,
    WriterOptions,
    case_from_json,
    case_to_json,
)
from fuzz.pool import RankPool
from fuzz.properties import get_property
from fuzz.properties.dcp_checks import MISSING_KEY
from fuzz.properties.state_dict import features_dcp, features_state_dict, judge_dcp, judge_state_dict
from fuzz.verdict import Outcome
from strategies import dcp_cases, state_dict_cases
from tests.conftest import fault_env, fault_pool
from tests.test_state_dict import TREE, fsdp, reversed_orders

ADAM = Training(optimizer=Optimizer.ADAM, lr=0.05, dtype=Dtype.FLOAT64, steps=2, param_groups=2)
ENTRIES = (DcpItem.MODEL, DcpItem.OPTIMIZER, DcpItem.SCALARS, DcpItem.COUNTER, DcpItem.EXTRA)
FROZEN_TREE = ModuleTree(
    width=3,
    root=Block(children=(Leaf(LeafKind.LINEAR, frozen=True), Leaf(LeafKind.TANH), Leaf(LeafKind.LAYER_NORM))),
)
#: HSDP on 2 ranks: (replicate 2, shard 1), every DTensor replicated on both ranks.
HSDP = fsdp("1", mesh=(2, 1))


def _dcp(**kw: Any) -> DcpBody:
    base: dict[str, Any] = {
        "tree": TREE,
        "source": fsdp("1"),
        "target": fsdp("0", "2"),
        "entries": ENTRIES,
        "training": ADAM,
        "storage_objects": True,
    }
    return DcpBody(**{**base, **kw})


def _run(pool: RankPool, case: Case) -> Outcome:
    outcome = pool.run(case)
    assert outcome.ok, outcome.describe()
    return outcome


def _tampered(outcome: Outcome, change: Any) -> Outcome:
    """``outcome`` with ``change(observations)`` applied to a deep copy of its observations."""
    ranks = [dataclasses.replace(r, observation=copy.deepcopy(r.observation)) for r in outcome.ranks]
    tampered = dataclasses.replace(outcome, ranks=ranks)
    change(tampered.observations)
    return tampered


# --------------------------------------------------------------------------------- rules, codec


def test_defaults_are_todays_behaviour() -> None:
    """A body without the new fields (every corpus entry) decodes to the defaults, which pass
    nothing new to torch."""
    body = _dcp()
    assert body.writer == WriterOptions() and body.writer.changed() == {}
    assert body.save_planner is None and body.load_planner is None and not body.absent and not body.convert
    assert not body.own_group
    data = case_to_json(Case("dcp", 2, 1, body))
    for name in ("writer", "save_planner", "load_planner", "absent", "convert", "own_group"):
        del data["body"][name]
    assert case_from_json(data).body == body
    corpus = Path(__file__).resolve().parent.parent / "corpus"
    for path in sorted(corpus.glob("*.json")):
        entry = json.loads(path.read_text())
        case = case_from_json(entry["case"])
        stored = entry["case"]["body"]
        # Entries saved before the options existed (without their fields) get the defaults.
        if isinstance(case.body, DcpBody) and "writer" not in stored:
            assert case.body.writer.changed() == {} and case.body.save_planner is None, path
        if isinstance(case.body, StateDictBody) and "flatten_optimizer_state_dict" not in stored["save"]:
            assert not case.body.save.ignore_frozen_params and not case.body.save.flatten_optimizer_state_dict, path


def test_new_options_refuse_what_they_do_not_support() -> None:
    with pytest.raises(CaseError, match="writer"):
        _dcp(storage_objects=False, writer=WriterOptions(thread_count=2))  # FileSystemWriter's
    with pytest.raises(CaseError, match="thread_count"):
        WriterOptions(thread_count=0)
    with pytest.raises(CaseError, match="dedup_save_to_lowest_rank"):
        DcpBody(
            tree=TREE,
            source=Composition(),
            target=Composition(),
            entries=(DcpItem.MODEL,),
            no_dist=True,
            save_planner=SavePlannerOptions(dedup_save_to_lowest_rank=True),
        )
    with pytest.raises(CaseError, match="own_group"):
        DcpBody(
            tree=TREE,
            source=Composition(),
            target=Composition(),
            entries=(DcpItem.MODEL,),
            no_dist=True,
            own_group=True,
        )
    with pytest.raises(CaseError, match="convert"):
        _dcp(source=Composition(wrapper=Wrapper.FSDP1_FULL_SHARD), convert=True)  # no FSDP1 side
    with pytest.raises(CaseError, match="absent"):
        DcpBody(
            tree=TREE, source=Composition(), target=Composition(), entries=(DcpItem.MODEL,), no_dist=True, absent=True
        )
    sd: dict[str, Any] = {"tree": FROZEN_TREE, "source": fsdp(), "target": fsdp()}
    with pytest.raises(CaseError, match="strict"):
        StateDictBody(**sd, save=Options(ignore_frozen_params=True))  # frozen keys missing: non-strict
    with pytest.raises(CaseError, match="ignore_frozen_params"):
        StateDictBody(**sd, load=Options(ignore_frozen_params=True, strict=False))  # get only
    with pytest.raises(CaseError, match="flatten_optimizer_state_dict"):
        StateDictBody(**sd, save=Options(flatten_optimizer_state_dict=True))  # load must say so too
    with pytest.raises(CaseError, match="empty_group"):
        flat = Options(flatten_optimizer_state_dict=True)
        StateDictBody(**sd, save=flat, load=flat, empty_group=True)
    body = _dcp(
        writer=WriterOptions(single_file_per_rank=False, thread_count=3),
        save_planner=SavePlannerOptions(dedup_save_to_lowest_rank=True),
        load_planner=LoadPlannerOptions(allow_partial_load=True),
        absent=True,
        convert=True,
    )
    case = Case("dcp", 2, 0, body)
    assert case_from_json(json.loads(json.dumps(case_to_json(case)))) == case


# --------------------------------------------------------------------------------- on the pool


def test_writer_io_options_round_trip_exactly(rank_pool: RankPool, check_case: Any) -> None:
    """A file per item, no fsync, three I/O threads copying one byte ahead: the same state
    comes back (the dcp judge's exact comparisons and resuming)."""
    writer = WriterOptions(single_file_per_rank=False, sync_files=False, thread_count=3, per_thread_copy_ahead=1)
    body = _dcp(writer=writer, orders=reversed_orders(len(ENTRIES), rank_pool.world_size))
    case = Case("dcp", rank_pool.world_size, 51, body)
    assert {"writer:single_file_per_rank", "writer:thread_count"} <= set(features_dcp(case))
    check_case(case)


@pytest.mark.parametrize("source", [Composition(), HSDP], ids=["plain", "hsdp"])
def test_dedup_to_lowest_rank_writes_replicated_items_on_rank_0(
    rank_pool: RankPool, check_case: Any, source: Composition
) -> None:
    """dedup_save_to_lowest_rank with every tensor replicated (a plain model; HSDP with a
    replicate dimension over both ranks): every item is written once, by rank 0."""
    if rank_pool.world_size != 2:
        pytest.skip("the HSDP mesh is for 2 ranks")
    planner = SavePlannerOptions(
        dedup_save_to_lowest_rank=True, enable_plan_caching=True, flatten_sharded_tensors=False
    )
    body = _dcp(source=source, target=fsdp("1"), save_planner=planner)
    case = Case("dcp", rank_pool.world_size, 52, body)
    check_case(case)
    outcome = _run(rank_pool, case)
    written = outcome.observations[0]["dedup"]["written"]
    assert written and all(path.startswith("__0_") for _, _, path in written), written
    assert judge_dcp(case, outcome) is None
    # Oracle: an item rank 0 planned but rank 1 wrote is a mismatch.
    bad = _tampered(outcome, lambda obs: obs[0]["dedup"]["written"][0].__setitem__(2, "__1_0.distcp"))
    failure = judge_dcp(case, bad)
    assert failure is not None and failure.signature == "mismatch:dcp:dedup@save", failure
    # ... and so is a planned item that was not written.
    bad = _tampered(outcome, lambda obs: obs[0]["dedup"]["written"].pop())
    failure = judge_dcp(case, bad)
    assert failure is not None and "not written" in failure.summary, failure


@pytest.mark.parametrize("async_save", [False, True], ids=["save", "async_save"])
def test_saves_and_loads_over_a_group_of_their_own(rank_pool: RankPool, check_case: Any, async_save: bool) -> None:
    """process_group=: save (or async_save) and load over a gloo group of the ranks' own, the
    counter Stateful all-reducing on the default group meanwhile: the round trip is exact."""
    body = _dcp(own_group=True, async_save=async_save, orders=reversed_orders(len(ENTRIES), rank_pool.world_size))
    case = Case("dcp", rank_pool.world_size, 59, body)
    assert "process_group:own" in features_dcp(case)
    check_case(case)


def test_plan_caching_over_async_saves_in_flight(rank_pool: RankPool, check_case: Any) -> None:
    """Three async saves of one structure with enable_plan_caching (the later ones reuse the
    cached plans), the source training while they are in flight, explicit load planner."""
    body = _dcp(
        target=fsdp("1"),
        training=dataclasses.replace(ADAM, steps=3),
        steps_after=2,
        async_save=True,
        async_saves=3,
        save_planner=SavePlannerOptions(enable_plan_caching=True),
        load_planner=LoadPlannerOptions(flatten_sharded_tensors=False),
    )
    check_case(Case("dcp", rank_pool.world_size, 53, body))


@pytest.mark.parametrize("allow", [True, False], ids=["allow_partial_load", "refused"])
def test_a_key_the_checkpoint_lacks(rank_pool: RankPool, check_case: Any, allow: bool) -> None:
    """allow_partial_load=True: the load succeeds and leaves the absent key's tensor alone.
    Without it: DCP's refusal, naming the key, on every rank (then the load without it)."""
    body = _dcp(absent=True, load_planner=LoadPlannerOptions(allow_partial_load=True) if allow else None)
    case = Case("dcp", rank_pool.world_size, 54, body)
    assert ("absent:allowed" if allow else "absent:refused") in features_dcp(case)
    check_case(case)
    outcome = _run(rank_pool, case)
    for obs in outcome.observations:
        refusal = obs["absent"]["refusal"]
        if allow:
            assert refusal is None and obs["absent"]["after"] == obs["absent"]["before"]
        else:
            assert refusal["type"] == "torch.distributed.checkpoint.api.CheckpointException", refusal
            assert MISSING_KEY in refusal["message"], refusal
    # Oracles: the other outcome of each is a mismatch.
    if allow:
        bad = _tampered(outcome, lambda obs: obs[1]["absent"]["after"].__setitem__(0, -1.0))
        flipped = _tampered(outcome, lambda obs: obs[0]["absent"].__setitem__("refusal", {"type": "x", "message": ""}))
    else:
        bad = _tampered(outcome, lambda obs: obs[1]["absent"].__setitem__("refusal", None))
        flipped = _tampered(
            outcome, lambda obs: obs[0]["absent"]["refusal"].__setitem__("message", "Missing key: something else")
        )
    for tampered in (bad, flipped):
        failure = judge_dcp(case, tampered)
        assert failure is not None and failure.signature == "mismatch:dcp:allow_partial_load@save", failure


@pytest.mark.parametrize("entries", [ENTRIES, (DcpItem.APP, DcpItem.SCALARS, DcpItem.EXTRA)], ids=["dicts", "app"])
def test_dcp_to_torch_save_and_back(rank_pool: RankPool, check_case: Any, entries: tuple[DcpItem, ...]) -> None:
    """dcp_to_torch_save: the file holds the full state (model, optimizer state and groups,
    scalars, extra); torch_save_to_dcp: its checkpoint loads into a sharded target exactly."""
    body = _dcp(entries=entries, save_full_state_dict=False, convert=True)
    case = Case("dcp", rank_pool.world_size, 55, body)
    assert "format_utils:convert" in features_dcp(case)
    check_case(case)
    outcome = _run(rank_pool, case)
    converted = outcome.observations[0]["convert"]
    assert converted["model"] and converted["optimizer"] and converted["groups"], converted.keys()

    def nudge(obs: list[dict[str, Any]]) -> None:
        model = obs[0]["convert"]["model"]
        name = sorted(model)[0]
        model[name][0] += 1.0

    failure = judge_dcp(case, _tampered(outcome, nudge))
    assert failure is not None and failure.signature == "mismatch:dcp:dcp_to_torch_save@save", failure


def test_ignore_frozen_params_and_a_flat_optimizer_state_dict(rank_pool: RankPool, check_case: Any) -> None:
    """get_model_state_dict(ignore_frozen_params=True) leaves out exactly the frozen linear,
    which keeps its fresh value after the non-strict load; the flattened optimizer state dict
    is the nested one flattened as documented, and set_optimizer_state_dict takes it back."""
    opts = {"ignore_frozen_params": True, "flatten_optimizer_state_dict": True}
    body = StateDictBody(
        tree=FROZEN_TREE,
        source=fsdp("0"),
        target=fsdp("0"),
        training=ADAM,
        api=Api.SPLIT,
        save=Options(**opts),
        load=Options(strict=False, flatten_optimizer_state_dict=True),
    )
    case = Case("state_dict", rank_pool.world_size, 56, body)
    assert {"save:ignore_frozen_params", "flatten_optimizer_state_dict"} <= set(features_state_dict(case))
    check_case(case)
    outcome = _run(rank_pool, case)
    first = outcome.observations[0]
    assert first["model_keys"]["keys"] == ["2.bias", "2.weight"]  # the frozen linear's weight and bias left out
    assert first["dropped"] == ["0.bias", "0.weight"]
    assert any(k.startswith("state.") for k in first["flat_optimizer"]["flat"])
    # Oracles: a frozen key in the state dict, a flat value that is not the nested one.
    bad = _tampered(outcome, lambda obs: obs[0]["model_keys"]["keys"].append("0.weight"))
    failure = judge_state_dict(case, bad)
    assert failure is not None and failure.signature == "mismatch:state_dict:ignore_frozen_params@split", failure

    def wrong_lr(obs: list[dict[str, Any]]) -> None:
        flat = obs[0]["flat_optimizer"]["flat"]
        key = next(k for k in flat if k.startswith("param_groups.") and k.endswith(".lr"))
        flat[key] = flat[key] * 2

    failure = judge_state_dict(case, _tampered(outcome, wrong_lr))
    assert failure is not None and failure.signature == "mismatch:state_dict:flatten_optimizer_state_dict@split"


# --------------------------------------------------------------------------------- planted fault


def test_dedup_check_notices_a_planner_that_keeps_the_highest_rank() -> None:
    """A fault in torch's dedup (tests/faults/K08): replicated items go to the highest rank that
    holds them."""
    env = fault_env("K08_dedup_to_highest_rank")
    body = _dcp(source=Composition(), target=fsdp("1"), save_planner=SavePlannerOptions(dedup_save_to_lowest_rank=True))
    with fault_pool(env, world_size=2, deadline=30) as pool:
        failure = run_case(pool, get_property("dcp"), Case("dcp", 2, 58, body))
    assert failure is not None and failure.signature == "mismatch:dcp:dedup@save", failure


# --------------------------------------------------------------------------------- draw rates


def _counts(strategy: Any, features: Any, n: int = 400) -> tuple[Counter[str], int]:
    counts: Counter[str] = Counter()
    seen = 0

    @settings(
        max_examples=n,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy(world_size=2))
    def collect(case: Case) -> None:
        nonlocal seen
        seen += 1
        counts.update(features(case))

    collect()
    return counts, seen


def test_new_dcp_options_are_drawn() -> None:
    counts, n = _counts(dcp_cases, features_dcp)
    wanted = [
        "writer:single_file_per_rank",
        "writer:sync_files",
        "writer:thread_count",
        "writer:per_thread_copy_ahead",
        "save_planner:dedup_save_to_lowest_rank",
        "save_planner:enable_plan_caching",
        "save_planner:flatten_sharded_tensors:false",
        "load_planner:allow_partial_load",
        "load_planner:flatten_sharded_tensors:false",
        "absent:allowed",
        "absent:refused",
        "format_utils:convert",
        "process_group:own",
    ]
    if known.present(known.PLAN_CACHE_FAILED_SAVE, torch.__version__):
        wanted.remove("save_planner:enable_plan_caching")  # kept rare where its known bug is present
    missing = [f for f in wanted if counts[f] == 0]
    if missing:
        # Hypothesis mixes the literal constants of the modules loaded so far into what it
        # draws, so the first 400 derandomized cases differ between this file alone and a whole
        # run (measured: absent:refused 0 of 400 alone, 12 after every test module was
        # imported): a rare option missing from them is looked for in more cases.
        more, n_more = _counts(dcp_cases, features_dcp, n=2000)
        missing = [f for f in missing if more[f] == 0]
        assert not missing, (missing, n_more)
    assert counts["save_planner"] > 0.1 * n and counts["load_planner"] > 0.1 * n, dict(counts)


def test_new_state_dict_options_are_drawn() -> None:
    counts, n = _counts(state_dict_cases, features_state_dict)
    assert counts["flatten_optimizer_state_dict"] > 0.03 * n, dict(counts)
    assert counts["save:ignore_frozen_params"] > 0, dict(counts)
