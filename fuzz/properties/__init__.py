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
in :mod:`fuzz._rank`, a module here whose ``PROPERTIES`` tuple holds its :class:`Property` (built
from :mod:`fuzz.properties.spec`, never from this package, which imports the module), and the
module's name in :data:`MODULES`.
"""

from __future__ import annotations

import importlib

from fuzz.errors import InvalidArgument
from fuzz.properties.spec import Property, strategy

_REGISTRY: dict[str, Property] = {}


#: The modules that define properties, each in its ``PROPERTIES`` tuple.
MODULES = ("fault", "invalid", "parity", "state_dict", "user")


def _register(prop: Property) -> Property:
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
    if _REGISTRY:
        return
    for module in MODULES:
        for prop in importlib.import_module(f"fuzz.properties.{module}").PROPERTIES:
            _register(prop)


__all__ = ["MODULES", "Property", "all_properties", "get_property", "strategy"]
