"""FSDP1 models under get/set_*_state_dict (``state_dict`` property, api ``split`` and
``combined``): generated cases on the pool, hand-built scenarios between FSDP1 and fully_shard,
replicate, DDP and plain models, the rules, the draw rates, and repro's refusal.

torch's distributed state-dict functions take an FSDP1 model under FSDP.state_dict_type (as
torch's own e2e test_e2e_save_and_load does), so with full state dicts state moves between
FSDP1 and any other layout, and sharded state dicts between like tensor kinds on one mesh.
An FSDP1 target is judged as under FSDP1's own API (summon_full_params, resuming, the local
optimizer state between one layout); a target of another API holds the optimizer state in
full, which must equal what get_optimizer_state_dict took from the FSDP1 source.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

from fuzz import known
from fuzz.corpus import Entry as CorpusEntry
from fuzz.errors import CaseError
from fuzz.explore import run_case
from fuzz.known import known_bug
from fuzz.model import (
    Api,
    Case,
    Composition,
    DcpBody,
    DcpItem,
    Optimizer,
    Options,
    StateDictBody,
    Training,
    Wrapper,
    case_from_json,
    case_to_json,
    is_fsdp1,
    sharded_in_memory_problem,
)
from fuzz.pool import RankPool
from fuzz.properties import get_property
from fuzz.properties.state_dict import features_state_dict
from fuzz.properties.state_dict_checks import holding_elements
from fuzz.repro import render_entry
from strategies import state_dict_cases
from tests.conftest import ROOT, fault_pool
from tests.test_state_dict import ADAM, SGD, TREE, fsdp
from tests.test_state_dict_fsdp1 import aliased_optimizer_state_env

FSDP1_FULL_OFFLOAD = known.FSDP1_FULL_OFFLOAD.id


FILTERED = settings(suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
FULL = Options(full_state_dict=True)


def fsdp1(wrapper: Wrapper, *, mesh: tuple[int, ...] = (), auto_wrap: bool = False, **kw: Any) -> Composition:
    return Composition(wrapper=wrapper, mesh=mesh, auto_wrap=auto_wrap, **kw)


def hsdp_mesh(world_size: int) -> tuple[int, int]:
    """Every rank in the shard dimension at 2 ranks, (2, 2) at 4."""
    return (2, 2) if world_size == 4 else (1, world_size)


def _dsd_fsdp1(case: Case) -> bool:
    body = case.body
    return (
        isinstance(body, StateDictBody)
        and body.api in (Api.SPLIT, Api.COMBINED)
        and (is_fsdp1(body.source) or is_fsdp1(body.target))
    )


# --------------------------------------------------------------------------------- generated


@FILTERED
@given(data=st.data())
def test_generated_fsdp1_cases_of_the_state_dict_functions(rank_pool: RankPool, check_case: Any, data: Any) -> None:
    case = data.draw(state_dict_cases(world_size=rank_pool.world_size), label="case")
    assume(_dsd_fsdp1(case))
    assume(known_bug(case) is None)
    check_case(case)


# --------------------------------------------------------------------------------- by hand


def _scenarios(ws: int) -> dict[str, StateDictBody]:
    full_shard = fsdp1(Wrapper.FSDP1_FULL_SHARD, auto_wrap=True)
    hybrid = fsdp1(Wrapper.FSDP1_HYBRID_SHARD, mesh=hsdp_mesh(ws))
    return {
        # full: FSDP1 into fully_shard, the optimizer state compared in full
        "full-fsdp1-to-fully_shard": StateDictBody(
            tree=TREE, source=full_shard, target=fsdp("1"), training=ADAM, save=FULL, load=FULL, empty_group=True
        ),
        # full: a plain model into FSDP1, from rank 0 only
        "full-plain-to-fsdp1-broadcast": StateDictBody(
            tree=TREE,
            source=Composition(),
            target=fsdp1(Wrapper.FSDP1_SHARD_GRAD_OP),
            training=SGD,
            steps_after=2,
            save=FULL,
            load=Options(full_state_dict=True, broadcast_from_rank0=True),
        ),
        # full, combined: DDP into FSDP1 HYBRID_SHARD, non-strict with keys left out
        "combined-ddp-to-hybrid-non-strict": StateDictBody(
            tree=TREE,
            source=Composition(wrapper=Wrapper.DDP),
            target=hybrid,
            training=ADAM,
            api=Api.COMBINED,
            save=FULL,
            load=Options(full_state_dict=True, strict=False),
            drop=(0, 3),
        ),
        # full: a stateless optimizer (SGD without momentum) into FSDP1, which loads it through
        # FSDP.optim_state_dict_to_load (not the known "Expected device to be set" path)
        "full-stateless-sgd-into-fsdp1": StateDictBody(
            tree=TREE,
            source=fsdp("1"),
            target=fsdp1(Wrapper.FSDP1_FULL_SHARD),
            training=Training(optimizer=Optimizer.SGD, lr=0.1, steps=2),
            save=FULL,
            load=FULL,
        ),
        # sharded: NO_SHARD's plain tensors into DDP
        "sharded-no_shard-to-ddp": StateDictBody(
            tree=TREE, source=fsdp1(Wrapper.FSDP1_NO_SHARD), target=Composition(wrapper=Wrapper.DDP), training=ADAM
        ),
        # sharded: HYBRID_SHARD's DTensors into fully_shard on the same mesh, and back
        "sharded-hybrid-to-fully_shard": StateDictBody(
            tree=TREE, source=hybrid, target=fsdp("1", mesh=hybrid.mesh), training=ADAM, api=Api.COMBINED
        ),
        "sharded-fully_shard-to-hybrid": StateDictBody(
            tree=TREE, source=fsdp(mesh=hybrid.mesh), target=hybrid, training=ADAM
        ),
        # sharded: ShardedTensors between FULL_SHARD and SHARD_GRAD_OP
        "sharded-fsdp1-to-fsdp1": StateDictBody(
            tree=TREE, source=full_shard, target=fsdp1(Wrapper.FSDP1_SHARD_GRAD_OP), training=ADAM
        ),
    }


@pytest.mark.parametrize("name", sorted(_scenarios(2)))
def test_fsdp1_scenarios_of_the_state_dict_functions(check_case: Any, rank_pool: RankPool, name: str) -> None:
    body = _scenarios(rank_pool.world_size)[name]
    check_case(Case("state_dict", rank_pool.world_size, 41, body))


def test_an_fsdp1_source_is_compared_in_full_with_a_target_of_another_api(rank_pool: RankPool) -> None:
    """The target's optimizer state, gathered without the API, against what
    get_optimizer_state_dict took from the FSDP1 source (rank 0); every rank reports its
    local FSDP1 shards of the source."""
    body = _scenarios(rank_pool.world_size)["full-fsdp1-to-fully_shard"]
    outcome = rank_pool.run(Case("state_dict", rank_pool.world_size, 41, body))
    assert outcome.ok, outcome.describe()
    first = outcome.observations[0]
    assert first["saved"]["optimizer"], first["saved"]
    assert first["loaded"]["optimizer"] == first["saved"]["optimizer"]
    assert "0.weight" in first["saved"]["optimizer"] and "exp_avg" in first["saved"]["optimizer"]["0.weight"]
    assert all("optimizer_local" in obs["saved"] for obs in outcome.observations)


# --------------------------------------------------------------------------------- rules


def test_rules_of_fsdp1_under_the_state_dict_functions() -> None:
    full_shard, no_shard = fsdp1(Wrapper.FSDP1_FULL_SHARD), fsdp1(Wrapper.FSDP1_NO_SHARD)
    hybrid = fsdp1(Wrapper.FSDP1_HYBRID_SHARD, mesh=(1, 2))
    # valid: full state dicts between FSDP1 and the other APIs, both ways, split and combined
    for source, target in ((full_shard, fsdp()), (Composition(), hybrid), (no_shard, Composition(wrapper=Wrapper.DDP))):
        for api in (Api.SPLIT, Api.COMBINED):
            StateDictBody(tree=TREE, source=source, target=target, api=api, save=FULL, load=FULL)
    # valid: sharded between like kinds on one mesh
    StateDictBody(tree=TREE, source=full_shard, target=fsdp1(Wrapper.FSDP1_SHARD_GRAD_OP))
    StateDictBody(tree=TREE, source=no_shard, target=Composition())
    Case("state_dict", 2, 0, StateDictBody(tree=TREE, source=hybrid, target=fsdp(mesh=(1, 2))))
    # ShardedTensors go into FSDP1 FULL_SHARD / SHARD_GRAD_OP only
    with pytest.raises(CaseError, match="sharded_tensor to dtensor"):
        StateDictBody(tree=TREE, source=full_shard, target=fsdp())
    with pytest.raises(CaseError, match="sharded_tensor to plain"):
        StateDictBody(tree=TREE, source=full_shard, target=no_shard, api=Api.COMBINED)
    # DTensors on another mesh
    with pytest.raises(CaseError, match="same mesh"):
        StateDictBody(tree=TREE, source=hybrid, target=fsdp())
    assert sharded_in_memory_problem(hybrid, fsdp(mesh=(1, 2))) is None
    # FSDP1 sides are judged by resuming
    with pytest.raises(CaseError, match="steps_after"):
        StateDictBody(tree=TREE, source=fsdp(), target=full_shard, save=FULL, load=FULL, steps_after=0)
    # FSDP1 materializes a meta module when it wraps it
    with pytest.raises(CaseError, match="FSDP1"):
        StateDictBody(tree=TREE, source=fsdp(), target=full_shard, save=FULL, load=FULL, target_meta_init=True)
    # FSDP2's own state_dict is not FSDP1's
    with pytest.raises(CaseError, match="FSDP2's own state_dict"):
        Case("state_dict", 2, 0, StateDictBody(tree=TREE, source=hybrid, target=hybrid, api=Api.MODULE))
    # FSDP1's own API stays between FSDP1 models
    with pytest.raises(CaseError, match="FSDP1 model to an FSDP1 model"):
        StateDictBody(tree=TREE, source=fsdp(), target=full_shard, api=Api.FSDP1, save=FULL, load=FULL)
    # through DCP FSDP1 keeps the classic recipe, between FSDP1 models
    with pytest.raises(CaseError, match="FSDP1 model to an FSDP1 model"):
        DcpBody(tree=TREE, source=full_shard, target=fsdp(), entries=(DcpItem.MODEL,))


def test_corpus_entries_of_fsdp1_load_as_before() -> None:
    """The FSDP1 state_dict entries of the corpus saved with FSDP1's own API still mean FSDP1's
    own API between FSDP1 models; the others with an FSDP1 side use the state-dict functions.
    Every entry survives JSON."""
    seen = 0
    for path in sorted((ROOT / "corpus").glob("state_dict-*.json")):
        raw = json.loads(path.read_text())
        case = case_from_json(raw["case"])
        body = case.body
        assert isinstance(body, StateDictBody)
        if raw["case"]["body"]["api"] == Api.FSDP1.value:
            seen += 1
            assert body.api is Api.FSDP1 and is_fsdp1(body.source) and is_fsdp1(body.target), path
        elif is_fsdp1(body.source) or is_fsdp1(body.target):
            assert body.api in (Api.SPLIT, Api.COMBINED), path
        assert case_from_json(json.loads(json.dumps(case_to_json(case)))) == case
    assert seen >= 2


def test_full_offload_of_an_fsdp1_source_is_the_known_bug_under_every_api() -> None:
    """get_*_state_dict with full_state_dict and cpu_offload take FSDP1's state with
    offload_to_cpu (and rank0_only): the known FSDP1 offload bug on CPU."""
    for api in (Api.SPLIT, Api.COMBINED):
        body = StateDictBody(
            tree=TREE,
            source=fsdp1(Wrapper.FSDP1_FULL_SHARD),
            target=Composition(),
            training=ADAM,
            api=api,
            save=Options(full_state_dict=True, cpu_offload=True),
            load=Options(full_state_dict=True, broadcast_from_rank0=True),
        )
        assert known_bug(Case("state_dict", 2, 0, body)) == FSDP1_FULL_OFFLOAD
        one_rank = StateDictBody(**{**body.__dict__, "source": fsdp1(Wrapper.FSDP1_NO_SHARD)})
        assert known_bug(Case("state_dict", 2, 0, one_rank)) != FSDP1_FULL_OFFLOAD  # NO_SHARD gathers nothing


def test_stateless_optimizer_into_fsdp1_is_not_the_stateless_bug() -> None:
    """An FSDP1 target loads a full optimizer state through FSDP.optim_state_dict_to_load,
    not the path that asserts "Expected device to be set"."""
    stateless = Training(optimizer=Optimizer.SGD, steps=1)
    body = StateDictBody(
        tree=TREE, source=fsdp(), target=fsdp1(Wrapper.FSDP1_FULL_SHARD), training=stateless, save=FULL, load=FULL
    )
    assert known_bug(Case("state_dict", 2, 0, body)) is None


def test_local_state_of_a_parameter_without_elements_on_the_rank_is_not_compared() -> None:
    local = {"scale": {"exp_avg": [], "exp_avg_sq": [], "step": [1.0]}, "w": {"exp_avg": [0.5], "step": [1.0]}}
    assert holding_elements(local) == {"w": {"exp_avg": [0.5], "step": [1.0]}}


# --------------------------------------------------------------------------------- draws, repro


def test_fsdp1_under_the_state_dict_functions_is_drawn_at_a_useful_rate() -> None:
    counts: Counter[str] = Counter()
    bugs: Counter[str | None] = Counter()
    n = 0

    @settings(
        max_examples=1500,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(state_dict_cases(world_size=2))
    def collect(case: Case) -> None:
        nonlocal n
        n += 1
        counts.update(features_state_dict(case))
        if _dsd_fsdp1(case):
            bugs[known_bug(case)] += 1

    collect()
    # Measured over 2,000 draws: split 3.1% (source), 4.8% (target), 4.2% (both); combined 1.6%
    # in all. The floors are well below, and 1,500 draws keep them far from a count of a few,
    # so another Hypothesis version's draws do not trip them.
    assert sum(counts[f"combined:fsdp1_{side}"] for side in ("source", "target", "both")) >= 0.004 * n, counts
    for side in ("source", "target", "both"):
        assert counts[f"split:fsdp1_{side}"] >= 0.01 * n, counts
    dsd = sum(bugs.values())
    assert dsd >= 0.08 * n, counts
    assert dsd - bugs[None] <= 0.1 * dsd, bugs  # known bugs stay rare


def test_repro_renders_fsdp1_cases_of_the_state_dict_functions() -> None:
    body = _scenarios(2)["full-fsdp1-to-fully_shard"]
    entry = CorpusEntry(
        case=Case("state_dict", 2, 41, body),
        kind="mismatch",
        signature="mismatch:state_dict:optimizer@split",
        summary="made up for the test",
        details={"check": "optimizer"},
        versions={"torch": "2.13.0"},
        reruns=1,
        reproduced=1,
    )
    script = render_entry(entry)  # every body kind renders (fuzz/repro/)
    compile(script, "repro.py", "exec")
    assert entry.signature in script


# --------------------------------------------------------------------------------- sensitivity


def test_resume_notices_aliased_fsdp1_optimizer_states_taken_by_get_optimizer_state_dict(tmp_path: Path) -> None:
    """A fault in the FSDP1 gather under get_optimizer_state_dict: every gathered state of a
    parameter a view of one buffer. The target of another API loads exactly what it was
    given (the optimizer check agrees), so resuming must see it."""
    env = aliased_optimizer_state_env(tmp_path)
    body = StateDictBody(
        tree=TREE, source=fsdp1(Wrapper.FSDP1_FULL_SHARD), target=fsdp("1"), training=ADAM, save=FULL, load=FULL
    )
    with fault_pool(env, world_size=2, deadline=30) as pool:
        failure = run_case(pool, get_property("state_dict"), Case("state_dict", 2, 42, body))
    assert failure is not None, "aliased FSDP1 optimizer states went unnoticed"
    assert failure.signature.startswith("mismatch:state_dict:resume_"), failure.signature
