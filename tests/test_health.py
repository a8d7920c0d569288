"""The health benchmark (fuzz/health.py): /proc and nvidia-smi parsing, the verdict, a short run."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest

from fuzz.corpus import load_entry
from fuzz.errors import InvalidArgument
from fuzz.health import (
    LIMIT,
    _known_to_fail,
    change,
    format_report,
    health_bench,
    main,
    parse_nvidia_smi,
    verdict,
    within,
)
from fuzz.pool import parse_status, sample_process

ROOT = Path(__file__).resolve().parents[1]

STATUS = """\
Name:\tpython
Umask:\t0022
State:\tS (sleeping)
Pid:\t4242
VmPeak:\t 2000000 kB
VmRSS:\t  358912 kB
RssAnon:\t  200000 kB
Threads:\t10
SigQ:\t0/95442
"""


def test_parse_status_reads_rss_and_threads() -> None:
    assert parse_status(STATUS) == {"rss_mib": 358912 / 1024, "threads": 10}


def test_parse_status_of_a_kernel_thread_has_no_rss() -> None:
    # Kernel threads have no VmRSS line; the metric is then unknown, not zero.
    assert parse_status("Name:\tkthreadd\nThreads:\t1\n") == {"threads": 1}


def test_sample_process_reads_a_proc_tree(tmp_path: Path) -> None:
    (tmp_path / "77" / "fd").mkdir(parents=True)
    (tmp_path / "77" / "status").write_text(STATUS)
    for fd in ("0", "1", "2", "5"):
        (tmp_path / "77" / "fd" / fd).write_text("")
    assert sample_process(77, proc=str(tmp_path)) == {"rss_mib": 358912 / 1024, "threads": 10, "fds": 4}
    assert sample_process(78, proc=str(tmp_path)) == {}  # gone


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs Linux /proc")
def test_sample_process_of_this_process_is_sane() -> None:
    stats = sample_process(os.getpid())
    assert stats["rss_mib"] > 0 and stats["threads"] >= 1 and stats["fds"] >= 3


def test_parse_nvidia_smi_sums_per_pid_and_skips_unparsable_rows() -> None:
    text = "1234, 512\n1235, 498\n1234, 100\n999, [N/A]\n\nnot a row\n"
    assert parse_nvidia_smi(text) == {1234: 612.0, 1235: 498.0}


def test_change_and_within() -> None:
    assert change(100.0, 110.0) == pytest.approx(1.1)
    assert change(0, 0) == 1.0
    assert change(0, 3) == math.inf
    assert change(None, 3) is None and change(3, None) is None
    assert within(1.2) and within(0.8) and within(None)
    assert not within(1.21) and not within(0.79) and not within(math.inf)


def _marks(first: dict[str, Any], last: dict[str, Any], *, restarts: tuple[int, int] = (0, 0)) -> list[dict[str, Any]]:
    def rank(r: int, figures: dict[str, Any]) -> dict[str, Any]:
        return {"rank": r, "pid": 100 + r, "rss_mib": 300.0, "threads": 10, "fds": 20, "gpu_mib": None, **figures}

    return [
        {"cases": 200, "restarts": restarts[0], "cases_in_process": 200, "ranks": [rank(0, first), rank(1, {})]},
        {"cases": 2000, "restarts": restarts[1], "cases_in_process": 2000, "ranks": [rank(0, last), rank(1, {})]},
    ]


def _result(marks: list[dict[str, Any]]) -> dict[str, Any]:
    ratios, drift = verdict(marks)
    return {
        "cases": 2000,
        "seconds": 1.0,
        "limit": LIMIT,
        "per_property": {"parity": 2000},
        "skipped_known": {},
        "known_failures": {},
        "new_failures": {},
        "marks": marks,
        "ratios": {str(r): v for r, v in ratios.items()},
        "drift": drift,
        "same_processes": [r["pid"] for r in marks[0]["ranks"]] == [r["pid"] for r in marks[-1]["ranks"]],
        "ok": not drift,
    }


def test_steady_figures_pass() -> None:
    ratios, drift = verdict(_marks({"rss_mib": 300.0}, {"rss_mib": 330.0, "fds": 22}))
    assert drift == []
    assert ratios[0]["rss_mib"] == pytest.approx(1.1) and ratios[0]["gpu_mib"] is None
    assert format_report(_result(_marks({}, {})))[-1] == "health: ok"


def test_synthetic_drift_gives_the_drift_verdict() -> None:
    # A leak of one process group per case: memory and threads grow by a third.
    marks = _marks({"rss_mib": 300.0, "threads": 10}, {"rss_mib": 400.0, "threads": 14})
    ratios, drift = verdict(marks)
    assert drift == ["rank 0 rss_mib", "rank 0 threads"]
    assert ratios[0]["rss_mib"] == pytest.approx(4 / 3)
    lines = format_report(_result(marks))
    assert lines[-1].startswith("health: drift in rss_mib, threads")
    assert any("DRIFT" in line for line in lines)


def test_a_large_shrink_is_a_drift_too() -> None:
    _, drift = verdict(_marks({"fds": 40}, {"fds": 20}))
    assert drift == ["rank 0 fds"]


def test_gpu_memory_appearing_from_zero_is_a_drift() -> None:
    _, drift = verdict(_marks({"gpu_mib": 0.0}, {"gpu_mib": 10.0}))
    assert drift == ["rank 0 gpu_mib"]


def test_respawn_between_marks_is_reported() -> None:
    marks = _marks({}, {"pid": 555}, restarts=(0, 2))
    marks[1]["cases_in_process"] = 37
    lines = format_report(_result(marks))
    assert any("2 respawn(s)" in line and "run 37 cases" in line for line in lines)
    assert lines[-1] == "health: ok (not the same processes, see the note)"


def test_verdict_needs_two_marks() -> None:
    with pytest.raises(InvalidArgument, match="at least two"):
        verdict(_marks({}, {})[:1])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"marks": (40, 10)}, "must increase"),
        ({"marks": (10,)}, "at least two"),
        ({"marks": (10, 50), "cases": 40}, "go past cases=40"),
        ({"cases": 0}, "cases=0"),
        ({"limit": 1.5}, "limit=1.5"),
    ],
)
def test_bad_arguments_are_refused_before_any_rank_starts(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        health_bench(**{"cases": 40, "marks": (10, 40), **kwargs})


@pytest.mark.parametrize("argv", [["--marks", "200,x"], ["--cases", "10", "--marks", "5,20"], ["--cases", "0"]])
def test_main_exits_2_on_bad_arguments(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        raise SystemExit(main(argv))
    assert e.value.code == 2
    assert "error" in capsys.readouterr().err


def test_known_bugs_that_end_ranks_are_not_run() -> None:
    # FSDP2 with an int reshard_after_forward on Shard(1) raises in training (an exception, so the
    # ranks would be respawned); a known mismatch leaves the ranks alive and is run.
    raising = load_entry(ROOT / "corpus" / "parity-exception-c9b6f29fb81d.json").case
    mismatching = load_entry(ROOT / "corpus" / "parity-mismatch-da0c9d4e06cd.json").case
    assert _known_to_fail(raising) is not None
    assert _known_to_fail(mismatching) is None


def test_a_short_run_samples_every_rank() -> None:
    lines: list[str] = []
    result = health_bench(cases=40, marks=(10, 40), seed=1, corpus=ROOT / "corpus", out=lines.append)
    assert result["cases"] == 40
    assert [m["cases"] for m in result["marks"]] == [10, 40]
    for mark in result["marks"]:
        assert [r["rank"] for r in mark["ranks"]] == [0, 1]
        for r in mark["ranks"]:
            assert r["pid"] > 0
            assert r["rss_mib"] > 0 and r["threads"] >= 1 and r["fds"] >= 3
            assert r["gpu_mib"] is None  # gloo: no GPU figure
    assert set(result["ratios"]) == {"0", "1"}
    assert result["new_failures"] == {}
    # Early marks see one-off growth (the first mesh of each shape adds gloo threads and
    # sockets), so only the form of the verdict is checked here, not its value.
    assert lines[-1].startswith(("health: ok", "health: drift in "))
    assert result["ok"] == lines[-1].startswith("health: ok")


def test_a_respawn_between_marks_is_counted_and_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    from fuzz import health
    from fuzz.model import Case, FaultAction, FaultBody
    from fuzz.properties import get_property

    fault = get_property("_fault")

    def scripted(props: Any, world_size: int, seed: int, cases: int, skipped: Any) -> Any:
        for i in range(1, cases + 1):
            action = FaultAction.EXIT if i == 15 else FaultAction.NONE  # rank 1 dies in case 15
            yield fault, Case(property="_fault", world_size=world_size, seed=0, body=FaultBody(action=action, rank=1))

    monkeypatch.setattr(health, "_round_robin", scripted)
    lines: list[str] = []
    result = health_bench(cases=40, marks=(10, 40), properties=["_fault"], corpus=None, out=lines.append)
    first, last = result["marks"]
    assert result["restarts"] == 1 and not result["same_processes"]
    assert [r["pid"] for r in first["ranks"]] != [r["pid"] for r in last["ranks"]]
    assert (first["cases_in_process"], last["cases_in_process"]) == (10, 25)
    assert list(result["new_failures"].values()) == [1]
    assert any("case 15: NEW failure crash:_fault" in line and "respawned" in line for line in lines)
    assert any("mark 40 samples processes that had run 25 cases" in line for line in lines)
    assert "not the same processes" in lines[-1]
