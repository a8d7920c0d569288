"""Typed messages between the driver and its ranks, one JSON object a line over a pipe.

Both sides import this module; it depends on the standard library alone. Nothing is pickled:
a rank that is confused or compromised can at worst send a malformed line, which the driver
reports as a crash of that rank.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Union


@dataclass(frozen=True)
class RunCase:
    """Driver -> rank: run this case (``case`` is :func:`fuzz.model.case_to_json` output)."""

    case_id: int
    case: dict[str, Any]
    type: str = "run"


@dataclass(frozen=True)
class Stop:
    """Driver -> rank: leave the process group and exit 0."""

    type: str = "stop"


@dataclass(frozen=True)
class Ready:
    """Rank -> driver: the process group is up."""

    rank: int
    pid: int
    versions: dict[str, str]
    type: str = "ready"


@dataclass(frozen=True)
class CaseDone:
    """Rank -> driver: the case ended on this rank, with an observation or an error."""

    case_id: int
    rank: int
    seconds: float
    observation: dict[str, Any] | None = None
    exc_type: str | None = None
    message: str | None = None
    traceback: str | None = None
    stats: dict[str, float] = field(default_factory=dict)
    type: str = "done"


@dataclass(frozen=True)
class RunScript:
    """Driver -> rank: run ``code`` (a script's source) as a fresh module, not as ``__main__``,
    and call its ``function(rank, world_size)``, which returns a line (the printed scripts'
    differential tests)."""

    case_id: int
    code: str
    function: str = "attempt"
    type: str = "script"


@dataclass(frozen=True)
class ScriptDone:
    """Rank -> driver: the script's function returned ``verdict``, or raised (``exc_type``...)."""

    case_id: int
    rank: int
    seconds: float
    verdict: str | None = None
    exc_type: str | None = None
    message: str | None = None
    traceback: str | None = None
    type: str = "script_done"


@dataclass(frozen=True)
class Settle:
    """Driver -> rank, once every rank sent :class:`ScriptDone`: check that the ranks are still in
    step on the default group, free what the script left (its process groups, dynamo's caches)."""

    case_id: int
    type: str = "settle"


@dataclass(frozen=True)
class Settled:
    """Rank -> driver: the answer to :class:`Settle`; ``error`` says why the rank is not fit for
    another script (the driver then spawns fresh ranks)."""

    case_id: int
    rank: int
    error: str | None = None
    type: str = "settled"


Message = Union[RunCase, Stop, Ready, CaseDone, RunScript, ScriptDone, Settle, Settled]
_TYPES: dict[str, type] = {
    "run": RunCase,
    "stop": Stop,
    "ready": Ready,
    "done": CaseDone,
    "script": RunScript,
    "script_done": ScriptDone,
    "settle": Settle,
    "settled": Settled,
}


def encode(msg: Message) -> bytes:
    return (json.dumps(asdict(msg), separators=(",", ":")) + "\n").encode()


def decode(line: bytes) -> Message:
    """Parse one line; raises ValueError on anything that is not a known message."""
    data = json.loads(line)
    if not isinstance(data, dict) or data.get("type") not in _TYPES:
        raise ValueError(f"not a shardfuzz message: {line[:200]!r}")
    cls = _TYPES[data["type"]]
    msg: Message = cls(**data)
    return msg
