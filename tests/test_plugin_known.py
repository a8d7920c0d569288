"""The pytest plugin expects the suite's own known torch bugs in any directory: a user's test
file with no corpus/ beside it does not fail on them (the README's pytest example)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from fuzz.corpus import builtin_corpus, load_entry
from fuzz.model import case_to_text

ROOT = Path(__file__).resolve().parent.parent
#: FSDP1 HYBRID_SHARD with a shard dimension of 1 (pytorch/pytorch#154888): a known mismatch.
ENTRY = ROOT / "corpus" / "parity-mismatch-da0c9d4e06cd.json"

TEST_FILE = """
import json
from fuzz.model import case_from_json

CASE = case_from_json(json.loads({case!r}))


def test_known(check_case):
    check_case(CASE)
"""


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    entry = load_entry(ENTRY)
    (tmp_path / "test_x.py").write_text(TEST_FILE.format(case=case_to_text(entry.case)))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_x.py", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_builtin_corpus_is_the_suites_own() -> None:
    own = builtin_corpus()
    assert own is not None and own.resolve() == (ROOT / "corpus").resolve()


def test_a_known_bug_is_expected_without_a_corpus_beside_the_test(tmp_path: Path) -> None:
    result = _run(tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "1 passed" in result.stdout


def test_a_missing_corpus_option_is_a_usage_error(tmp_path: Path) -> None:
    result = _run(tmp_path, "--shardfuzz-corpus", "no-such-dir")
    assert result.returncode != 0
    assert "--shardfuzz-corpus no-such-dir" in result.stdout + result.stderr
