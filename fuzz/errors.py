"""The one error module of shardfuzz.

Every error raised because of user input (a bad argument, an unreadable corpus entry, a case
that fails validation) is a :class:`ShardfuzzError`, so callers can catch one type. Messages
name the argument and its value, say what is wrong and how to fix it.
"""

from __future__ import annotations


class ShardfuzzError(Exception):
    """Base class of every error shardfuzz raises on bad input."""


class InvalidArgument(ShardfuzzError, ValueError):
    """A function or command-line argument has a value that cannot be used."""


class CaseError(ShardfuzzError, ValueError):
    """A case (or a corpus entry holding one) does not validate.

    ``path`` names the offending field, e.g. ``case.tree.root.children[1].kind``.
    """

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        super().__init__(f"{path}: {message}")


class PoolError(ShardfuzzError, RuntimeError):
    """The rank pool could not be started or used (not a failure of a case)."""
