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


Message = Union[RunCase, Stop, Ready, CaseDone]
_TYPES: dict[str, type] = {"run": RunCase, "stop": Stop, "ready": Ready, "done": CaseDone}


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
