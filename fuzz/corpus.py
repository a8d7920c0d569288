"""The corpus: one JSON file per distinct failure, written atomically, never unpickled.

An entry holds the minimal case, its failure (kind, signature, summary, every rank's account),
the versions it was found with, how many re-runs reproduced it, and how often it was hit. Two
failures with one signature are one entry: the smaller case is kept and the count goes up.
An entry marked ``known`` stands for a bug in torch itself (``upstream`` names the issue where
there is one): hitting it again is reported but is not a new failure.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import hashlib
import json
import os
import platform
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fuzz import known
from fuzz.errors import CaseError, ShardfuzzError
from fuzz.model import Case, case_from_json, case_to_json
from fuzz.signature import Failure, Signature, same_bug

ENTRY_SCHEMA = 1
STATUSES = ("new", "flaky", "known")


@dataclass(frozen=True)
class Entry:
    case: Case
    kind: str
    signature: str
    summary: str
    details: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    backend: str = "gloo"
    device_kind: str = "cpu"
    found_at: str = ""
    reruns: int = 0
    reproduced: int = 0
    count: int = 1
    status: str = "new"
    upstream: str | None = None
    #: The record of :mod:`fuzz.known` this ``known`` entry stands for (set by a person); its
    #: upstream reference then comes from the record, the one place it is kept.
    bug: str | None = None
    #: Other signatures of the same bug, set by a person: where another backend or torch version
    #: meets it in another innermost frame (e.g. a foreach kernel on CUDA, a loop on CPU).
    aliases: tuple[str, ...] = ()

    @property
    def signatures(self) -> frozenset[str]:
        """The signature and its aliases: a failure with any of them is this entry's bug."""
        return frozenset((self.signature, *self.aliases))

    @property
    def file_name(self) -> str:
        digest = hashlib.sha1(self.signature.encode()).hexdigest()[:12]
        return f"{self.case.property}-{self.kind}-{digest}.json"

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": ENTRY_SCHEMA,
            "property": self.case.property,
            "kind": self.kind,
            "signature": self.signature,
            "summary": self.summary,
            "status": self.status,
            **({"bug": self.bug} if self.bug else {"upstream": self.upstream}),
            **({"aliases": list(self.aliases)} if self.aliases else {}),
            "count": self.count,
            "reruns": self.reruns,
            "reproduced": self.reproduced,
            "size": {"nodes": self.case.size[0], "steps": self.case.size[1]},
            "backend": self.backend,
            "world_size": self.case.world_size,
            "device_kind": self.device_kind,
            "versions": self.versions,
            "found_at": self.found_at,
            "case": case_to_json(self.case),
            "details": self.details,
        }


def entry_from_failure(
    case: Case,
    failure: Failure,
    *,
    versions: dict[str, str],
    backend: str,
    device_kind: str,
    reruns: int,
    reproduced: int,
) -> Entry:
    status = "new" if reproduced == reruns else "flaky"
    return Entry(
        case=case,
        kind=failure.kind,
        signature=failure.signature,
        summary=failure.summary,
        details=failure.details,
        versions={**versions, **_driver_versions()},
        backend=backend,
        device_kind=device_kind,
        found_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        reruns=reruns,
        reproduced=reproduced,
        status=status,
    )


def _driver_versions() -> dict[str, str]:
    import hypothesis

    return {"hypothesis": hypothesis.__version__, "python": platform.python_version()}


def load_entry(path: str | os.PathLike[str]) -> Entry:
    """Read and validate one entry; raises ShardfuzzError naming the file and the problem."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ShardfuzzError(f"{p}: cannot read corpus entry: {e}") from None
    if not isinstance(data, dict):
        raise ShardfuzzError(f"{p}: a corpus entry is a JSON object, got {type(data).__name__}")
    schema = data.get("schema")
    if isinstance(schema, int) and schema > ENTRY_SCHEMA:
        raise ShardfuzzError(
            f"{p}: entry schema {schema} is newer than this shardfuzz ({ENTRY_SCHEMA}); upgrade shardfuzz"
        )
    if schema != ENTRY_SCHEMA:
        raise ShardfuzzError(f"{p}: unsupported entry schema {schema!r}; expected {ENTRY_SCHEMA}")
    try:
        case = case_from_json(data.get("case"))
    except CaseError as e:
        raise ShardfuzzError(f"{p}: {e}") from None
    for name in ("kind", "signature"):
        if not isinstance(data.get(name), str):
            raise ShardfuzzError(f"{p}: field {name!r} must be a string, got {data.get(name)!r:.80}")
    aliases = data.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise ShardfuzzError(f"{p}: field 'aliases' must be a list of signatures, got {aliases!r:.80}")
    status = data.get("status", "new")
    if status not in STATUSES:
        raise ShardfuzzError(f"{p}: status {status!r} is not one of {STATUSES}")
    bug = data.get("bug")
    upstream = data.get("upstream")
    if bug is not None:
        if bug not in known.BUGS:
            raise ShardfuzzError(f"{p}: field 'bug' names no known bug: {bug!r:.80} (see fuzz/known.py)")
        record = known.BUGS[bug]
        upstream = record.upstream if record.upstream != known.NONE_FOUND else None
    return Entry(
        case=case,
        kind=data["kind"],
        signature=data["signature"],
        summary=str(data.get("summary", "")),
        details=data.get("details") or {},
        versions=data.get("versions") or {},
        backend=str(data.get("backend", "gloo")),
        device_kind=str(data.get("device_kind", "cpu")),
        found_at=str(data.get("found_at", "")),
        reruns=_count(p, data, "reruns", 0),
        reproduced=_count(p, data, "reproduced", 0),
        count=_count(p, data, "count", 1),
        status=status,
        upstream=upstream,
        bug=bug,
        aliases=tuple(aliases),
    )


def _count(path: Path, data: dict[str, Any], name: str, default: int) -> int:
    value = data.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ShardfuzzError(f"{path}: field {name!r} must be a non-negative integer, got {value!r:.80}")
    return value


def load_corpus(directory: str | os.PathLike[str]) -> tuple[list[tuple[Path, Entry]], list[str]]:
    """Every readable entry in ``directory``, and one message per file that could not be read."""
    d = Path(directory)
    entries: list[tuple[Path, Entry]] = []
    problems: list[str] = []
    if not d.is_dir():
        return entries, problems
    for path in sorted(d.glob("*.json")):
        try:
            entries.append((path, load_entry(path)))
        except ShardfuzzError as e:
            problems.append(str(e))
    return entries, problems


def _condition_holds(entry: Entry, case: Case | None) -> bool:
    """False where the entry's bug is ``conditional`` and ``case`` (when given) does not meet
    its condition: the same exception elsewhere is another bug. False too where the ranks run
    under the bug's fix (:func:`fuzz.known.fixed`): what still fails there is not that bug."""
    record = known.BUGS.get(entry.bug or "")
    if record is not None and record.id in known.fixed():
        return False
    return record is None or not record.conditional or case is None or known.meets(case, record)


class CorpusIndex:
    """Which corpus entry a failure signature belongs to.

    Any entry takes its own signature and aliases. A ``known`` entry (a torch bug) also takes
    the signatures :func:`fuzz.signature.same_bug` calls the same bug: met through another
    property, or a mismatch in a case that meets its bug's conditions and others too. Those are
    reported as the known bug and not saved again.
    """

    def __init__(self, entries: list[tuple[Path, Entry]]) -> None:
        #: Entries by each of their signatures; more than one where a conditional bug's entry
        #: shares its signature with another failure's (:func:`save_entry`).
        self._exact: dict[str, list[tuple[Path, Entry]]] = {}
        for p, e in sorted(entries, key=lambda pe: pe[1].status != "known"):  # a known bug's first
            for sig in e.signatures:
                self._exact.setdefault(sig, []).append((p, e))
        self._known = [(sig, p, e) for p, e in entries if e.status == "known" for sig in sorted(e.signatures)]

    def match(self, signature: str, case: Case | None = None, kind: str = "") -> tuple[Path, Entry] | None:
        """The entry a failure signed ``signature`` (of ``kind``, met in ``case``) is counted
        against, or None. Beyond signatures, a mismatch of values in a case that meets the
        condition of a known bug that shows as a mismatch (:func:`fuzz.known.explains`) is
        counted against that bug's entry, preferring one of the same property. A violated
        contract (``mismatch:PROP:contract-*``: the state or dtype an API documents, checked on
        the rank) is not a wrong value: it matches by signature, or a conditional bug's entry
        with the same contract in a case that meets its condition, so that it is not taken for
        a numerics bug the case also meets."""
        for hit in self._exact.get(signature, []):
            if _condition_holds(hit[1], case):
                return hit
        for sig, path, entry in self._known:
            if same_bug(sig, signature) and _condition_holds(entry, case):
                return path, entry
        found = Signature.parse(signature)
        if case is not None and found is not None and found.is_contract():
            # A contract is the API's, the property only the scenario: a conditional bug's
            # entry takes the same violated contract met through another property in a case
            # that meets the bug's condition.
            for sig, path, entry in self._known:
                record, theirs = known.BUGS.get(entry.bug or ""), Signature.parse(sig)
                if record is None or not record.conditional or theirs is None or not theirs.is_contract():
                    continue
                if theirs.check == found.check and _condition_holds(entry, case):
                    return path, entry
        if case is not None and not (found is not None and found.is_contract()):
            bugs = {b.id for b in known.explains(case, kind, found.check if found else "")}
            candidates = [(p, e) for _, p, e in self._known if e.bug in bugs]
            candidates.sort(key=lambda pe: pe[1].case.property != case.property)
            if candidates:
                return candidates[0]
        return None

    def known(self, signature: str, case: Case | None = None, kind: str = "") -> Entry | None:
        """The ``known`` entry whose bug a failure signed ``signature`` is, or None."""
        hit = self.match(signature, case, kind)
        return hit[1] if hit is not None and hit[1].status == "known" else None


class KnownBugs(Mapping[str, str]):
    """Signature -> upstream issue (or "no upstream issue") of the ``known`` corpus entries, where
    a lookup also takes any signature :func:`fuzz.signature.same_bug` ties to one of them.
    Iterating gives the entries' own signatures and aliases."""

    def __init__(self, entries: list[tuple[Path, Entry]]) -> None:
        known = [(p, e) for p, e in entries if e.status == "known"]
        self._index = CorpusIndex(known)
        self._own = {sig: e.upstream or "no upstream issue" for _, e in known for sig in e.signatures}

    def __getitem__(self, signature: str) -> str:
        entry = self._index.known(signature)
        if entry is None:
            raise KeyError(signature)
        return entry.upstream or "no upstream issue"

    def __iter__(self) -> Iterator[str]:
        return iter(self._own)

    def __len__(self) -> int:
        return len(self._own)

    def explain(self, signature: str, case: Case | None = None, kind: str = "") -> str | None:
        """The upstream issue (or "no upstream issue") of the known bug a failure is, by its
        signature or, for a mismatch, by the known bug its case meets (CorpusIndex.match);
        None if it is no known bug."""
        entry = self._index.known(signature, case, kind)
        return None if entry is None else entry.upstream or "no upstream issue"


def _readable(path: Path) -> Entry | None:
    """The entry at ``path``, or None where there is none or it cannot be read."""
    if not path.exists():
        return None
    try:
        return load_entry(path)
    except ShardfuzzError:
        return None


def save_entry(directory: str | os.PathLike[str], entry: Entry) -> tuple[Path, Entry]:
    """Write ``entry``, merging with an existing entry of the same signature.

    The smaller case is kept (fewer nodes, then fewer steps), counts add up, and a ``known``
    status or upstream reference set by a person is never overwritten. The write is atomic.
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    path = d / entry.file_name
    with _locked(d):
        old = _readable(path)
        if old is not None and old.signature == entry.signature and not _condition_holds(old, entry.case):
            # The entry there is of a conditional bug whose condition this case does not meet:
            # another failure with the same signature, kept beside it (one file for all of them).
            path = path.with_name(f"{path.stem}-not-{hashlib.sha1((old.bug or '').encode()).hexdigest()[:6]}.json")
            old = _readable(path)
        if old is not None and old.signature == entry.signature:
            keep = entry if entry.case.size < old.case.size else old
            entry = Entry(
                **{
                    **keep.__dict__,
                    "count": old.count + entry.count,
                    "status": old.status if old.status == "known" else keep.status,
                    "upstream": old.upstream or entry.upstream,
                    "bug": old.bug or entry.bug,
                    "aliases": old.aliases or entry.aliases,
                }
            )
        _atomic_write(path, json.dumps(entry.to_json(), indent=1, sort_keys=True) + "\n")
    return path, entry


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """An exclusive lock on the corpus directory itself (no lock file is left in it), so that
    campaigns sharing a corpus (``--pools``, several hosts on one filesystem) do not lose each
    other's read-modify-write of one entry. Where the directory cannot be locked (a filesystem
    without flock), the write goes ahead unlocked: each write is still atomic."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        yield
        return
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def builtin_corpus() -> Path | None:
    """The suite's own corpus (its known torch bugs): ``corpus/`` beside the package in a source
    checkout or an editable install, else where a wheel installs it (``share/shardfuzz/corpus``
    under the environment's data directory); None if neither exists."""
    import sysconfig

    for candidate in (
        Path(__file__).resolve().parent.parent / "corpus",
        Path(sysconfig.get_path("data")) / "share" / "shardfuzz" / "corpus",
    ):
        if candidate.is_dir() and any(candidate.glob("*.json")):
            return candidate
    return None
