"""Strategies for compositions: which modules get ``fully_shard``, with which options."""

from __future__ import annotations

from hypothesis import strategies as st

from fuzz.case import Composition, ModuleTree, ShardSpec, has_params
from strategies._validation import check_world_size


def reshard_values(world_size: int) -> st.SearchStrategy[bool | int]:
    """``reshard_after_forward`` values valid on a 1D mesh of ``world_size``: bools, and the
    non-trivial divisors of the world size."""
    check_world_size(world_size)
    divisors = [d for d in range(2, world_size) if world_size % d == 0]
    values: st.SearchStrategy[bool | int] = st.booleans()
    if divisors:
        values = st.one_of(values, st.sampled_from(divisors))
    return values


@st.composite
def compositions(draw: st.DrawFn, tree: ModuleTree, *, world_size: int) -> Composition:
    """``fully_shard`` on the root and on any subset of the other parameter-holding modules,
    children first, each with its own ``reshard_after_forward`` and shard dimension."""
    check_world_size(world_size)
    candidates = [p for p, n in tree.paths().items() if p and has_params(n)]
    chosen = draw(st.lists(st.sampled_from(candidates), unique=True)) if candidates else []
    # Deepest first, so children are sharded before their ancestors; the root comes last.
    order = [*sorted(chosen, key=lambda p: (-p.count("."), p)), ""]
    specs = [
        ShardSpec(
            path=p, reshard_after_forward=draw(reshard_values(world_size)), shard_dim=draw(st.sampled_from((0, 1)))
        )
        for p in order
    ]
    return Composition(shards=tuple(specs))
