"""How often strategies take a branch that meets a known torch bug.

Known bugs (corpus entries with status ``known``) stay reachable, so a campaign notices when
torch fixes one, but rare: each hit costs a respawn of the pool or a whole case deadline.
"""

from __future__ import annotations

from hypothesis import strategies as st

#: One draw in this many takes a branch that meets a known bug.
KNOWN_BUG_ODDS = 16


def one_in(draw: st.DrawFn, n: int) -> bool:
    """True about once in ``n`` draws. Hypothesis favours the bounds of a range, so the rare
    value sits in its middle."""
    return draw(st.integers(0, n - 1)) == n // 2
