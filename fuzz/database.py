"""The Hypothesis example database that campaigns and pytest runs share.

A campaign (``python -m fuzz explore``) keeps the choice sequence of every failure it shrinks in
a Hypothesis ``DirectoryBasedExampleDatabase``: ``--database DIR``, else ``$SHARDFUZZ_DATABASE``,
else ``.shardfuzz/hypothesis-db``. The next campaign, or a pytest test decorated with
:func:`campaign_examples`, replays those first (Hypothesis's ``reuse`` phase). Several hosts or
runs can point at one directory. The corpus (:mod:`fuzz.corpus`) stays the durable, readable
record; the database is a cache that Hypothesis prunes itself (an entry that no longer fails is
deleted when it is replayed) and that a change of strategies or Hypothesis version invalidates.

Keys. Hypothesis files a test's entries under a digest of the test's source, so two different
test functions never see each other's entries. Campaign chunks and pytest tests draw their cases
from the same property strategy, so a choice sequence saved by one decodes to the same case in
the other (``@given(strategy)`` and ``data.draw(strategy)`` make the same choices); what they need
is one key. :func:`database_key` is that key, per property and world size, and
:func:`use_database_key` puts it on a test as ``_hypothesis_internal_database_key``, the
attribute Hypothesis reads before falling back to its digest. Hypothesis has no public setter;
``hypothesis.find`` sets the same attribute, and so do other tools built on Hypothesis. The world
size is part of the key because strategies take it as a parameter: a sequence drawn for 2 ranks
decodes to another case for 4 ranks, which would pass there and be deleted as fixed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from hypothesis import settings
from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase
from hypothesis.errors import InvalidArgument as HypothesisInvalidArgument

from fuzz.errors import InvalidArgument

DEFAULT_DIRECTORY = Path(".shardfuzz") / "hypothesis-db"
ENV_VAR = "SHARDFUZZ_DATABASE"
#: Bumped when the meaning of saved choice sequences changes in a way Hypothesis cannot see.
KEY_VERSION = 1
#: The world size of the default pool (``--world-size`` and ``--shardfuzz-world-size``).
DEFAULT_WORLD_SIZE = 2

T = TypeVar("T", bound=Callable[..., Any])


def default_directory() -> Path:
    """``$SHARDFUZZ_DATABASE`` if set (and not empty), else ``.shardfuzz/hypothesis-db``."""
    return Path(os.environ.get(ENV_VAR) or DEFAULT_DIRECTORY)


def example_database(directory: str | os.PathLike[str] | None = None) -> ExampleDatabase:
    """A directory-based Hypothesis database at ``directory`` (default :func:`default_directory`).

    The directory is created now, so a path that cannot be one fails here, naming it, rather
    than in the middle of a campaign.
    """
    path = Path(directory) if directory is not None else default_directory()
    if path.exists() and not path.is_dir():
        raise InvalidArgument(f"database {str(path)!r} exists and is not a directory; name a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InvalidArgument(f"database {str(path)!r} cannot be created: {e.strerror or e}") from None
    return DirectoryBasedExampleDatabase(path)


def database_key(property_name: str, world_size: int) -> bytes:
    """The key under which every test of ``property_name`` on ``world_size`` ranks saves failures."""
    if not property_name or isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise InvalidArgument(
            f"database_key needs a property name and a positive world size, got {property_name!r}, {world_size!r}"
        )
    return f"shardfuzz/v{KEY_VERSION}/{property_name}/world_size={world_size}".encode()


def use_database_key(test: T, key: bytes) -> T:
    """Make the Hypothesis test ``test`` (decorated with ``@given``) save and replay under ``key``."""
    if not hasattr(test, "hypothesis"):
        raise InvalidArgument(f"{getattr(test, '__name__', test)!r} is not a Hypothesis test; apply @given first")
    test._hypothesis_internal_database_key = key  # type: ignore[attr-defined]
    return test


def campaign_examples(
    property_name: str, *, world_size: int = DEFAULT_WORLD_SIZE, directory: str | os.PathLike[str] | None = None
) -> Callable[[T], T]:
    """Decorator (above ``@given``) for a pytest test that draws cases of ``property_name``:
    it replays the failures campaigns saved for that property and world size first, and saves
    its own failures where campaigns will replay them.

    ``world_size`` must be the world size the test draws cases for (the pool's). Under a
    settings profile without a database (the ``ci`` profile: derandomized, no database) only the
    key is set, so the profile keeps its meaning. A test with its own ``@settings`` must name
    the database there (``database=example_database()``).
    """
    key = database_key(property_name, world_size)

    def decorate(test: T) -> T:
        use_database_key(test, key)
        current = settings.default
        if current is None or current.database is None or current.derandomize:
            return test
        try:
            decorated: T = settings(database=example_database(directory))(test)
        except HypothesisInvalidArgument as e:
            raise InvalidArgument(
                f"{getattr(test, '__name__', test)!r} has its own @settings; pass "
                f"database=example_database() there instead of relying on campaign_examples ({e})"
            ) from None
        return decorated

    return decorate


class FailuresOnly(ExampleDatabase):
    """``database`` for a test that stops itself with an exception that is not a failure.

    Hypothesis saves the choices of a test that raises any ``BaseException`` other than
    ``KeyboardInterrupt`` (so that an unexpected error replays), and a campaign stops a case
    that way when its budget is spent: that case never ran, and the next campaign would replay
    it first as if it had failed. While :attr:`stopping` is set, saves are dropped; everything
    else goes to ``database``.
    """

    def __init__(self, database: ExampleDatabase) -> None:
        super().__init__()
        self.database = database
        self.stopping = False

    def save(self, key: bytes, value: bytes) -> None:
        if not self.stopping:
            self.database.save(key, value)

    def fetch(self, key: bytes) -> Iterable[bytes]:
        return self.database.fetch(key)

    def delete(self, key: bytes, value: bytes) -> None:
        self.database.delete(key, value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        self.database.move(src, dest, value)

    def __repr__(self) -> str:
        return f"FailuresOnly({self.database!r})"
