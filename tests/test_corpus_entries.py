"""Every corpus entry is a regression test, one test id per file name.

The corpus is ``--shardfuzz-corpus`` (default ``corpus/`` under the rootdir), the directory
whose ``known`` entries the ``check_case`` fixture also treats as expected failures.

- An entry with status ``known`` is a torch bug: a strict expected failure (its case must still
  fail with its signature), so the test fails once torch fixes the bug and the entry can go.
  A known entry that fails with another signature fails the test: the bug changed.
- Any other entry (``new``, ``flaky``) must pass on replay: the bug it recorded is fixed, and
  the entry guards against its return.
- An entry that cannot be read fails its test with the file and the reason.
- Entries need the session pool's world size and backend; others are skipped, saying which
  option runs them.

The first test id, ``directory``, checks that the corpus directory itself can be listed, so an
empty corpus still has one meaningful test and a mistyped ``--shardfuzz-corpus`` fails.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from fuzz import known
from fuzz.corpus import load_entry
from fuzz.errors import ShardfuzzError
from fuzz.signature import Signature
from tests.conftest import missing_api


def _corpus_dir(config: pytest.Config) -> Path:
    return Path(config.rootpath) / (config.getoption("shardfuzz_corpus") or "corpus")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "corpus_item" not in metafunc.fixturenames:
        return
    corpus = _corpus_dir(metafunc.config)
    params = [pytest.param(None, id="directory")]
    paths = sorted(corpus.glob("*.json")) if corpus.is_dir() else []
    for path in paths:
        marks = []
        try:
            entry = load_entry(path)
        except ShardfuzzError:
            entry = None  # reported by the test itself
        if entry is not None and entry.status == "known":
            marks.append(
                pytest.mark.xfail(
                    strict=True,
                    raises=AssertionError,
                    reason=f"upstream {entry.upstream or '(no issue recorded)'}: known torch bug {entry.signature}",
                )
            )
        params.append(pytest.param(path, id=path.name, marks=marks))
    metafunc.parametrize("corpus_item", params)


def test_corpus(corpus_item: Path | None, request: pytest.FixtureRequest) -> None:
    if corpus_item is None:
        _check_directory(_corpus_dir(request.config))
        return
    try:
        entry = load_entry(corpus_item)
    except ShardfuzzError as e:
        pytest.fail(f"unreadable corpus entry: {e}", pytrace=False)
    record = known.BUGS.get(entry.bug or "")
    if entry.status == "known" and record is not None and not known.present(record, torch.__version__):
        when = f"fixed in torch {record.fixed_in}" if record.fixed_in else f"new in torch {record.introduced_in}"
        pytest.skip(f"{corpus_item.name}: {record.id} is {when} (this is {torch.__version__})")
    missing = missing_api(entry.case)
    if missing:
        pytest.skip(f"{corpus_item.name} is {missing}")
    pool = request.getfixturevalue("rank_pool")
    options = []
    if entry.case.world_size != pool.world_size:
        options.append(f"--shardfuzz-world-size {entry.case.world_size}")
    if entry.backend != pool.backend:
        options.append(f"--shardfuzz-backend {entry.backend}")
    if options:
        pytest.skip(
            f"{corpus_item.name} was found on {entry.case.world_size} ranks with {entry.backend}; "
            f"this session's pool has {pool.world_size} with {pool.backend} (run with {' '.join(options)})"
        )
    if entry.status == "known":
        _expect_known_failure(entry, pool, corpus_item)
    else:
        request.getfixturevalue("check_case")(entry.case)


def _check_directory(corpus: Path) -> None:
    assert corpus.is_dir(), f"corpus directory {corpus} does not exist or is not a directory (--shardfuzz-corpus)"
    try:
        next(corpus.iterdir(), None)
    except OSError as e:
        pytest.fail(f"corpus directory {corpus} cannot be listed: {e}", pytrace=False)


def _expect_known_failure(entry: Any, pool: Any, path: Path) -> None:
    """Raise AssertionError (the expected failure) iff the known bug still shows; check_case would
    swallow it, so the case is run and judged here."""
    from fuzz.explore import run_case
    from fuzz.properties import get_property

    failure = run_case(pool, get_property(entry.case.property), entry.case)
    if failure is None:
        return  # torch fixed it: the strict xfail turns this pass into a failure
    parsed = Signature.parse(failure.signature)
    check = parsed.check if parsed is not None else ""
    others = [b.id for b in known.explains(entry.case, failure.kind, check) if b.id != entry.bug]
    if failure.signature not in entry.signatures and others:
        # the case meets another known bug's condition too, and on this torch shows as that one
        raise AssertionError(f"{entry.signature} shows as the known {others[0]} here: {failure.summary}")
    if failure.signature not in entry.signatures:
        pytest.fail(
            f"{path.name}: the known bug {entry.signature} now fails as {failure.signature}: {failure.summary}",
            pytrace=False,
        )
    raise AssertionError(f"{entry.signature} still reproduces ({entry.upstream}): {failure.summary}")
