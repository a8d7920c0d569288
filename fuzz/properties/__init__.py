"""The registry of properties: each names a family of cases and how to judge their outcomes.

A property is driver-side data: a strategy for cases (given the world size), a judge that
turns an :class:`~fuzz.pool.Outcome` into a :class:`~fuzz.signature.Failure` or None, and the
features of a case (recorded with ``hypothesis.event`` so a run shows what it explored).
What a case does on the ranks is chosen by its body, in :mod:`fuzz._rank.programs`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fuzz.case import Case
from fuzz.errors import InvalidArgument
from fuzz.pool import Outcome, Stall
from fuzz.signature import Failure


@dataclass(frozen=True)
class Property:
    name: str
    description: str
    cases: Callable[..., Any]  # (world_size=...) -> SearchStrategy[Case]
    judge: Callable[[Case, Outcome], Failure | None]
    features: Callable[[Case], list[str]]
    min_world_size: int = 1
    #: A deadlock its cases can be seen in before their deadline (fuzz.pool.Stall).
    stall: Stall | None = None


def strategy(name: str) -> Callable[..., Any]:
    """``Property.cases`` for the strategy ``strategies.<name>``, imported when first drawn (the
    registry loads without Hypothesis strategies being built)."""

    def cases(*, world_size: int, **kwargs: Any) -> Any:
        import strategies

        return getattr(strategies, name)(world_size=world_size, **kwargs)

    return cases


_REGISTRY: dict[str, Property] = {}


def register(prop: Property) -> Property:
    if prop.name in _REGISTRY:
        raise ValueError(f"property {prop.name!r} is registered twice")
    _REGISTRY[prop.name] = prop
    return prop


def get_property(name: str) -> Property:
    _load()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise InvalidArgument(
            f"--property {name!r} is not a property; run `python -m fuzz properties` for the list"
        ) from None


def all_properties() -> list[Property]:
    _load()
    return [p for name, p in sorted(_REGISTRY.items()) if not name.startswith("_")]


def _load() -> None:
    from fuzz.properties import fault, invalid, parity, state_dict  # noqa: F401 - registers on import
