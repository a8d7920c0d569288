"""Exit codes of ``python -m fuzz``, shared by the command line and the several-pools parent.

0: it ran and nothing new failed (replay: the entry no longer fails); 1: a new failure was found
or reproduced; 2: bad arguments or an unreadable input, with a one-line message that names it.
Imports nothing, so every module of the driver can import it at its top.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
