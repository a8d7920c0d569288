"""The ``state_dict`` and ``dcp`` properties: generated cases, the seeds' scenarios, checkpoints
moved between world sizes, a deadlock inside dcp.save, and faults injected into torch.

The known torch bugs these properties found are corpus entries (``corpus/state_dict-*``,
``corpus/dcp-*``, status ``known``), run as strict expected failures by test_corpus_entries.py;
the generated-case tests here leave those cases out (``known_bug``) so that a rare draw of one
does not cost a whole deadline.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from fuzz.corpus import load_entry
from fuzz.errors import CaseError
from fuzz.explore import run_case
from fuzz.known import ALONE_IN_BROADCAST_STALL, known_bug
from fuzz.model import (
    Api,
    Block,
    Case,
    Composition,
    DcpBody,
    DcpItem,
    DcpMode,
    Dtype,
    Leaf,
    LeafKind,
    ModuleTree,
    Optimizer,
    Options,
    ShardSpec,
    StateDictBody,
    Training,
    case_from_json,
    case_to_json,
)
from fuzz.pool import OutcomeKind, RankPool
from fuzz.properties import get_property
from strategies import dcp_cases, state_dict_cases
from tests.conftest import MUTANTS, fault_pool

TREE = ModuleTree(
    width=4,
    root=Block(
        children=(
            Leaf(LeafKind.LINEAR),
            Block(children=(Leaf(LeafKind.LINEAR), Leaf(LeafKind.TANH), Leaf(LeafKind.LAYER_NORM)), scale=True),
            Leaf(LeafKind.LINEAR, bias=False),
        ),
        buffer=True,
    ),
)
ADAM = Training(optimizer=Optimizer.ADAM, lr=0.05, dtype=Dtype.FLOAT64, steps=2, param_groups=2)
SGD = Training(optimizer=Optimizer.SGD, lr=0.1, momentum=0.9, steps=2)


def fsdp(*paths: str, mesh: tuple[int, ...] = (), shard_dim: int = 0) -> Composition:
    """fully_shard on ``paths`` (children first) and on the root."""
    return Composition(shards=(*(ShardSpec(p, shard_dim=shard_dim) for p in paths), ShardSpec("")), mesh=mesh)


def reversed_orders(n: int, world_size: int) -> tuple[tuple[int, ...], ...]:
    """Rank 0 builds the dict in entry order, rank 1 in reverse, and so on."""
    return tuple(tuple(range(n))[:: 1 if r % 2 == 0 else -1] for r in range(world_size))


# --------------------------------------------------------------------------------- generated


@given(data=st.data())
def test_state_dicts_move_exactly_between_layouts(rank_pool: RankPool, check_case: Any, data: Any) -> None:
    case = data.draw(state_dict_cases(world_size=rank_pool.world_size), label="case")
    assume(known_bug(case) is None)
    check_case(case)


@given(data=st.data())
def test_checkpoints_round_trip_in_any_rank_order(rank_pool: RankPool, check_case: Any, data: Any) -> None:
    case = data.draw(dcp_cases(world_size=rank_pool.world_size), label="case")
    assume(known_bug(case) is None)
    check_case(case)


@settings(max_examples=60, database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), world_size=st.sampled_from([1, 2, 3, 4, 8]))
def test_drawn_cases_validate_and_survive_json(data: Any, world_size: int) -> None:
    for strategy in (state_dict_cases, dcp_cases):
        case = data.draw(strategy(world_size=world_size))
        assert case_from_json(json.loads(json.dumps(case_to_json(case)))) == case


# --------------------------------------------------------------------------------- by hand


def test_seed_scenario_statefuls_with_collectives_in_different_orders(check_case: Any, rank_pool: RankPool) -> None:
    """test_different_ordered_state_dict_keys of the seeds: each rank builds the dict in its own
    order, and two Statefuls run collectives when loaded (the counter all-reduces, the app's
    set_state_dict gathers a full state dict); dcp.load must pair them up."""
    entries = (DcpItem.COUNTER, DcpItem.APP, DcpItem.SCALARS, DcpItem.EXTRA)
    body = DcpBody(
        tree=TREE,
        source=fsdp("1"),
        target=fsdp("0", "2"),
        entries=entries,
        training=ADAM,
        orders=reversed_orders(len(entries), rank_pool.world_size),
        load_full_state_dict=True,
    )
    check_case(Case("dcp", rank_pool.world_size, 11, body))


def test_partial_load_keeps_what_was_left_out(check_case: Any, rank_pool: RankPool) -> None:
    """Entries left out of dcp.load and model keys left out of the state dict keep their fresh
    values; everything else comes back, in place, and with async_save."""
    entries = (DcpItem.MODEL, DcpItem.OPTIMIZER, DcpItem.SCALARS, DcpItem.COUNTER, DcpItem.EXTRA)
    body = DcpBody(
        tree=TREE,
        source=fsdp("1", shard_dim=1),
        target=fsdp("1"),
        entries=entries,
        training=ADAM,
        orders=reversed_orders(len(entries), rank_pool.world_size),
        skip=(DcpItem.OPTIMIZER, DcpItem.SCALARS),
        drop=(0, 5),
        async_save=True,
        storage_objects=True,
    )
    check_case(Case("dcp", rank_pool.world_size, 12, body))


@pytest.mark.parametrize(
    "body",
    [
        # sharded, FSDP2's own state_dict, between two compositions on one mesh
        StateDictBody(tree=TREE, source=fsdp("1"), target=fsdp("0", "2", shard_dim=1), training=ADAM, api=Api.MODULE),
        # a full state dict from rank 0 only, broadcast into a model initialised on meta
        StateDictBody(
            tree=TREE,
            source=fsdp("1"),
            target=fsdp("0"),
            training=SGD,
            save=Options(full_state_dict=True, cpu_offload=True),
            load=Options(full_state_dict=True, broadcast_from_rank0=True),
            target_meta_init=True,
        ),
        # full state dicts between a sharded model and a plain one, non-strict with keys left out
        StateDictBody(
            tree=TREE,
            source=fsdp("1"),
            target=Composition(),
            training=ADAM,
            api=Api.COMBINED,
            save=Options(full_state_dict=True),
            load=Options(full_state_dict=True, strict=False),
            drop=(1, 2),
        ),
    ],
    ids=["module-api-reshard", "broadcast-into-meta", "combined-to-plain-non-strict"],
)
def test_state_dict_scenarios(check_case: Any, rank_pool: RankPool, body: StateDictBody) -> None:
    check_case(Case("state_dict", rank_pool.world_size, 13, body))


def test_bodies_refuse_what_the_api_does_not_support() -> None:
    with pytest.raises(CaseError, match="broadcast_from_rank0"):
        StateDictBody(tree=TREE, source=fsdp(), target=fsdp(), load=Options(broadcast_from_rank0=True))
    with pytest.raises(CaseError, match="same mesh"):
        Case("state_dict", 4, 0, StateDictBody(tree=TREE, source=fsdp(), target=fsdp(mesh=(2, 2))))
    with pytest.raises(CaseError, match="at most one entry"):
        Case(
            "dcp",
            2,
            0,
            DcpBody(
                tree=TREE,
                source=fsdp(),
                target=fsdp(),
                entries=(DcpItem.COUNTER, DcpItem.APP),
                orders=((0, 1), (1, 0)),
                save_full_state_dict=True,
            ),
        )
    with pytest.raises(CaseError, match="checkpoint_dir"):
        DcpBody(tree=TREE, source=fsdp(), target=fsdp(), entries=(DcpItem.MODEL,), mode=DcpMode.SAVE_ONLY)


# --------------------------------------------------------------------------------- liveness


def test_deadlock_inside_dcp_save_is_a_hang_with_every_ranks_stack(rank_pool: RankPool) -> None:
    """A Stateful whose state_dict all-reduces on rank 0 only, inside dcp.save: rank 0 waits in
    its all_reduce, the others in DCP's own collectives. The pool reports a hang, with each
    rank's Python stack, and the same case without the deadlock runs normally before and after
    (before: the first case of a fresh pool imports what its forward needs, which can take
    seconds on a loaded machine, so the 6 s deadline measures the deadlock alone)."""
    body = DcpBody(tree=TREE, source=fsdp(), target=fsdp(), entries=(DcpItem.MODEL, DcpItem.COUNTER), deadlock=True)
    case = Case("dcp", rank_pool.world_size, 14, body)
    healthy = Case(
        "dcp", rank_pool.world_size, 14, DcpBody(tree=TREE, source=fsdp(), target=fsdp(), entries=body.entries)
    )
    assert run_case(rank_pool, get_property("dcp"), healthy) is None
    outcome = rank_pool.run(case, deadline=6)
    assert outcome.kind is OutcomeKind.HANG, outcome.describe()
    for report in outcome.ranks:
        assert report.status == "stuck", outcome.describe()
        assert report.stack and "state_dict_saver.py" in report.stack, outcome.describe()
    assert "in state_dict" in (outcome.ranks[0].stack or "") and "all_reduce" in (outcome.ranks[0].stack or "")
    failure = get_property("dcp").judge(case, outcome)
    assert failure is not None and failure.kind == "hang" and failure.signature.startswith("hang:dcp@")
    assert all(r["stack"] for r in failure.details["ranks"])
    assert run_case(rank_pool, get_property("dcp"), healthy) is None


@pytest.mark.slow  # 13 s each; the entries themselves replay in tests/test_corpus_entries.py
@pytest.mark.parametrize("name", ["state_dict-hang-dff6a54ad235.json", "dcp-hang-96de59c34a50.json"])
def test_the_known_broadcast_deadlock_ends_long_before_the_deadline(rank_pool: RankPool, name: str) -> None:
    """Rank 0 waits alone in _broadcast_state_dict (set_state_dict's broadcast_from_rank0): the
    stall ends the case about 14 s in, as the known entry's hang, not at the 60 s deadline."""
    entry = load_entry(Path(__file__).resolve().parents[1] / "corpus" / name)
    if entry.case.world_size != rank_pool.world_size:
        pytest.skip(f"{name} has {entry.case.world_size} ranks")
    prop = get_property(entry.case.property)
    outcome = rank_pool.run(entry.case, deadline=60.0, stall=prop.stall)
    failure = prop.judge(entry.case, outcome)
    assert failure is not None and failure.signature == entry.signature, outcome.describe()
    assert outcome.stalled == ALONE_IN_BROADCAST_STALL.name, outcome.describe()
    assert outcome.seconds < 30.0, outcome.seconds


# --------------------------------------------------------------------------------- world sizes


def _layout_for(world_size: int) -> Composition:
    return fsdp("1", mesh=(2, world_size // 2) if world_size == 4 else ())


def _cross_case(world_size: int, mode: DcpMode, directory: Path, layout: Composition) -> Case:
    entries = (DcpItem.MODEL, DcpItem.OPTIMIZER, DcpItem.SCALARS, DcpItem.COUNTER, DcpItem.EXTRA)
    saving = mode is DcpMode.SAVE_ONLY
    body = DcpBody(
        tree=TREE,
        source=layout if saving else Composition(),
        target=Composition() if saving else layout,
        entries=entries,
        training=ADAM,
        orders=reversed_orders(len(entries), world_size),
        mode=mode,
        checkpoint_dir=str(directory),
        load_full_state_dict=not saving and world_size == 2,
    )
    return Case("dcp", world_size, 15, body)


def _compare(saved_run: Any, loaded_run: Any) -> None:
    assert saved_run.ok, saved_run.describe()
    assert loaded_run.ok, loaded_run.describe()
    saved, loaded = saved_run.observations[0]["saved"], loaded_run.observations[0]["loaded"]
    for key in ("model", "probe", "optimizer"):
        assert loaded[key] == saved[key], key
    for obs in loaded_run.observations:
        assert obs["in_place"] == ""
        assert obs["loaded"]["groups"] == saved["groups"]
        assert obs["loaded"]["scalars"] == saved["scalars"]
        assert obs["loaded"]["extra"] == saved["extra"]
        assert {k: v for k, v in obs["loaded"]["counter"].items() if k != "agreed"} == {
            k: v for k, v in saved["counter"].items() if k != "agreed"
        }


def test_checkpoints_move_between_world_sizes(rank_pool: RankPool, tmp_path: Path) -> None:
    """Saved by 4 ranks (HSDP 2x2) and loaded by 2 (1D, full state dicts), and the other way
    round: parameters, optimizer state, hyperparameters, Statefuls and the forward output on a
    fixed input are the ones the saving run reported."""
    small = rank_pool.world_size
    large = 4 if small != 4 else 2
    if rank_pool.backend == "nccl":
        import torch

        if torch.cuda.device_count() < small + large:
            pytest.skip(
                f"a {large}-rank NCCL pool needs {large} GPUs beside the session pool's {small}; "
                f"this host has {torch.cuda.device_count()}"
            )
    with RankPool(world_size=large, backend=rank_pool.backend, deadline=120) as other:
        big_dir, small_dir = tmp_path / f"by-{large}", tmp_path / f"by-{small}"
        saved_big = other.run(_cross_case(large, DcpMode.SAVE_ONLY, big_dir, _layout_for(large)))
        saved_small = rank_pool.run(_cross_case(small, DcpMode.SAVE_ONLY, small_dir, _layout_for(small)))
        loaded_small = rank_pool.run(_cross_case(small, DcpMode.LOAD_ONLY, big_dir, _layout_for(small)))
        loaded_big = other.run(_cross_case(large, DcpMode.LOAD_ONLY, small_dir, _layout_for(large)))
    _compare(saved_big, loaded_small)
    _compare(saved_small, loaded_big)


# --------------------------------------------------------------------------------- sensitivity

#: Faults in torch's own code (the mutant harness format of ../shared/mutants), each a bug the
#: properties must catch, with a case that shows it.
FAULTS = {
    # Broadcasting a full state dict into a sharded model: every rank keeps the first shard.
    "full_load_first_shard": (
        {
            "module": "torch.distributed._state_dict_utils",
            "old": "slice(cur_offset, cur_offset + cur_shape)",
            "new": "slice(0, cur_shape)",
        },
        Case(
            "state_dict",
            2,
            16,
            StateDictBody(
                tree=TREE,
                source=fsdp("1"),
                target=fsdp("1"),
                training=ADAM,
                save=Options(full_state_dict=True),
                load=Options(full_state_dict=True, broadcast_from_rank0=True),
            ),
        ),
        "mismatch:state_dict:model@split",
    ),
    # dcp.load calls the Statefuls in each rank's own order (the deadlock pytorch#114304 fixed).
    "load_in_dict_order": (
        {
            "module": "torch.distributed.checkpoint.state_dict_loader",
            "old": "keys = sorted(state_dict.keys())",
            "new": "keys = list(state_dict.keys())",
        },
        Case(
            "dcp",
            2,
            17,
            DcpBody(
                tree=TREE,
                source=fsdp("1"),
                target=fsdp("1"),
                entries=(DcpItem.COUNTER, DcpItem.APP),
                training=ADAM,
                orders=((0, 1), (1, 0)),
                load_full_state_dict=True,
            ),
        ),
        "dcp",
    ),
}


#: The faults above that deadlock the ranks: their pool's deadline is short, to keep the test short.
HANG_FAULTS = {"load_in_dict_order"}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_properties_notice_faults_in_torch(fault: str, tmp_path: Path) -> None:
    spec, case, expected = FAULTS[fault]
    harness = MUTANTS / "harness"
    if not (harness / "sitecustomize.py").exists():
        pytest.skip(f"the mutant harness {harness} is not present beside this checkout")
    path = tmp_path / f"{fault}.json"
    path.write_text(json.dumps({**spec, "models": fault}))
    env = {"MUTANT": str(path), "PYTHONPATH": os.pathsep.join([str(harness), os.environ.get("PYTHONPATH", "")])}
    # A deadlock fault waits out the deadline; a mismatch fault's case must finish within it, on a
    # loaded machine too (seen: a 5 s deadline made full_load_first_shard's first case a "hang").
    deadline = 5.0 if fault in HANG_FAULTS else 60.0
    with fault_pool(env, world_size=case.world_size, deadline=deadline) as pool:
        failure = run_case(pool, get_property(case.property), case)
    assert failure is not None, f"{fault} went unnoticed"
    assert expected in failure.signature, failure.signature
