"""What a property is (:class:`Property`), apart from the registry that collects them.

The property modules (:mod:`fuzz.properties.parity` and its siblings) import this module, never
the package: the package imports them to fill its registry, so they would reach it again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fuzz.model import Body, Case
from fuzz.signature import Failure
from fuzz.verdict import Outcome, Stall


@dataclass(frozen=True)
class Property:
    name: str
    description: str
    cases: Callable[..., Any]  # (world_size=...) -> SearchStrategy[Case]
    judge: Callable[[Case, Outcome], Failure | None]
    features: Callable[[Case], list[str]]
    min_world_size: int = 1
    #: A deadlock its cases can be seen in before their deadline (fuzz.verdict.Stall).
    stall: Stall | None = None
    #: The body class its cases carry.
    body: type[Body] | None = None
    #: What renders a corpus entry of this property as a standalone script: "module:function"
    #: (imported when used), taking (entry, source name) and returning the script's text.
    repro: str | None = None
    #: Why repro refuses this property's entries on purpose, if it does.
    repro_refusal: str | None = None


def strategy(name: str) -> Callable[..., Any]:
    """``Property.cases`` for the strategy ``strategies.<name>``, imported when first drawn (the
    registry loads without Hypothesis strategies being built)."""

    def cases(*, world_size: int, **kwargs: Any) -> Any:
        import strategies

        return getattr(strategies, name)(world_size=world_size, **kwargs)

    return cases


__all__ = ["Property", "strategy"]
