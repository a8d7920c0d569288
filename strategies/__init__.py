"""Hypothesis strategies that draw shardfuzz cases as pure data (no torch RNG is used).

Plural nouns, keyword-only options with ``max_*`` bounds, one error type
(:class:`fuzz.errors.InvalidArgument`) for bad arguments.
"""

from strategies._cases import parity_cases, trainings
from strategies._compositions import compositions, reshard_values
from strategies._trees import WIDTHS, leaves, module_trees

__all__ = [
    "WIDTHS",
    "compositions",
    "leaves",
    "module_trees",
    "parity_cases",
    "reshard_values",
    "trainings",
]

_defined = {name for name in dir() if not name.startswith("_")} - {"annotations"}
if _defined - {"_cases", "_compositions", "_trees", "_validation"} != set(__all__):
    raise ImportError(f"strategies.__all__ is out of date: {sorted(_defined ^ set(__all__))}")
