"""How often strategies take a branch that meets a known torch bug, and how often they draw
the API options that are kept modest so that the common cases stay common.

Known bugs (records of :mod:`fuzz.known`) stay reachable, so a campaign notices when torch fixes
one, but rare: each hit costs a respawn of the pool or a whole case deadline. Each record says
its own odds; strategies ask :func:`keep_known`.
"""

from __future__ import annotations

from hypothesis import strategies as st

from fuzz.known import KnownBug, fixed

#: About one composition with replicate calls in this many gets replicate's options (its
#: DistributedDataParallel keywords, ignored_modules); the rest call replicate as before.
REPLICATE_OPTION_ODDS = 3
#: About one composition with checkpoint calls in this many gets checkpoint's options.
CHECKPOINT_OPTION_ODDS = 4
#: About one parity composition in this many that can take them gets fully_shard ignored_params.
IGNORED_PARAMS_ODDS = 4
#: About one parity composition in this many that can take it becomes an SPMD program
#: (fully_shard's dp_mesh_dims; :attr:`fuzz.model.Composition.spmd`), where torch has it.
SPMD_ODDS = 5


def one_in(draw: st.DrawFn, n: int) -> bool:
    """True about once in ``n`` draws. Hypothesis favours the bounds of a range, so the rare
    value sits in its middle."""
    return draw(st.integers(0, n - 1)) == n // 2


def keep_known(draw: st.DrawFn, bug: KnownBug) -> bool:
    """Whether a draw that meets ``bug`` keeps it: about once in ``bug.odds`` draws; always
    where the ranks run under the bug's fix (``explore --fix``, :func:`fuzz.known.fixed`), so
    that a campaign soaks the path the bug kept rare."""
    return one_in(draw, bug.odds) or bug.id in fixed()
