"""What a new user meets: the live status line, failures the corpus cannot take, counts of known
entries, and what replay says about a known bug."""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

import fuzz.explore
from fuzz.cli import _full_summary
from fuzz.corpus import Entry, load_entry
from fuzz.explore import explore
from fuzz.pool import RankPool
from fuzz.properties import get_property
from fuzz.signature import Failure
from fuzz.status import StatusLine, fit_line
from tests.conftest import run_cli

SIGNATURES = [
    "exception:mixed_precision:builtins.AttributeError@torch/distributed/fsdp/_fully_shard/_fsdp_param.py:"
    "to_accumulated_grad_if_needed x3",
    "exception:mixed_precision:builtins.RuntimeError@torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:"
    "foreach_reduce x14",
]


def test_the_status_line_fits_the_width_dropping_the_least_important_first() -> None:
    head, extras = "[1:04 / 2:00] cases 115", ["(1.8/s)", "restarts 13"]
    full = fit_line(head, extras, SIGNATURES, None)
    assert full == f"{head} (1.8/s) restarts 13 failures: {', '.join(SIGNATURES)}"
    assert fit_line(head, extras, SIGNATURES, len(full)) == full
    at_79 = fit_line(head, extras, SIGNATURES, 79)
    assert len(at_79) <= 79
    assert at_79.startswith(f"{head} (1.8/s) restarts 13 failures: 2 (exception:mixed_pr")
    assert at_79.endswith("...)")
    # Narrower: the restarts go, then the rate; the elapsed time, cases and failures stay.
    assert fit_line(head, extras, SIGNATURES, 50) == f"{head} (1.8/s) failures: 2"
    assert fit_line(head, extras, SIGNATURES, 38) == f"{head} failures: 2"
    assert len(fit_line(head, extras, SIGNATURES, 20)) <= 20
    assert fit_line(head, extras, [], 46) == f"{head} (1.8/s) failures: none"


def test_on_a_terminal_the_line_is_redrawn_within_its_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "get_terminal_size", lambda *a, **k: os.terminal_size((80, 24)))
    out = io.StringIO()
    status = StatusLine(out, tty=True, every_tty=0.0)
    line = " ".join(["[0:01 / 2:00] cases 1", *SIGNATURES])

    def make(width: int | None) -> str:
        return line if width is None else line[:width]

    for _ in range(3):
        assert status.show(make)
    status.note("explore: a message")
    status.show(make)
    status.end()
    text = out.getvalue()
    draws = text.split("\r\x1b[K")[1:]
    assert len(draws) == 5  # three draws, the note (which erases the line first), one more draw
    assert all(len(d.rstrip("\n")) <= 79 for d in draws)  # never the last column: no wrap
    assert "explore: a message\n" in text and text.endswith("\n")


def test_off_a_terminal_whole_lines_are_printed_rarely() -> None:
    out = io.StringIO()
    status = StatusLine(out, tty=False, every_plain=3600.0)
    widths: list[int | None] = []

    def make(width: int | None) -> str:
        widths.append(width)
        return "the whole line"

    assert status.show(make)
    assert not status.show(make)  # within the interval: nothing
    assert status.show(make, force=True)
    assert out.getvalue() == "the whole line\nthe whole line\n" and widths == [None, None]


def test_replay_prints_an_exception_message_in_full() -> None:
    message = "shapes differ: " + " ".join(f"dim{i}=7" for i in range(60)) + " (end of message)"
    failure = Failure(
        "exception",
        "exception:parity:builtins.RuntimeError@torch/x.py:f",
        f"rank 0 raised builtins.RuntimeError: {message[:300]}",
        {"ranks": [{"rank": 0, "exc_type": "builtins.RuntimeError", "message": message}]},
    )
    assert _full_summary(failure) == f"rank 0 raised builtins.RuntimeError: {message}"


def _first_fault_entry(pool: RankPool, corpus: Path, **kwargs: Any) -> Any:
    return explore(
        pool, [get_property("_fault")], budget=120, max_examples=2, seed=1, corpus=corpus, reruns=1, **kwargs
    )


def test_an_entry_the_corpus_cannot_take_is_kept_elsewhere_and_counts_grow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHARDFUZZ_FAULT_ACTIONS", "raise")
    corpus, fallback = tmp_path / "corpus", tmp_path / "report" / "unsaved-corpus"
    real_save = fuzz.explore.save_entry

    def disk_full(directory: Any, entry: Entry) -> Any:
        if Path(directory) == corpus:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_save(directory, entry)

    notes: list[str] = []
    with RankPool(world_size=2, deadline=60) as pool:
        with monkeypatch.context() as m:
            m.setattr(fuzz.explore, "save_entry", disk_full)
            progress = _first_fault_entry(pool, corpus, fallback=[fallback], on_note=notes.append)
        (found,) = progress.found.values()
        assert found.fallback and found.path is not None and found.path.parent == fallback
        assert load_entry(found.path).signature == found.failure.signature
        summary = progress.summary(seed=1, backend="gloo", world_size=2)
        assert summary["corpus_fallback"] == {
            "directory": str(fallback),
            "reason": f"--corpus {corpus}: {os.strerror(errno.ENOSPC)}",
        }
        (failure,) = summary["failures"]
        assert failure["entry"] == str(found.path) and failure["entry_fallback"] and not failure["in_corpus"]
        assert len(notes) == 1 and str(fallback) in notes[0] and "--corpus" in notes[0]

        # The entry, now in the corpus and marked as a known bug: a campaign that meets it again
        # reports it as known, in the corpus, and counts its hits in its own summary: the entry's
        # file (under version control) is left byte for byte as it was.
        corpus.mkdir()
        path = corpus / found.path.name
        data = json.loads(found.path.read_text())
        data.update(status="known", upstream="pytorch/pytorch#1", count=5)
        before = json.dumps(data, indent=1, sort_keys=True) + "\n"
        path.write_text(before)
        again = _first_fault_entry(pool, corpus)
    (hit,) = again.found.values()
    assert hit.known and hit.hits >= 1
    assert path.read_text() == before and load_entry(path).count == 5
    (failure,) = again.summary(seed=1, backend="gloo", world_size=2)["failures"]
    assert failure["in_corpus"] and failure["seen_before"] and failure["known"] and failure["hits"] == hit.hits
    assert failure["upstream_url"] == "https://github.com/pytorch/pytorch/issues/1"
    assert failure["entry_summary"] == data["summary"]
    assert failure["commands"] == [f"python -m fuzz replay {path}", f"python -m fuzz repro {path} -o repro.py"]
    assert not list(corpus.glob(".*")), "a temporary file was left in the corpus"


def test_replay_of_a_known_entry_says_so(tmp_path: Path) -> None:
    env = {"SHARDFUZZ_FAULT_ACTIONS": "raise"}
    corpus = tmp_path / "corpus"
    args = ("explore", "--property", "_fault", "--max-examples", "2", "--seed", "1", "--no-database", "--reruns", "1")
    assert run_cli(*args, "--corpus", str(corpus), env=env).returncode == 1
    (path,) = corpus.glob("*.json")
    data = json.loads(path.read_text())
    data.update(status="known", upstream="pytorch/pytorch#154888", summary="A torch bug, described in full.")
    path.write_text(json.dumps(data))
    result = run_cli("replay", str(path))
    assert result.returncode == 1, result.stdout + result.stderr
    assert (
        "a known torch bug, upstream pytorch/pytorch#154888 (https://github.com/pytorch/pytorch/issues/154888): "
        "A torch bug, described in full." in result.stdout
    )


def test_a_campaign_that_ran_no_case_is_not_a_success(tmp_path: Path) -> None:
    # A budget that ends before the ranks are ready: no case runs, and the exit code says so.
    result = run_cli("explore", "--budget", "0.5", "--no-database", "--corpus", str(tmp_path / "c"), timeout=120)
    assert result.returncode == 3, result.stderr
    (line,) = [x for x in result.stderr.splitlines() if "error:" in x]
    assert "no case ran within --budget" in line


def test_the_status_line_says_what_a_campaign_waits_for_before_its_first_case() -> None:
    from fuzz.explore import STARTING_RANKS, Progress

    progress = Progress(started=0.0, budget=120.0)
    progress.waiting = STARTING_RANKS
    assert STARTING_RANKS in progress.line(width=200) and "cases" not in progress.line()
    progress.cases, progress.waiting = 1, ""
    assert "cases 1" in progress.line()
    assert progress.summary(seed=1, backend="gloo", world_size=2)["first_case_s"] is None
