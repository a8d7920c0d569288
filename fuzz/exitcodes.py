"""Exit codes of ``python -m fuzz``, shared by the command line and the several-pools parent.

0: it ran and nothing new failed (replay: the entry no longer fails); 1: a new failure was found
or reproduced; 2: bad arguments or an unreadable input, with a one-line message that names it;
3: a campaign ran no case at all (its budget ended before the ranks were ready), which is not a
success; 130: a campaign stopped by Ctrl-C (SIGINT), after saving what it found, as shells and CI
expect of an interrupted command. A campaign ended by SIGTERM (a scheduler, or the several-pools
parent's backstop at the end of the budget) exits as one whose budget ran out.
Imports nothing, so every module of the driver can import it at its top.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NO_CASES = 3
EXIT_INTERRUPTED = 130


def campaign_exit(*, new_failures: bool, cases: int, interrupted: bool) -> int:
    """A campaign's exit code. ``interrupted``: stopped by Ctrl-C (not SIGTERM)."""
    if interrupted:
        return EXIT_INTERRUPTED
    if new_failures:
        return EXIT_FAILED
    return EXIT_NO_CASES if cases == 0 else EXIT_OK


def no_cases_line(budget: float, pools: int = 1) -> str:
    """What a campaign that ran no case (exit 3) says on stderr, with one pool or several."""
    where = " in any pool" if pools > 1 else ""
    return (
        f"explore: error: no case ran within --budget {budget:g}s{where} (the ranks were still starting); "
        "give a longer --budget"
    )
