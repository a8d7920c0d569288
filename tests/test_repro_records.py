"""A record collapsed to the one field read of it (fuzz.repro.records)."""

from __future__ import annotations

from fuzz.repro.records import collapse_record, record_fields

JUDGE = """\
from dataclasses import dataclass, field


@dataclass()
class Failure:
    kind: object
    summary: object
    details: object = field(default_factory=dict)


@dataclass()
class Mismatch:
    index: object
    error: object = None


@dataclass
class Context:
    rank: object

    def mesh(self):
        return self.rank


def judge(got, want):
    bad = Mismatch(index=0, error=abs(got - want)) if got != want else None
    if bad is not None:
        return Failure('mismatch', f'{got} != {want}')


def attempt(got, want):
    failure = judge(got, want)
    return 'REPRODUCED: ' + failure.summary if failure is not None else 'PASS'
"""


def _run(code: str, got: float, want: float) -> str:
    space: dict[str, object] = {}
    exec(code, space)
    return space["attempt"](got, want)  # type: ignore[operator, no-any-return]


def test_a_record_read_for_one_field_becomes_that_field() -> None:
    keys = record_fields(JUDGE, frozenset())
    assert "Failure.summary" in keys and "Mismatch.index" in keys
    assert not any(k.startswith("Context.") for k in keys)  # a class with methods is no record
    out = collapse_record(JUDGE, "Failure.summary", frozenset())
    assert out is not None and "Failure(" not in out.split("def judge", 1)[1] and ".summary" not in out
    assert _run(out, 1.0, 2.0) == _run(JUDGE, 1.0, 2.0) == "REPRODUCED: 1.0 != 2.0"
    assert _run(out, 1.0, 1.0) == "PASS"
    # a field left to its default takes the default (a factory is called)
    details = collapse_record(JUDGE, "Failure.details", frozenset())
    assert details is not None and "return dict()" in details
    # frozen classes are left alone
    assert "Failure.summary" not in record_fields(JUDGE, frozenset({"Failure"}))
    assert collapse_record(JUDGE, "Failure.summary", frozenset({"Failure"})) is None


def test_a_record_built_with_star_arguments_or_without_the_field_is_not_collapsed() -> None:
    starred = JUDGE.replace("Failure('mismatch', f'{got} != {want}')", "Failure(*('mismatch', 'x'))")
    assert collapse_record(starred, "Failure.summary", frozenset()) is None
    missing = JUDGE.replace("Failure('mismatch', f'{got} != {want}')", "Failure(kind='mismatch', summary='x')")
    assert collapse_record(missing, "Failure.kind", frozenset()) is not None
    assert (
        collapse_record(JUDGE.replace("Mismatch(index=0, error=", "Mismatch(error="), "Mismatch.index", frozenset())
        is None
    )
