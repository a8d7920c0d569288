"""Scripts printed from the case for state_dict and dcp (fuzz/repro/print_state.py, print_dcp.py,
print_parts.py): a printed round trip judges as the pool does, what cannot be printed is refused
by name, and the stored ones are current and clean."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from fuzz._rank.state_dict import FRESH_SEED
from fuzz.corpus import load_entry
from fuzz.errors import CaseError
from fuzz.model import (
    Api,
    Block,
    Case,
    Composition,
    DcpBody,
    DcpItem,
    Leaf,
    LeafKind,
    ModuleTree,
    Optimizer,
    Options,
    Overwrite,
    ShardSpec,
    StateDictBody,
    Training,
    WriterOptions,
)
from fuzz.repro import print_cut, print_parts, print_state
from fuzz.repro.print_check import FRAME
from fuzz.repro.printed import is_printed, print_entry
from tests.conftest import ROOT, torchrun

_SIDES = [
    Composition(),
    Composition(shards=(ShardSpec(path=""),)),
    Composition(shards=(ShardSpec(path="0", reshard_after_forward=False), ShardSpec(path=""))),
]


@st.composite
def printable_state_dict_cases(draw: st.DrawFn) -> Case:
    """state_dict cases of what print_state writes: plain or fully_shard sides, the split, combined
    or module API, full or sharded state dicts, SGD or Adam, training on after the load."""
    inner = Block(children=(Leaf(LeafKind.LINEAR), Leaf(LeafKind.TANH)), scale=draw(st.booleans()))
    tree = ModuleTree(width=draw(st.sampled_from([2, 3])), root=Block(children=(inner, Leaf(LeafKind.LINEAR))))
    full = draw(st.booleans())
    try:
        body = StateDictBody(
            tree=tree,
            source=draw(st.sampled_from(_SIDES)),
            target=draw(st.sampled_from(_SIDES)),
            training=Training(
                optimizer=draw(st.sampled_from([Optimizer.SGD, Optimizer.ADAM])),
                momentum=0.9,
                steps=draw(st.integers(1, 2)),
                param_groups=draw(st.integers(1, 2)),
            ),
            steps_after=draw(st.integers(0, 1)),
            api=draw(st.sampled_from([Api.SPLIT, Api.COMBINED, Api.MODULE])),
            save=Options(full_state_dict=full),
            load=Options(full_state_dict=full),
        )
    except CaseError:
        reject()
    return Case(property="state_dict", world_size=2, seed=draw(st.integers(0, 3)), body=body)


@settings(max_examples=2, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(case=printable_state_dict_cases())
def test_a_printed_round_trip_judges_as_the_pool(rank_pool: Any, case: Case) -> None:
    """Differential: where the pool's run of a case passes, the printed script's ``main`` finds
    nothing that differs on any rank; where the pool's raises, the script's raises too."""
    if rank_pool.world_size != 2 or rank_pool.backend != "gloo":
        pytest.skip("compares with a 2-rank gloo pool")
    code = print_state.print_case(case)
    outcome = rank_pool.run(case)
    ran = rank_pool.run_script(code, function="main", deadline=120)
    assert not ran.missing, ran.missing
    differs = {rank: v for rank, v in ran.verdicts.items() if v != "None"}  # what main found to differ
    if outcome.ok:
        assert not ran.errors and not differs, (ran.errors, differs)
    else:
        assert ran.errors or differs, outcome


@st.composite
def printable_dcp_cases(draw: st.DrawFn) -> Case:
    """dcp round trips of what print_dcp writes: the model and optimizer entries (their state
    dicts, or the objects with patched state_dict methods) with a Stateful (scalars, counter) or
    the extra tensor in per-rank orders, a save or async saves a training step apart (one
    cache-staging writer for them), storage objects, a save over an earlier checkpoint."""
    inner = Block(children=(Leaf(LeafKind.LINEAR), Leaf(LeafKind.TANH)))
    tree = ModuleTree(width=2, root=Block(children=(inner, Leaf(LeafKind.LINEAR))))
    stateful = draw(st.sampled_from([DcpItem.SCALARS, DcpItem.COUNTER, DcpItem.EXTRA]))
    entries = (DcpItem.MODEL, DcpItem.OPTIMIZER, stateful)
    async_saves = draw(st.sampled_from([0, 0, 2]))
    storage_objects = draw(st.booleans())
    try:
        body = DcpBody(
            tree=tree,
            source=draw(st.sampled_from(_SIDES)),
            target=draw(st.sampled_from(_SIDES)),
            entries=entries,
            training=Training(momentum=0.9, steps=2),
            orders=draw(st.sampled_from([(), ((0, 1, 2), (2, 0, 1))])),
            async_save=async_saves > 0 or draw(st.booleans()),
            async_saves=async_saves,
            cache_staged=async_saves > 0 and draw(st.booleans()),
            storage_objects=storage_objects,
            writer=WriterOptions(thread_count=draw(st.sampled_from([1, 2]))),
            patched=draw(st.booleans()),
            overwrite=Overwrite.TRUE if storage_objects and not async_saves and draw(st.booleans()) else Overwrite.NONE,
        )
    except CaseError:
        reject()
    return Case(property="dcp", world_size=2, seed=draw(st.integers(0, 3)), body=body)


@settings(max_examples=2, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(case=printable_dcp_cases())
def test_a_printed_dcp_round_trip_judges_as_the_pool(rank_pool: Any, case: Case) -> None:
    """Differential, as for state_dict: the printed dcp script (async saves in flight included)
    finds nothing to differ where the pool's run passes, and fails where it fails."""
    if rank_pool.world_size != 2 or rank_pool.backend != "gloo":
        pytest.skip("compares with a 2-rank gloo pool")
    code = print_state.print_case(case)
    outcome = rank_pool.run(case)
    ran = rank_pool.run_script(code, function="main", deadline=120)
    assert not ran.missing, ran.missing
    differs = {rank: v for rank, v in ran.verdicts.items() if v != "None"}
    if outcome.ok:
        assert not ran.errors and not differs, (ran.errors, differs)
    else:
        assert ran.errors or differs, outcome


def test_saves_in_flight_between_a_plain_and_a_sharded_side_pass_under_torchrun(tmp_path: Path) -> None:
    """The plain source averages its gradients by hand while its async saves are in flight too
    (a case the differential test drew: train() was called without that argument)."""
    inner = Block(children=(Leaf(LeafKind.LINEAR), Leaf(LeafKind.TANH)))
    body = DcpBody(
        tree=ModuleTree(width=2, root=Block(children=(inner, Leaf(LeafKind.LINEAR)))),
        source=_SIDES[0],
        target=_SIDES[1],
        entries=(DcpItem.MODEL, DcpItem.OPTIMIZER, DcpItem.SCALARS),
        training=Training(momentum=0.9, steps=2),
        async_save=True,
        async_saves=2,
    )
    script = tmp_path / "repro.py"
    script.write_text(print_state.print_case(Case(property="dcp", world_size=2, seed=0, body=body)))
    done = torchrun(script)
    assert done.returncode == 0 and "PASS" in done.stdout, done.stdout + done.stderr


def test_what_cannot_be_printed_yet_is_refused_by_name() -> None:
    entry = load_entry(ROOT / "corpus" / "dcp-mismatch-175e579ba153.json")
    partial = replace(entry.case, body=replace(entry.case.body, skip=(DcpItem.SCALARS,)))  # a partial load
    with pytest.raises(print_state.NotPrintable, match=r"cannot print body\.skip=.* yet"):
        print_state.print_case(partial, entry)
    ddp = load_entry(ROOT / "corpus" / "state_dict-exception-d4322b68deab.json").case  # printed as an exception
    with pytest.raises(print_state.NotPrintable, match=r"cannot print target\.wrapper=ddp yet"):
        print_state.print_case(ddp)  # judged: DDP's "module." names are not compared


def test_a_failing_script_ends_with_the_phase_its_case_failed_in() -> None:
    """The phase is read off the rank side's functions in the failing ranks' tracebacks and
    stacks; the script stops there and says so. Where no frame tells (a function run in two
    phases) and for a mismatch, the script runs whole."""
    phases = {
        "state_dict-crash-81ffab405f7f": "save",  # state_dict() of the source died
        "state_dict-exception-b39fcc19147a": "load",
        "state_dict-hang-dff6a54ad235": "load",  # rank 1's stack (an observation) tells nothing
        "state_dict-exception-bf9272b690b5": "train",
        "dcp-exception-c392ca0e3a90": "save",  # inside the loop of async saves
        "dcp-exception-418da060d0db": None,  # _values: the source's or the target's
        "dcp-mismatch-175e579ba153": None,
    }
    for name, phase in phases.items():
        entry = load_entry(ROOT / "corpus" / f"{name}.json")
        assert print_cut.failed_phase(entry) == phase, name
        main = print_entry(entry).split("\ndef main(", 1)[1].split("\nif __name__", 1)[0]
        assert ("target = " in main) == (phase in (None, "load")), name
        assert ("train(target" in main) == (phase is None), name


def test_prune_drops_what_nothing_left_reads() -> None:
    head = ["import os", "import re", "from torch import nn, optim as o"]
    parts = ["def used():\n    return nn.Linear(1, 1)", "def unused():\n    return re.compile('x')", "X = 1"]
    kept = ['def main():\n    print(f"{os.getpid()} {used()}")']  # names read in an f-string count
    assert print_cut.prune(head, parts, kept) == (["import os", "from torch import nn"], [parts[0]])


def test_the_target_seed_is_the_rank_sides() -> None:
    assert print_parts.FRESH_SEED == FRESH_SEED


def _stored() -> list[Path]:
    paths = [
        *sorted((ROOT / "corpus").glob("state_dict-*.repro.py")),
        *sorted((ROOT / "corpus").glob("dcp-*.repro.py")),
    ]
    return [p for p in paths if is_printed(p.read_text())]


def test_stored_printed_scripts_are_current_and_clean() -> None:
    """Each stored printed state_dict / dcp script is what printing its entry gives now (below the
    line that records what it was printed from); ruff finds nothing in it (F, E, B, SIM); an
    exception's reads its frames with the one pattern (fuzz.repro.print_check.FRAME)."""
    stored = _stored()
    assert len(stored) >= 8
    for path in stored:
        text = path.read_text()
        entry = load_entry(path.with_name(path.name.removesuffix(".repro.py") + ".json"))
        assert text.split("\n", 2)[2] == print_entry(entry).split("\n", 1)[1], path.name
        assert (FRAME in text) == (entry.kind == "exception"), path.name
    lint = [sys.executable, "-m", "ruff", "check", "--no-cache", "--select", "F,E,B,SIM", *map(str, stored)]
    done = subprocess.run(lint, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout
