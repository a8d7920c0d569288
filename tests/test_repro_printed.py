"""Scripts printed from the case (fuzz/repro/printed.py): what they observe is what the pool
observes, they refuse by name what they cannot print, and the stored ones are current, clean and
compute every value they compare."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, reject, settings
from hypothesis import strategies as st

from fuzz.corpus import load_entry
from fuzz.errors import CaseError
from fuzz.model import (
    AccumSync,
    Block,
    Case,
    Composition,
    Dtype,
    Leaf,
    LeafKind,
    ModuleTree,
    Optimizer,
    ParityBody,
    ShardSpec,
    Training,
    Wrapper,
)
from fuzz.repro.printed import NotPrintable, comments, is_printed, print_case
from tests.conftest import ROOT

#: What the test adds to a printed script to read its composed run as the pool's observations.
_OBSERVE = """

def observe(rank, world_size):
    import json
    seen = run(rank, world_size, compose)
    params = [{n: t.double().flatten().tolist() for n, t in s[2].items()} for s in seen]
    return json.dumps({"losses": [s[0] for s in seen], "params": params})
"""

_LEAVES = st.sampled_from([LeafKind.LINEAR, LeafKind.LAYER_NORM, LeafKind.CONV1D, LeafKind.TANH, LeafKind.RELU])
_WEIGHTED = (LeafKind.LINEAR, LeafKind.LAYER_NORM, LeafKind.CONV1D)
_COMPOSITIONS = [
    Composition(shards=(ShardSpec(path=""),)),
    Composition(shards=(ShardSpec(path="0", reshard_after_forward=False), ShardSpec(path=""))),
    Composition(shards=(ShardSpec(path="0"), ShardSpec(path="")), mesh=(1, 2)),
    Composition(shards=(ShardSpec(path=""),), mesh=(2, 1)),
    Composition(replicates=("",), shards=(ShardSpec(path="0"),)),
    Composition(wrapper=Wrapper.FSDP1_NO_SHARD, auto_wrap=True),
]


@st.composite
def printable_parity_cases(draw: st.DrawFn) -> Case:
    """Parity cases of what fuzz.repro.printed writes: Linear, LayerNorm, one-tap Conv and
    activation leaves in blocks with a scale, a buffer or a residual, fully_shard (nested, HSDP)
    or replicate over fully_shard, or FSDP1's NO_SHARD; SGD or Adam, microbatches with a
    gradient-sync switch."""
    kinds = draw(st.lists(_LEAVES, min_size=0, max_size=2))
    leaves = [Leaf(k, bias=(k in _WEIGHTED and draw(st.booleans())) or k not in _WEIGHTED) for k in kinds]
    inner = Block(children=(Leaf(LeafKind.LINEAR), *leaves[:1]), scale=draw(st.booleans()))
    root = Block(children=(inner, Leaf(LeafKind.LINEAR), *leaves[1:]), buffer=draw(st.booleans()))
    adam = draw(st.booleans())
    accum = draw(st.integers(1, 2))
    try:
        training = Training(
            optimizer=Optimizer.ADAM if adam else Optimizer.SGD,
            dtype=Dtype.FLOAT64 if adam else Dtype.FLOAT32,
            steps=draw(st.integers(1, 2)),
            grad_accum=accum,
            accum_sync=draw(st.sampled_from([AccumSync.ALWAYS, AccumSync.NO_GRAD_SYNC]))
            if accum > 1
            else AccumSync.ALWAYS,
        )
        body = ParityBody(
            tree=ModuleTree(width=draw(st.sampled_from([2, 3, 5])), root=root),
            composition=draw(st.sampled_from(_COMPOSITIONS)),
            training=training,
        )
        return Case(property="parity", world_size=2, seed=draw(st.integers(0, 3)), body=body)
    except CaseError:
        reject()


_FSDP1 = Case(
    "parity",
    2,
    1,
    ParityBody(
        tree=ModuleTree(width=3, root=Block(children=(Block(children=(Leaf(LeafKind.LINEAR),)), Leaf(LeafKind.TANH)))),
        composition=_COMPOSITIONS[-1],
        training=Training(steps=2),
    ),
)


@settings(max_examples=3, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@example(case=_FSDP1)
@given(case=printable_parity_cases())
def test_a_printed_script_observes_what_the_pool_observes(rank_pool: Any, case: Case) -> None:
    """Differential: the printed program's composed run (its losses on every rank, its full
    parameters after every step) equals the pool's run of the same case, bit for bit."""
    if rank_pool.world_size != 2 or rank_pool.backend != "gloo":
        pytest.skip("compares with a 2-rank gloo pool")
    try:
        code = print_case(case)
    except NotPrintable:
        reject()
    outcome = rank_pool.run(case)
    if not outcome.ok:
        reject()  # the pool's own failure: its script is another test's
    ran = rank_pool.run_script(code + _OBSERVE, function="observe", deadline=120)
    assert not ran.errors and not ran.missing, (ran.errors, ran.missing)
    for rank, observation in enumerate(outcome.observations):
        mine = json.loads(ran.verdicts[rank])
        assert json.dumps(mine["losses"]) == json.dumps(observation["losses"]), f"rank {rank}'s losses"
    assert json.dumps(json.loads(ran.verdicts[0])["params"]) == json.dumps(outcome.observations[0]["params"])


def test_what_cannot_be_printed_yet_is_refused_by_name() -> None:
    tree = ModuleTree(width=2, root=Block(children=(Leaf(LeafKind.LINEAR), Leaf(LeafKind.DROPOUT))))
    case = Case("parity", 2, 0, ParityBody(tree=tree, composition=_COMPOSITIONS[0]))
    with pytest.raises(NotPrintable, match=r"cannot print leaf kind dropout \(at 1\) yet"):
        print_case(case)
    entry = load_entry(ROOT / "corpus" / "parity-mismatch-28f92215865a.json")
    with pytest.raises(NotPrintable, match=r"cannot print composition\.replicate_options\.static_graph=True yet"):
        print_case(entry.case)
    entry = load_entry(ROOT / "corpus" / "metamorphic-mismatch-c39d139117c4.json")
    with pytest.raises(NotPrintable, match=r"cannot print variant\.wrapper=fsdp1_hybrid_shard yet"):
        print_case(entry.case)


def _stored_printed() -> list[Path]:
    return [p for p in sorted((ROOT / "corpus").glob("*.repro.py")) if is_printed(p.read_text())]


def test_stored_printed_scripts_are_current_clean_and_compute_what_they_compare() -> None:
    """Each stored printed script is what printing its entry gives now; ruff finds nothing in it
    (F, E, B, SIM); and no float in it is a value to compare against: only the tolerance
    policy, the optimizer's options, the knobs' values, the weights' own initialisation and the
    factors named."""
    stored = _stored_printed()
    assert len(stored) >= 6
    for path in stored:
        text = path.read_text()
        entry = load_entry(path.with_name(path.name.removesuffix(".repro.py") + ".json"))
        assert text.split("\n", 2)[2] == "\n".join(comments(entry)) + "\n\n" + print_case(entry.case), path.name
        training = entry.case.body.training  # type: ignore[attr-defined]
        factor = entry.case.body.composition.knobs.gradient_divide_factor  # type: ignore[attr-defined]
        allowed = {1e-05, 1e-06, 1e-09, 1e-12, training.lr, training.momentum, training.eps, 0.1, 1.0, 1e-4, factor}
        floats = {n.value for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Constant) and type(n.value) is float}
        assert floats <= allowed, (path.name, floats - allowed)
    lint = [sys.executable, "-m", "ruff", "check", "--no-cache", "--select", "F,E,B,SIM", *map(str, stored)]
    done = subprocess.run(lint, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


def test_a_printed_script_outside_torchrun_exits_2_with_one_line(tmp_path: Path) -> None:
    entry = load_entry(ROOT / "corpus" / "parity-mismatch-009298376223.json")
    script = tmp_path / "repro.py"
    script.write_text(print_case(entry.case))
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip() == f"run it with: torchrun --nproc-per-node 2 {script}"
