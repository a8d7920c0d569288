"""The registry of properties: one spec per property, from which everything else is derived.

A property is driver-side data (:class:`Property`): the body kind its cases carry (which names
the rank program that runs them, :attr:`fuzz.model.Body.PROGRAM`), a strategy for cases (given
the world size), a judge that turns an :class:`~fuzz.verdict.Outcome` into a
:class:`~fuzz.signature.Failure` or None, the features of a case (recorded with
``hypothesis.event`` so a run shows what it explored, and matched by the coverage items of
:mod:`fuzz.coverage`), a deadlock its ranks' stacks can show early, and the renderer that
turns a corpus entry into a standalone script (``repro``). The CLI's property list, campaigns,
the pytest plugin, the health run and ``repro`` all ask this registry.

Adding a property: a body in :mod:`fuzz.model` (its ``KIND`` and ``PROGRAM``), the rank program
in :mod:`fuzz._rank`, a module here that calls :func:`register`, and its name in :func:`_load`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fuzz.errors import InvalidArgument
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
    from fuzz.properties import fault, invalid, parity, state_dict, user  # noqa: F401 - registers on import
