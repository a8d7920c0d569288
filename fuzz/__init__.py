"""shardfuzz: property-based fuzzing of PyTorch's composable distributed APIs.

Public names are re-exported here lazily: the rank side imports :mod:`fuzz.model` through this
package, and must not pull in Hypothesis or the driver.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Case": "fuzz.model",
    "case_from_json": "fuzz.model",
    "case_to_json": "fuzz.model",
    "SCHEMA_VERSION": "fuzz.model",
    "RankPool": "fuzz.pool",
    "Outcome": "fuzz.verdict",
    "OutcomeKind": "fuzz.verdict",
    "Property": "fuzz.properties",
    "all_properties": "fuzz.properties",
    "get_property": "fuzz.properties",
    "Failure": "fuzz.signature",
    "explore": "fuzz.explore",
    "run_case": "fuzz.explore",
    "Entry": "fuzz.corpus",
    "load_corpus": "fuzz.corpus",
    "load_entry": "fuzz.corpus",
    "save_entry": "fuzz.corpus",
    "ShardfuzzError": "fuzz.errors",
    "InvalidArgument": "fuzz.errors",
    "CaseError": "fuzz.errors",
    "PoolError": "fuzz.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'fuzz' has no attribute {name!r}")
