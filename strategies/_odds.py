"""How often strategies take a branch that meets a known torch bug.

Known bugs (corpus entries with status ``known``) stay reachable, so a campaign notices when
torch fixes one, but rare: each hit costs a respawn of the pool or a whole case deadline.
"""

from __future__ import annotations

from hypothesis import strategies as st

#: One draw in this many takes a branch that meets a known bug.
KNOWN_BUG_ODDS = 16
#: The same for a known deadlock, which costs a whole case deadline (60 s by default) per hit:
#: at 1 in 16 the set_state_dict deadlock took 360 of the state_dict property's 396 s in a
#: 10-minute campaign.
KNOWN_HANG_ODDS = 64


def one_in(draw: st.DrawFn, n: int) -> bool:
    """True about once in ``n`` draws. Hypothesis favours the bounds of a range, so the rare
    value sits in its middle."""
    return draw(st.integers(0, n - 1)) == n // 2
