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

_public = {n for n in dir() if n.isidentifier() and not n.startswith("_")}
if _public != set(__all__):
    raise ImportError(f"strategies.__all__ is out of date: {sorted(_public ^ set(__all__))}")
