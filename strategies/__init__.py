"""Hypothesis strategies that draw shardfuzz cases as pure data (no torch RNG is used).

Plural nouns, keyword-only options with ``max_*`` bounds, one error type
(:class:`fuzz.errors.InvalidArgument`) for bad arguments.
"""

from strategies._cases import (
    invalid_cases,
    metamorphic_cases,
    metamorphic_variants,
    mixed_precision_cases,
    parity_cases,
    trainings,
)
from strategies._compositions import compositions, meshes, mixed_precision_policies, reshard_values, wrappers
from strategies._state_dict import checkpoint_entries, dcp_cases, layouts, rank_orders, state_dict_cases
from strategies._trees import WIDTHS, leaves, module_trees, tied_trees
from strategies._user import user_cases, user_compositions, user_parity_cases, user_state_cases

__all__ = [
    "WIDTHS",
    "checkpoint_entries",
    "compositions",
    "dcp_cases",
    "invalid_cases",
    "layouts",
    "leaves",
    "meshes",
    "metamorphic_cases",
    "metamorphic_variants",
    "mixed_precision_cases",
    "mixed_precision_policies",
    "module_trees",
    "parity_cases",
    "rank_orders",
    "reshard_values",
    "state_dict_cases",
    "tied_trees",
    "trainings",
    "user_cases",
    "user_compositions",
    "user_parity_cases",
    "user_state_cases",
    "wrappers",
]

_public = {n for n in dir() if n.isidentifier() and not n.startswith("_")}
if _public != set(__all__):
    raise ImportError(f"strategies.__all__ is out of date: {sorted(_public ^ set(__all__))}")
