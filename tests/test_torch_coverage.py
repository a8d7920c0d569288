"""Torch coverage: ranks measure the torch lines they run, the driver merges them per module and
lists the functions never reached, the report and the command line show them, and the
scheduler follows new lines (its arithmetic is checked without ranks)."""

from __future__ import annotations

import ast
import json
import random
import shutil
from pathlib import Path

import pytest

from fuzz.bench import bench_torch_coverage
from fuzz.explore import LINE_SHARE
from fuzz.report import render_html
from fuzz.scheduler import Scheduler
from fuzz.torch_coverage import (
    PACKAGES,
    ReachedLines,
    _functions,
    format_table,
    load,
    module_figures,
    package_files,
    torch_root,
    torch_summary,
)
from tests.conftest import ROOT, run_cli

pytest.importorskip("coverage")

FULLY_SHARD = "torch/distributed/fsdp/_fully_shard/_fully_shard.py"
MODULE = "torch.distributed.fsdp._fully_shard._fully_shard"


# --------------------------------------------------------------------------------------------
# The scheduler's arithmetic


def test_without_the_line_signal_new_lines_change_nothing() -> None:
    plain, fed = Scheduler(["a", "b"], random.Random(0)), Scheduler(["a", "b"], random.Random(0))
    for _ in range(5):
        plain.record("a", seconds=2.0, discoveries=3)
        plain.record("b", seconds=2.0, discoveries=1)
        fed.record("a", seconds=2.0, discoveries=3, new_lines=0)
        fed.record("b", seconds=2.0, discoveries=1, new_lines=500)
    assert fed.weights() == plain.weights()
    assert [fed.pick() for _ in range(50)] == [plain.pick() for _ in range(50)]


def test_a_property_still_reaching_new_lines_gets_more_time() -> None:
    s = Scheduler(["reaching", "saturated"], random.Random(0), line_share=LINE_SHARE)
    for _ in range(10):  # the same feature discoveries; only the torch lines differ
        s.record("reaching", seconds=5.0, discoveries=2, new_lines=30)
        s.record("saturated", seconds=5.0, discoveries=2, new_lines=0)
    w = s.weights()
    assert sum(w.values()) == pytest.approx(1.0)
    assert w["reaching"] > 0.65 > 0.35 > w["saturated"] >= 0.1 - 1e-9  # the floor stays
    # The line signal decides LINE_SHARE of the rate-driven time: (1 - floor) * LINE_SHARE at most.
    assert w["reaching"] - w["saturated"] < (1 - s.floor) * LINE_SHARE + 1e-9


def test_new_lines_count_on_a_log_scale_and_fade_with_the_window() -> None:
    s = Scheduler(["burst", "steady"], random.Random(0), line_share=1.0, floor=0.0)
    s.record("burst", seconds=1.0, discoveries=0, new_lines=4000)  # a first chunk: the imports' lines
    s.record("steady", seconds=1.0, discoveries=0, new_lines=20)
    first = s.line_rates()
    # 4000 lines at once count log2(4001) ~ 12, not 200 times 20 lines (log2(21) ~ 4.4).
    assert 2.0 < first["burst"] / first["steady"] < 3.0
    for _ in range(4):
        s.record("burst", seconds=1.0, discoveries=0, new_lines=0)
        s.record("steady", seconds=1.0, discoveries=0, new_lines=20)
    assert s.weights()["steady"] > s.weights()["burst"]


def test_the_line_share_is_checked() -> None:
    with pytest.raises(ValueError, match="line_share"):
        Scheduler(["a"], random.Random(0), line_share=1.5)


# --------------------------------------------------------------------------------------------
# Merging and figures, from data files written here


def _write_data(path: Path, lines: dict[str, list[int]]) -> None:
    from coverage import CoverageData

    data = CoverageData(basename=str(path))
    data.add_lines({f: set(v) for f, v in lines.items()})
    data.write()
    close = getattr(data, "close", None)
    if close is not None:
        close()


def test_the_ranks_files_merge_and_only_new_statements_count(tmp_path: Path) -> None:
    target = str(torch_root() / "distributed" / "fsdp" / "_fully_shard" / "_fully_shard.py")
    tree = ast.parse(Path(target).read_text())
    # the definition, after its typing.overload stubs
    *_, fn = (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "fully_shard")
    body = [s.lineno for s in fn.body[1:4]]  # statements after the docstring
    (tmp_path / "pool-0").mkdir()
    _write_data(tmp_path / "coverage.rank0.pid1", {target: body[:2], "/elsewhere/x.py": [1, 2]})
    _write_data(tmp_path / "pool-0" / "coverage.rank1.pid2", {target: body[1:]})
    (tmp_path / "unrelated.txt").write_text("not data")
    lines = ReachedLines([tmp_path])
    assert lines.update() == 3  # merged: a statement two ranks ran counts once
    assert lines.files == 2 and lines.foreign == {"/elsewhere/x.py": {1, 2}}
    assert lines.update() == 0  # nothing changed: nothing read again, nothing new
    _write_data(tmp_path / "coverage.rank0.pid3", {target: [*body, fn.body[4].lineno]})
    assert lines.update() == 1
    (figures,) = (m for m in module_figures(lines.reached) if m.file == FULLY_SHARD)
    assert figures.module == MODULE and figures.reached == 4 and figures.lines > 100
    assert "fully_shard" not in figures.never_reached
    assert "FSDPModule.reshard" in figures.never_reached
    summary = torch_summary(lines, per_property={"parity": 4}, signal=True)
    assert summary["reached"] == 4 and summary["foreign_files"] == 1 and summary["data_files"] == 3
    assert [p["package"] for p in summary["packages"]] == list(PACKAGES)
    assert f"{MODULE} " in format_table(summary)


def test_functions_are_named_as_written_and_nested_bodies_are_their_own() -> None:
    source = (
        "from typing import overload\n"
        "def outer():\n"
        "    x = 1\n"
        "    def inner():\n"
        "        return 2\n"
        "    class Local:\n"
        "        def method(self):\n"
        "            pass\n"
        "    return inner\n"
        "class C:\n"
        "    @overload\n"
        "    def f(self): ...\n"
        "    def g(self):\n"
        "        if True:\n"
        "            def h(): pass\n"
        "        return 1\n"
    )
    found = dict(_functions(ast.parse(source)))
    assert set(found) == {"outer", "outer.inner", "outer.Local.method", "C.g", "C.g.h"}
    assert found["outer"] == {3, 4, 6, 7, 9} and found["outer.inner"] == {5}
    assert found["C.g"] == {14, 16}  # line 15 is h's body, written on its def line


def test_every_module_of_the_packages_has_figures() -> None:
    modules = module_figures({})
    assert len(modules) == sum(len(package_files(p)) for p in PACKAGES)
    assert all(m.reached == 0 for m in modules)
    assert any(m.file == FULLY_SHARD and m.functions > 10 for m in modules)


def test_the_report_shows_torch_coverage_and_survives_junk(tmp_path: Path) -> None:
    lines = ReachedLines([tmp_path])
    summary = {"seed": 1, "torch_coverage": torch_summary(lines, per_property={"parity": 0}, signal=False)}
    summary["cases_per_property"] = {"parity": 3}
    summary["timeline"] = [{"t": 1.0, "cases": 1, "torch_lines": 10}, {"t": 2.0, "cases": 3, "torch_lines": 12}]
    page = render_html(summary)
    assert "Torch coverage (0 of" in page and "Measured only" in page and "new torch lines" in page
    assert "Torch lines reached over time" in page and f"<code>{MODULE}</code>" in page
    junk = {"torch_coverage": {"packages": ["x", {"package": "<b>"}], "modules": [7, {"never_reached": "x"}]}}
    page = render_html(junk)
    assert "Torch coverage (0 of 0" in page and "<code><b></code>" not in page and "&lt;b&gt;" in page
    assert "Torch coverage" not in render_html({"seed": 1})


# --------------------------------------------------------------------------------------------
# A real campaign and the command line


def test_a_short_campaign_measures_fully_shard_on_every_rank(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    shutil.copytree(ROOT / "corpus", corpus)
    report = tmp_path / "report"
    result = run_cli(
        "explore", "--property", "parity", "--max-examples", "6", "--budget", "90", "--seed", "1",
        "--torch-coverage", "--report", str(report), "--corpus", str(corpus), "--no-database",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    data = report / "torch-coverage"
    assert {p.name.split(".")[1] for p in data.glob("coverage.rank*")} == {"rank0", "rank1"}
    assert f"python -m fuzz coverage --torch {data}" in result.stderr
    summary = json.loads((report / "summary.json").read_text())["torch_coverage"]
    (figures,) = (m for m in summary["modules"] if m["file"] == FULLY_SHARD)
    assert figures["reached"] > 0 and "fully_shard" not in figures["never_reached"]
    assert summary["signal"] is True and summary["new_lines_per_property"]["parity"] > 0
    # What `python -m fuzz coverage --torch REPORT` prints: the same data, the same figures.
    shown = format_table(torch_summary(load(report)))
    assert f"torch lines reached: {summary['reached']} of {summary['lines']}" in shown
    (row,) = (line for line in shown.splitlines() if line.startswith(f"{MODULE} "))
    assert int(row.split()[1]) == figures["reached"]


def test_a_corpus_is_measured_by_replaying_its_entries(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    shutil.copy(ROOT / "corpus" / "parity-mismatch-cfc52991d173.json", corpus)
    data = tmp_path / "data"
    result = run_cli("coverage", "--torch", str(data), "--corpus", str(corpus))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[1/1]" in result.stderr
    (row,) = (line for line in result.stdout.splitlines() if line.startswith(f"{MODULE} "))
    assert int(row.split()[1]) > 0
    assert sorted(p.name.split(".")[1] for p in data.glob("coverage.rank*")) == ["rank0", "rank1"]


def test_the_bench_times_the_same_cases_without_and_with_coverage() -> None:
    lines: list[str] = []
    result = bench_torch_coverage(cases=3, properties=("invalid",), out=lines.append)
    (off, on) = result["invalid"]
    assert off > 0 and on > 0
    assert lines[-1].startswith("cases per minute: off ") and lines[-2].startswith("start-up of the ranks: off ")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("coverage", "--torch"), "--torch needs a directory"),
        (("coverage", "--torch", "{tmp}/missing"), "missing: does not exist"),
        (("coverage", "--torch", "{tmp}"), "no torch coverage data"),
        (("coverage", "--torch", "{tmp}/garbage"), "no torch coverage data in it (1 unreadable"),
        (("coverage", "--torch", "--corpus", "{tmp}/missing"), "--corpus {tmp}/missing does not exist"),
        (("coverage", "--torch", "--corpus", "{tmp}"), "no entry to replay"),
        (("coverage", "--api", "--torch", "{tmp}"), "name one"),
        (("coverage", "--corpus", "{tmp}"), "--corpus goes with --torch"),
        (("explore", "--no-coverage-signal"), "--no-coverage-signal goes with --torch-coverage"),
    ],
)
def test_bad_input_exits_2_with_one_line_naming_it(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "coverage.rank0.pid1").write_text("not a database")
    result = run_cli(*(a.replace("{tmp}", str(tmp_path)) for a in args))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message.replace("{tmp}", str(tmp_path)) in lines[0], result.stderr
