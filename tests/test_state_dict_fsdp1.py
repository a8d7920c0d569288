"""FSDP1's own state dicts in the ``state_dict`` and ``dcp`` properties: generated cases on the
pool, hand-built scenarios, the draw rates, and the torch bugs these cases met (kept rare by the
strategies, and run here as expected failures so that a torch fix shows up).

FSDP1 keeps optimizer state as flat local shards, so a load is judged by resuming (losses and
final full parameters against the source trained on) and, between one layout, by each rank's
local optimizer state; full parameters come from summon_full_params.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, assume, find, given, settings
from hypothesis import strategies as st

from fuzz import known
from fuzz.errors import CaseError
from fuzz.explore import run_case
from fuzz.known import fsdp1_full_offload, known_bug
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
    ModuleTree,
    Optimizer,
    Options,
    StateDictBody,
    Training,
    Wrapper,
    is_fsdp1,
)
from fuzz.pool import RankPool
from fuzz.properties import get_property
from fuzz.properties.state_dict import _named_by_known_bug, features_dcp, features_state_dict
from fuzz.signature import Failure
from strategies import dcp_cases, state_dict_cases
from tests.conftest import MUTANTS, fault_pool
from tests.test_state_dict import TREE

FSDP1_ASYNC_DEFAULT_STAGER = known.FSDP1_ASYNC_DEFAULT_STAGER.id
FSDP1_DCP_EMPTY_SHARD = known.FSDP1_DCP_EMPTY_SHARD.id
FSDP1_DCP_STATELESS = known.FSDP1_DCP_STATELESS.id
FSDP1_FROZEN_UNIT = known.FSDP1_FROZEN_UNIT.id
FSDP1_FULL_OFFLOAD = known.FSDP1_FULL_OFFLOAD.id
FSDP1_HSDP_OPTIMIZER_LOAD = known.FSDP1_HSDP_OPTIMIZER_LOAD.id
FSDP1_HSDP_SHARD1 = known.FSDP1_HSDP_SHARD1.id

ADAM = Training(optimizer=Optimizer.ADAM, lr=0.05, dtype=Dtype.FLOAT64, steps=2, param_groups=2)
SGD = Training(optimizer=Optimizer.SGD, lr=0.1, momentum=0.9, steps=2)
#: Enough examples of a drawn minority; generating a case costs milliseconds, running one more.
FILTERED = settings(suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])


def fsdp1(wrapper: Wrapper, *, mesh: tuple[int, ...] = (), auto_wrap: bool = False, **kw: Any) -> Composition:
    return Composition(wrapper=wrapper, mesh=mesh, auto_wrap=auto_wrap, **kw)


def hsdp(world_size: int) -> Composition:
    """HYBRID_SHARD with every rank in the shard dimension (2: (1, 2); 4: (2, 2))."""
    return fsdp1(Wrapper.FSDP1_HYBRID_SHARD, mesh=(2, 2) if world_size == 4 else (1, world_size))


# --------------------------------------------------------------------------------- generated


@FILTERED
@given(data=st.data())
def test_generated_fsdp1_state_dicts_resume_exactly(rank_pool: RankPool, check_case: Any, data: Any) -> None:
    case = data.draw(state_dict_cases(world_size=rank_pool.world_size), label="case")
    assume(isinstance(case.body, StateDictBody) and case.body.api is Api.FSDP1)
    assume(known_bug(case) is None)
    check_case(case)


@FILTERED
@given(data=st.data())
def test_generated_fsdp1_checkpoints_resume_exactly(rank_pool: RankPool, check_case: Any, data: Any) -> None:
    case = data.draw(dcp_cases(world_size=rank_pool.world_size), label="case")
    assume(isinstance(case.body, DcpBody) and is_fsdp1(case.body.source))
    assume(known_bug(case) is None)
    check_case(case)


# --------------------------------------------------------------------------------- by hand


@pytest.mark.parametrize(
    "full,source,target,rank0_only",
    [
        (False, Wrapper.FSDP1_FULL_SHARD, Wrapper.FSDP1_SHARD_GRAD_OP, False),  # ShardedTensor into ShardedTensor
        (False, Wrapper.FSDP1_NO_SHARD, Wrapper.FSDP1_NO_SHARD, False),  # plain tensors
        (True, Wrapper.FSDP1_NO_SHARD, Wrapper.FSDP1_FULL_SHARD, False),  # full: any strategies
        (True, Wrapper.FSDP1_FULL_SHARD, Wrapper.FSDP1_HYBRID_SHARD, False),
        # rank0_only: the state taken on rank 0 alone, the optimizer's broadcast by optim_state_dict_to_load
        (True, Wrapper.FSDP1_SHARD_GRAD_OP, Wrapper.FSDP1_NO_SHARD, True),
        (True, Wrapper.FSDP1_HYBRID_SHARD, Wrapper.FSDP1_FULL_SHARD, True),
    ],
    ids=[
        "sharded-full_shard-to-shard_grad_op",
        "sharded-no_shard",
        "full-no_shard-to-full_shard",
        "full-to-hsdp",
        "rank0_only-shard_grad_op-to-no_shard",
        "rank0_only-hsdp-to-full_shard",
    ],
)
def test_fsdp1_state_dict_scenarios(
    check_case: Any, rank_pool: RankPool, full: bool, source: Wrapper, target: Wrapper, rank0_only: bool
) -> None:
    ws = rank_pool.world_size
    side = {w: hsdp(ws) if w is Wrapper.FSDP1_HYBRID_SHARD else fsdp1(w, auto_wrap=True) for w in (source, target)}
    body = StateDictBody(
        tree=TREE,
        source=side[source],
        target=side[target],
        training=ADAM,
        steps_after=2,
        api=Api.FSDP1,
        save=Options(full_state_dict=full),
        load=Options(full_state_dict=full, broadcast_from_rank0=rank0_only),
        empty_group=True,
    )
    check_case(Case("state_dict", ws, 21, body))


def test_fsdp1_checkpoint_between_strategies(check_case: Any, rank_pool: RankPool) -> None:
    """The classic recipe from HYBRID_SHARD to FULL_SHARD with auto-wrapping: DCP reshards the
    model's DTensors into ShardedTensors, load_sharded_optimizer_state_dict the optimizer's."""
    ws = rank_pool.world_size
    entries = (DcpItem.SCALARS, DcpItem.MODEL, DcpItem.OPTIMIZER, DcpItem.EXTRA, DcpItem.COUNTER)
    body = DcpBody(
        tree=TREE,
        source=hsdp(ws),
        target=fsdp1(Wrapper.FSDP1_FULL_SHARD, auto_wrap=True, checkpoints=("1",)),
        entries=entries,
        training=ADAM,
        orders=tuple(tuple(range(len(entries)))[:: 1 if r % 2 == 0 else -1] for r in range(ws)),
        storage_objects=True,
        async_save=True,
    )
    check_case(Case("dcp", ws, 22, body))


def test_fsdp1_optimizer_left_out_keeps_its_local_state(rank_pool: RankPool, check_case: Any) -> None:
    """A partial load without the optimizer: each rank's local optimizer state stays fresh."""
    body = DcpBody(
        tree=TREE,
        source=fsdp1(Wrapper.FSDP1_FULL_SHARD),
        target=fsdp1(Wrapper.FSDP1_FULL_SHARD),
        entries=(DcpItem.MODEL, DcpItem.OPTIMIZER),
        skip=(DcpItem.OPTIMIZER,),
        training=SGD,
    )
    case = Case("dcp", rank_pool.world_size, 23, body)
    check_case(case)
    outcome = rank_pool.run(case)
    assert outcome.ok, outcome.describe()
    for obs in outcome.observations:  # the judge compared these: every rank reports its shards
        assert "optimizer_local" in obs["loaded"] and "optimizer_local" in obs["fresh"]
        assert obs["loaded"]["optimizer_local"] == obs["fresh"]["optimizer_local"]


def test_fsdp1_rules() -> None:
    full_shard, no_shard = fsdp1(Wrapper.FSDP1_FULL_SHARD), fsdp1(Wrapper.FSDP1_NO_SHARD)
    with pytest.raises(CaseError, match="FSDP1 model to an FSDP1 model"):
        StateDictBody(tree=TREE, source=full_shard, target=Composition(), api=Api.FSDP1)
    # get/set_*_state_dict take FSDP1 models too (tests/test_state_dict_fsdp1_dsd.py); FSDP2's
    # own state_dict does not
    StateDictBody(
        tree=TREE,
        source=full_shard,
        target=full_shard,
        save=Options(full_state_dict=True),
        load=Options(full_state_dict=True),
    )
    with pytest.raises(CaseError, match="api"):
        StateDictBody(tree=TREE, source=full_shard, target=full_shard, api=Api.MODULE)
    with pytest.raises(CaseError, match="cannot go from sharded_tensor to plain"):
        StateDictBody(tree=TREE, source=full_shard, target=no_shard, api=Api.FSDP1)
    with pytest.raises(CaseError, match="rank0_only is a FULL_STATE_DICT config"):
        StateDictBody(
            tree=TREE,
            source=full_shard,
            target=full_shard,
            api=Api.FSDP1,
            load=Options(broadcast_from_rank0=True),
        )
    with pytest.raises(CaseError, match="steps_after"):
        StateDictBody(tree=TREE, source=full_shard, target=full_shard, api=Api.FSDP1, steps_after=0)
    with pytest.raises(CaseError, match="load"):
        StateDictBody(
            tree=TREE,
            source=full_shard,
            target=no_shard,
            api=Api.FSDP1,
            save=Options(full_state_dict=True),
            load=Options(full_state_dict=True, strict=False),
        )
    # through DCP an FSDP1 model takes app or patched state dicts too (tests/test_state_dict_fsdp1_dcp.py)
    DcpBody(tree=TREE, source=full_shard, target=no_shard, entries=(DcpItem.APP,))
    with pytest.raises(CaseError, match="classic recipe"):
        DcpBody(tree=TREE, source=full_shard, target=no_shard, entries=(DcpItem.MODEL,), module_stateful=True)
    with pytest.raises(CaseError, match="SHARDED_STATE_DICT"):
        DcpBody(tree=TREE, source=full_shard, target=no_shard, entries=(DcpItem.MODEL,), load_full_state_dict=True)


# --------------------------------------------------------------------------------- draw rates

_N = 500


def _counts(strategy: Any, features: Any, world_size: int = 2) -> tuple[Counter[str], Counter[str | None], int]:
    counts, bugs, n = _derandomized_counts(strategy, features, world_size)
    return Counter(counts), Counter(bugs), n


@cache  # derandomized: the same sample every time, so the tests of one worker share one draw
def _derandomized_counts(
    strategy: Any, features: Any, world_size: int
) -> tuple[Counter[str], Counter[str | None], int]:
    counts: Counter[str] = Counter()
    bugs: Counter[str | None] = Counter()
    n = 0

    @settings(
        max_examples=_N,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy(world_size=world_size))
    def collect(case: Case) -> None:
        nonlocal n
        n += 1
        counts.update(features(case))
        bugs[known_bug(case)] += 1

    collect()
    return counts, bugs, n


def test_fsdp1_is_drawn_at_a_useful_rate() -> None:
    for strategy, features in ((state_dict_cases, features_state_dict), (dcp_cases, features_dcp)):
        counts, bugs, n = _counts(strategy, features)
        assert counts["api:fsdp1_optim_state_dict"] >= 0.05 * n, (strategy, counts)
        if strategy is state_dict_cases:  # FSDP1's own FULL_STATE_DICT with rank0_only (about 3%)
            assert counts["fsdp1:rank0_only"] >= 0.01 * n, counts
        sources = sum(v for k, v in counts.items() if k.startswith("source:fsdp1_"))
        assert sources >= 0.08 * n, (strategy, counts)
        # The known bugs of the FSDP1 branches stay rare: each hit costs a respawn of the pool.
        fsdp1_bugs = {FSDP1_HSDP_SHARD1, FSDP1_FULL_OFFLOAD, FSDP1_DCP_STATELESS, FSDP1_DCP_EMPTY_SHARD}
        rare = sum(bugs[b] for b in fsdp1_bugs | {FSDP1_FROZEN_UNIT, FSDP1_ASYNC_DEFAULT_STAGER})
        assert rare <= 0.2 * sources, (strategy, dict(bugs))


@pytest.mark.parametrize(
    "strategy,bug,world_size",
    [
        (state_dict_cases, FSDP1_HSDP_SHARD1, 2),
        # A minute or more in CI: dcp_cases draws its FSDP1 sides from the same fsdp1_layouts
        # (and its keep_known of this bug) that the state_dict_cases search above reaches.
        pytest.param(dcp_cases, FSDP1_HSDP_SHARD1, 2, marks=pytest.mark.slow),
        (state_dict_cases, FSDP1_FULL_OFFLOAD, 2),
        # The known bugs of the DCP branch (FSDP1_DCP_STATELESS, FSDP1_ASYNC_DEFAULT_STAGER,
        # FSDP1_DCP_EMPTY_SHARD, FSDP1_FROZEN_UNIT) take conjunctions too rare for a find of
        # this size (each behind its own 1-in-16 branch of dcp_cases / fsdp1_layouts); campaigns
        # meet them, and test_known_fsdp1_bugs_still_fail runs each.
    ],
    ids=lambda v: v if isinstance(v, str) else getattr(v, "__name__", str(v)),
)
def test_known_fsdp1_bugs_stay_reachable(strategy: Any, bug: str, world_size: int) -> None:
    """Rare, not excluded: a campaign notices when torch fixes one."""
    found = find(
        strategy(world_size=world_size),
        lambda c: known_bug(c) == bug,
        settings=settings(
            max_examples=5000, database=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck)
        ),
    )
    assert known_bug(found) == bug


def test_hybrid_shard_with_a_shard_dimension_of_one_is_rare() -> None:
    """At 2 ranks half the HYBRID_SHARD meshes have a shard dimension of 1 (pytorch/pytorch#154888);
    the strategy keeps about 1 in 16 of them."""
    counts, _bugs, n = _counts(state_dict_cases, features_state_dict)
    hybrid = counts["source:fsdp1_hybrid_shard"] + counts["target:fsdp1_hybrid_shard"]
    assert hybrid >= 0.03 * n, counts
    assert counts["fsdp1:hybrid_shard1"] <= 0.25 * hybrid, counts


# --------------------------------------------------------------------------------- known torch bugs


def _known_cases(world_size: int) -> dict[str, Case]:
    """One small case per known FSDP1-related torch bug, at this world size."""
    full_shard = fsdp1(Wrapper.FSDP1_FULL_SHARD)
    mesh1 = fsdp1(Wrapper.FSDP1_HYBRID_SHARD, mesh=(world_size, 1))
    small = ModuleTree(width=1, root=TREE.root)  # fewer chunks than ranks
    full = Options(full_state_dict=True)
    return {
        FSDP1_FULL_OFFLOAD: Case(
            "state_dict",
            world_size,
            31,
            StateDictBody(
                tree=TREE,
                source=full_shard,
                target=full_shard,
                training=ADAM,
                api=Api.FSDP1,
                save=Options(full_state_dict=True, cpu_offload=True),
                load=Options(full_state_dict=True),
            ),
        ),
        FSDP1_HSDP_SHARD1: Case(
            "state_dict",
            world_size,
            32,
            StateDictBody(
                tree=TREE, source=full_shard, target=mesh1, training=SGD, api=Api.FSDP1, save=full, load=full
            ),
        ),
        FSDP1_DCP_STATELESS: Case(
            "dcp",
            world_size,
            33,
            DcpBody(
                tree=TREE,
                source=full_shard,
                target=full_shard,
                entries=(DcpItem.MODEL, DcpItem.OPTIMIZER),
                training=Training(optimizer=Optimizer.SGD, steps=1),
            ),
        ),
        FSDP1_DCP_EMPTY_SHARD: Case(
            "dcp",
            world_size,
            34,
            DcpBody(
                tree=small, source=full_shard, target=full_shard, entries=(DcpItem.MODEL, DcpItem.SCALARS), training=SGD
            ),
        ),
        FSDP1_FROZEN_UNIT: Case(
            "state_dict",
            world_size,
            37,
            StateDictBody(
                # the root's own parameters frozen, the block's (a unit of its own) trainable
                tree=ModuleTree(
                    width=2,
                    root=Block(children=(Leaf(LeafKind.LINEAR, frozen=True), Block(children=(Leaf(LeafKind.LINEAR),)))),
                ),
                source=fsdp1(Wrapper.FSDP1_NO_SHARD, auto_wrap=True),
                target=fsdp1(Wrapper.FSDP1_NO_SHARD),
                training=SGD,
                api=Api.FSDP1,
                save=full,
                load=full,
            ),
        ),
        FSDP1_ASYNC_DEFAULT_STAGER: Case(
            "dcp",
            world_size,
            35,
            DcpBody(
                tree=TREE, source=full_shard, target=full_shard, entries=(DcpItem.MODEL,), training=SGD, async_save=True
            ),
        ),
    }


@pytest.mark.parametrize(
    "bug,expected",
    [
        # SIGSEGV while cloning freed memory, or (if the memory was not reused yet) the
        # optimizer's aliased states: either way the case fails.
        (FSDP1_FULL_OFFLOAD, ":state_dict"),
        (FSDP1_HSDP_SHARD1, "mismatch:state_dict@fsdp1_optim_state_dict:shard1"),
        (FSDP1_DCP_STATELESS, "exception:dcp:builtins.ValueError@torch/distributed/fsdp/_optim_utils.py"),
        (FSDP1_DCP_EMPTY_SHARD, "exception:dcp:torch.distributed.checkpoint.api.CheckpointException"),
        (FSDP1_ASYNC_DEFAULT_STAGER, "exception:dcp:builtins.RuntimeError@torch/distributed/_shard/sharded_tensor"),
        (FSDP1_FROZEN_UNIT, "exception:state_dict:builtins.AssertionError@torch/distributed/fsdp/_state_dict_utils.py"),
    ],
)
def test_known_fsdp1_bugs_still_fail(rank_pool: RankPool, bug: str, expected: str) -> None:
    """Each known bug, as a case: it must still fail as described (docs/state_dict.md), or torch
    fixed it and the strategies can stop keeping it rare."""
    case = _known_cases(rank_pool.world_size)[bug]
    assert known_bug(case) == bug
    if bug == FSDP1_FULL_OFFLOAD:
        body = case.body
        assert isinstance(body, StateDictBody) and fsdp1_full_offload(body, case.world_size)
        if rank_pool.backend == "nccl":
            # On a GPU the offload copies to the CPU before the buffer is freed: no bug there.
            assert run_case(rank_pool, get_property(case.property), case) is None
            return
    failure = run_case(rank_pool, get_property(case.property), case)
    assert failure is not None, f"{bug} no longer fails: torch fixed it?"
    assert expected in failure.signature, failure.signature


@pytest.mark.parametrize(
    "target,entries,check,renamed",
    [
        (fsdp1(Wrapper.FSDP1_HYBRID_SHARD, mesh=(2, 2)), (DcpItem.MODEL, DcpItem.OPTIMIZER), "optimizer", True),
        (fsdp1(Wrapper.FSDP1_HYBRID_SHARD, mesh=(2, 2)), (DcpItem.MODEL, DcpItem.OPTIMIZER), "resume_params", True),
        # a wrong model after the load is another bug
        (fsdp1(Wrapper.FSDP1_HYBRID_SHARD, mesh=(2, 2)), (DcpItem.MODEL, DcpItem.OPTIMIZER), "model", False),
        # the optimizer state not loaded through load_sharded_optimizer_state_dict
        (fsdp1(Wrapper.FSDP1_HYBRID_SHARD, mesh=(2, 2)), (DcpItem.MODEL,), "resume_params", False),
        # one replica, or one rank per shard group: world-chunked state is FSDP1's own layout there
        (fsdp1(Wrapper.FSDP1_HYBRID_SHARD, mesh=(1, 4)), (DcpItem.MODEL, DcpItem.OPTIMIZER), "optimizer", False),
        (fsdp1(Wrapper.FSDP1_FULL_SHARD), (DcpItem.MODEL, DcpItem.OPTIMIZER), "optimizer", False),
    ],
)
def test_hsdp_optimizer_load_is_named_by_its_mechanism(
    target: Composition, entries: tuple[DcpItem, ...], check: str, renamed: bool
) -> None:
    """The classic FSDP1 DCP recipe into HYBRID_SHARD over a 2-D mesh loads world-chunked
    optimizer state (docs/known_bugs.md): the checks downstream of that load, and only those,
    are renamed to the mechanism, so the known entry hides no other optimizer or model bug."""
    case = Case(
        "dcp",
        4,
        1,
        DcpBody(tree=TREE, source=fsdp1(Wrapper.FSDP1_FULL_SHARD), target=target, entries=entries, training=ADAM),
    )
    failure = Failure("mismatch", f"mismatch:dcp:{check}@save", "differs", {"check": check})
    got = _named_by_known_bug(case, failure)
    assert got is not None
    if renamed:
        assert got.signature == f"mismatch:dcp@save:{FSDP1_HSDP_OPTIMIZER_LOAD}"
    else:
        assert got is failure
    assert _named_by_known_bug(case, None) is None


# --------------------------------------------------------------------------------- sensitivity


def aliased_optimizer_state_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a fault in FSDP1's full optimizer state gather: every gathered state
    of a parameter a view of one buffer (skips where the mutant harness is absent)."""
    harness = MUTANTS / "harness"
    if not (harness / "sitecustomize.py").exists():
        pytest.skip(f"the mutant harness {harness} is not present beside this checkout")
    spec = {
        "module": "torch.distributed.fsdp._optim_utils",
        "old": "                value = value.detach().clone()\n",
        "new": "                pass\n",
        "models": "fsdp1_full_optim_state_alias",
    }
    path = tmp_path / "alias.json"
    path.write_text(json.dumps(spec))
    env = {"MUTANT": str(path), "PYTHONPATH": os.pathsep.join([str(harness), os.environ.get("PYTHONPATH", "")])}
    return env


@pytest.mark.parametrize("rank0_only", [False, True], ids=["every_rank", "rank0_only"])
def test_fsdp1_resume_notices_aliased_optimizer_states(tmp_path: Path, rank0_only: bool) -> None:
    """A fault in FSDP1's full optimizer state dict: every gathered state a view of one buffer
    (what offload_to_cpu does on CPU, here without it). Only resuming can see it, whether the
    state is taken on every rank or on rank 0 alone and broadcast by optim_state_dict_to_load."""
    env = aliased_optimizer_state_env(tmp_path)
    case = Case(
        "state_dict",
        2,
        36,
        StateDictBody(
            tree=TREE,
            source=fsdp1(Wrapper.FSDP1_FULL_SHARD),
            target=fsdp1(Wrapper.FSDP1_NO_SHARD),
            training=ADAM,
            api=Api.FSDP1,
            save=Options(full_state_dict=True),
            load=Options(full_state_dict=True, broadcast_from_rank0=rank0_only),
        ),
    )
    with fault_pool(env, world_size=2, deadline=30) as pool:
        failure = run_case(pool, get_property("state_dict"), case)
    assert failure is not None, "aliased FSDP1 optimizer states went unnoticed"
    assert failure.signature.startswith("mismatch:state_dict:resume_"), failure.signature
