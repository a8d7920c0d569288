"""What the state leaving the source promises on its own, and DCP's load-time resharding.

- get_optimizer_state_dict returns the optimizer's whole state by FQN, frozen parameters'
  state included (``taken_optimizer``), judged before anything loads it;
- a DCP checkpoint's model entry, loaded on one process into a plain model (``no_dist``: a
  world of one, no shards), holds the values saved (``reload_one_rank``);
- at four ranks, so it does loaded by each half of the ranks into a model fully_shard shards
  over them (``process_group``: another world size, ``reload_half_world``).

Each is shown to pass on this torch, to fail on a deliberately wrong observation, and to
notice a planted fault that the round trip between equal layouts cannot see
(tests/faults/K10, K21, K34).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from fuzz.explore import run_case
from fuzz.model import (
    Case,
    DcpBody,
    DcpItem,
    Dtype,
    Optimizer,
    RequiresGrad,
    StateDictBody,
    Training,
)
from fuzz.pool import RankPool
from fuzz.properties import get_property
from fuzz.properties.state_dict import judge_dcp, judge_state_dict
from fuzz.verdict import Outcome
from tests.conftest import fault_env, fault_pool
from tests.test_state_dict import TREE, fsdp

ADAM = Training(optimizer=Optimizer.ADAM, lr=0.05, dtype=Dtype.FLOAT64, steps=2, set_to_none=True)
#: Leaf "0" trains in step 0 and is frozen from step 1 on: Adam holds state for it while it
#: is frozen when the state is taken.
FREEZE_TRAINED = (RequiresGrad(path="0", step=1, trainable=False),)


def _tampered(outcome: Outcome, change: Any) -> Outcome:
    ranks = [dataclasses.replace(r, observation=copy.deepcopy(r.observation)) for r in outcome.ranks]
    tampered = dataclasses.replace(outcome, ranks=ranks)
    change(tampered.observations)
    return tampered


def _reload_case() -> Case:
    """Sharded over both ranks on both sides (each saved chunk loads 1:1), model only."""
    body = DcpBody(tree=TREE, source=fsdp(), target=fsdp(), entries=(DcpItem.MODEL,), training=ADAM)
    return Case("dcp", 2, 41, body)


def _taken_case() -> Case:
    body = DcpBody(
        tree=TREE,
        source=fsdp("1"),
        target=fsdp("1"),
        entries=(DcpItem.MODEL, DcpItem.OPTIMIZER),
        skip=(DcpItem.OPTIMIZER,),
        training=ADAM,
        requires_grad=FREEZE_TRAINED,
    )
    return Case("dcp", 2, 43, body)


def test_a_checkpoint_reloads_on_one_process(rank_pool: RankPool) -> None:
    case = _reload_case()
    outcome = rank_pool.run(case)
    assert outcome.ok, outcome.describe()
    first = outcome.observations[0]
    assert first["reloaded"] and set(first["reloaded"]) <= set(first["saved"]["model"]), sorted(first["reloaded"])
    assert judge_dcp(case, outcome) is None

    def wrong(observations: list[dict[str, Any]]) -> None:
        name = sorted(observations[0]["reloaded"])[0]
        observations[0]["reloaded"][name][0] += 1.0

    failure = judge_dcp(case, _tampered(outcome, wrong))
    assert failure is not None and failure.signature == "mismatch:dcp:reload_one_rank@save", failure


@pytest.fixture(scope="module")
def pool4() -> Iterator[RankPool]:
    with RankPool(world_size=4, deadline=60) as pool:
        yield pool


def _reload_case4() -> Case:
    """Sharded over four ranks, model only: each half of the ranks loads it sharded over two."""
    return dataclasses.replace(_reload_case(), world_size=4)


def test_a_checkpoint_of_four_ranks_reloads_into_two(pool4: RankPool) -> None:
    case = _reload_case4()
    outcome = pool4.run(case)
    assert outcome.ok, outcome.describe()
    observations = outcome.observations
    halves = [rank for rank, obs in enumerate(observations) if "reloaded_half" in obs]
    assert halves == [0, 2], halves
    saved = observations[0]["saved"]["model"]
    for rank in halves:
        got = observations[rank]["reloaded_half"]
        assert got["ranks"] == 2 and got["values"] and set(got["values"]) <= set(saved), got
    assert "reload:half_world" in get_property("dcp").features(case)
    assert judge_dcp(case, outcome) is None

    def wrong(observations: list[dict[str, Any]]) -> None:
        values = observations[2]["reloaded_half"]["values"]
        values[sorted(values)[0]][0] += 1.0

    failure = judge_dcp(case, _tampered(outcome, wrong))
    assert failure is not None and failure.signature == "mismatch:dcp:reload_half_world@save", failure


def test_taken_optimizer_state_holds_a_frozen_parameters_state(rank_pool: RankPool) -> None:
    case = _taken_case()
    outcome = rank_pool.run(case)
    assert outcome.ok, outcome.describe()
    saved = outcome.observations[0]["saved"]
    assert "0.weight" in saved["taken_optimizer"], sorted(saved["taken_optimizer"])
    assert judge_dcp(case, outcome) is None

    def lose(observations: list[dict[str, Any]]) -> None:
        del observations[0]["saved"]["taken_optimizer"]["0.weight"]

    failure = judge_dcp(case, _tampered(outcome, lose))
    assert failure is not None and failure.signature == "mismatch:dcp:taken_optimizer@save", failure


def test_state_dict_judges_the_taken_optimizer_state(rank_pool: RankPool) -> None:
    body = StateDictBody(tree=TREE, source=fsdp("1"), target=fsdp(), training=ADAM)
    case = Case("state_dict", 2, 44, body)
    outcome = rank_pool.run(case)
    assert outcome.ok, outcome.describe()
    assert judge_state_dict(case, outcome) is None

    def lose(observations: list[dict[str, Any]]) -> None:
        taken = observations[0]["taken_optimizer"]
        del taken[sorted(taken)[0]]

    failure = judge_state_dict(case, _tampered(outcome, lose))
    assert failure is not None and failure.signature.startswith("mismatch:state_dict:taken_optimizer@"), failure


# --------------------------------------------------------------------------------- planted faults


def test_one_rank_reload_notices_a_load_that_reads_one_chunk_of_several() -> None:
    """tests/faults/K21: a local chunk overlapping several saved chunks reads only the first.
    Between equal layouts every chunk loads 1:1, so only the reload on one process sees it."""
    env = fault_env("K21_reshard_reads_first_chunk")
    with fault_pool(env, world_size=2, deadline=30) as pool:
        failure = run_case(pool, get_property("dcp"), _reload_case())
    assert failure is not None and failure.signature == "mismatch:dcp:reload_one_rank@save", failure


def test_half_world_reload_notices_a_group_rank_taken_for_a_global_one() -> None:
    """tests/faults/K34: DCP takes the coordinator's rank in the process group for its global
    rank. Saves and loads over every rank cannot tell them apart; the half of the ranks that
    does not hold global rank 0 can."""
    env = fault_env("K34_dcp_group_rank_as_global")
    with fault_pool(env, world_size=4, deadline=30) as pool:
        failure = run_case(pool, get_property("dcp"), _reload_case4())
    assert failure is not None, "K34 not noticed"
    with fault_pool(env, world_size=2, deadline=30) as pool:
        assert run_case(pool, get_property("dcp"), _reload_case()) is None  # one group: no difference


def test_taken_optimizer_notices_a_getter_that_drops_frozen_state() -> None:
    """tests/faults/K10: get_optimizer_state_dict leaves out frozen parameters' state; the
    case does not load the optimizer, so only the check of what was taken sees it."""
    env = fault_env("K10_optim_state_skips_frozen")
    with fault_pool(env, world_size=2, deadline=30) as pool:
        failure = run_case(pool, get_property("dcp"), _taken_case())
    assert failure is not None and failure.signature == "mismatch:dcp:taken_optimizer@save", failure
