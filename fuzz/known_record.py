"""The known-bug record (:class:`KnownBug`) and what it is made of: the condition under which a
case meets it (:class:`Condition`), its fix (:class:`Patch`, ``fuzz/fixes/<id>.json``), the torch
releases it is present in, and the bugs whose fixes a campaign runs under (:func:`fixed`).

The records are in :mod:`fuzz.known_bugs`, the predicates their conditions are made of in
:mod:`fuzz.known_conditions`, and what callers ask of them in :mod:`fuzz.known`.

Imports only the standard library and the model.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from fuzz.model import Body, Case, Composition, DcpBody, ModuleTree, StateDictBody, Training

#: One draw in this many takes a branch that meets a known bug: known bugs stay reachable, so a
#: campaign notices when torch fixes one, but rare: each hit costs a respawn of the pool.
KNOWN_BUG_ODDS = 16
#: The same for a known deadlock, which costs a whole case deadline (60 s by default) per hit:
#: at 1 in 16 the set_state_dict deadlock took 360 of the state_dict property's 396 s in a
#: 10-minute campaign.
KNOWN_HANG_ODDS = 64
#: What ``KnownBug.upstream`` says after a search of PyTorch's issues and pull requests with
#: several phrasings (the error text, the API names, the symptom) found nothing.
NONE_FOUND = "none found"


@dataclass(frozen=True)
class Patch:
    """A change to the source of one torch module (``old``, which must occur in it once, becomes
    ``new``), applied as the module is imported, in every process started with the patch
    harness (tests/faults/harness, :func:`fuzz.bench.patch_env`); nothing installed changes."""

    module: str
    old: str
    new: str


#: One file per known bug whose fix is written: ``{"why": ..., "changes": [{"module", "old",
#: "new"}, ...]}``, each ``old`` text once in its module of the torch the bug is present in;
#: ``"written_for": "2.13"`` where the text is that release's only (another release's source
#: differs there, so the fix does not apply to it: :func:`fix_written_for`). A bug with the
#: same root cause as another's written fix says so instead of repeating it: ``{"why": ...,
#: "same_as": "<bug id>"}`` takes that file's changes.
FIXES = Path(__file__).resolve().parent / "fixes"


@cache
def _fix_file(bug_id: str) -> dict[str, Any]:
    """``FIXES/<bug_id>.json`` as read once (with the changes of the bug it is the ``same_as``);
    {} where there is no such file."""
    path = FIXES / f"{bug_id}.json"
    data = dict(json.loads(path.read_text())) if path.is_file() else {}
    if "same_as" in data:
        same = _fix_file(data["same_as"])
        data.update({k: v for k, v in same.items() if k in ("changes", "written_for")})
    return data


@cache
def fix_of(bug_id: str) -> tuple[Patch, ...]:
    """The changes of ``FIXES/<bug_id>.json``, () where there is no such file."""
    return tuple(Patch(c["module"], c["old"], c["new"]) for c in _fix_file(bug_id).get("changes", ()))


def fix_written_for(bug_id: str) -> str:
    """The torch release whose source the fix of ``bug_id`` is written against, where it is one
    release's only ("2.13"); "" for a fix written for every release the bug is in."""
    return str(_fix_file(bug_id).get("written_for", ""))


# --------------------------------------------------------------------------- conditions


#: The state-dict and DCP properties' checks that compare two trainings (the uninterrupted run
#: on the source composition and the resumed one on the target's) rather than values before and
#: after a state dict or checkpoint carried them.
RESUME_LOSS, RESUME_PARAMS = "resume_loss", "resume_params"
RESUME_CHECKS = (RESUME_LOSS, RESUME_PARAMS)
#: The state-dict and DCP properties' checks that read the optimizer state a load restored,
#: directly or by training on it.
OPTIMIZER_CHECKS = ("optimizer", *RESUME_CHECKS)
#: :attr:`KnownBug.renames` of a bug that renames a mismatch of any check whose signature carries
#: its tag.
ALL_CHECKS = ("*",)
#: :attr:`KnownBug.renamed_at` that names the case's save call (``save`` or ``async_save``).
SAVE_CALL = "save"


def compositions(case: Case) -> list[Composition]:
    """Every composition of the case: the base and the variant of a metamorphic case, the source
    and the target of a state-dict case."""
    return [v for v in vars(case.body).values() if isinstance(v, Composition)]


class Condition:
    """When a case meets a known bug (:attr:`KnownBug.condition`). :meth:`met` reads the whole
    case; :meth:`met_by` one composition of it with the case's tree and training, where the
    condition is a composition's (the judges tag a training mismatch's API family from it:
    :func:`fuzz.known.mismatch_tags`); a condition over the whole case says False there."""

    def met(self, case: Case) -> bool:
        tree, training = getattr(case.body, "tree", None), getattr(case.body, "training", None)
        tree = tree if isinstance(tree, ModuleTree) else None
        training = training if isinstance(training, Training) else None
        return any(self.met_by(c, tree, training, case.world_size) for c in compositions(case))

    def met_by(self, comp: Composition, tree: ModuleTree | None, training: Training | None, world_size: int) -> bool:
        return False


@dataclass(frozen=True)
class OfComposition(Condition):
    """Met through a composition alone."""

    test: Callable[[Composition], bool]

    def met_by(self, comp: Composition, tree: ModuleTree | None, training: Training | None, world_size: int) -> bool:
        return self.test(comp)


@dataclass(frozen=True)
class OfTree(Condition):
    """Met through a composition of the case's tree (``test(tree, comp)``)."""

    test: Callable[[ModuleTree, Composition], bool]

    def met_by(self, comp: Composition, tree: ModuleTree | None, training: Training | None, world_size: int) -> bool:
        return tree is not None and self.test(tree, comp)


@dataclass(frozen=True)
class OfTraining(Condition):
    """Met through a composition with the case's training (``test(comp, training, world_size)``)."""

    test: Callable[[Composition, Training, int], bool]

    def met_by(self, comp: Composition, tree: ModuleTree | None, training: Training | None, world_size: int) -> bool:
        return training is not None and self.test(comp, training, world_size)


@dataclass(frozen=True)
class OfTreeAndTraining(Condition):
    """Met through a composition of the case's tree with its training (``test(tree, comp,
    training, world_size)``)."""

    test: Callable[[ModuleTree, Composition, Training, int], bool]

    def met_by(self, comp: Composition, tree: ModuleTree | None, training: Training | None, world_size: int) -> bool:
        return tree is not None and training is not None and self.test(tree, comp, training, world_size)


@dataclass(frozen=True)
class OfCase(Condition):
    """Met by the case as a whole; ``saving``: by state_dict and dcp cases only."""

    test: Callable[[Case], bool]
    saving: bool = False

    def met(self, case: Case) -> bool:
        return (not self.saving or isinstance(case.body, (StateDictBody, DcpBody))) and self.test(case)


@dataclass(frozen=True)
class OfBody(Condition):
    """Met by the body of a state_dict or dcp case (its save and load calls)."""

    test: Callable[[Body], bool]

    def met(self, case: Case) -> bool:
        return isinstance(case.body, (StateDictBody, DcpBody)) and self.test(case.body)


@dataclass(frozen=True)
class AnyOf(Condition):
    """Met where one of ``parts`` is."""

    parts: tuple[Condition, ...]

    def __init__(self, *parts: Condition) -> None:
        object.__setattr__(self, "parts", parts)

    def met(self, case: Case) -> bool:
        return any(p.met(case) for p in self.parts)

    def met_by(self, comp: Composition, tree: ModuleTree | None, training: Training | None, world_size: int) -> bool:
        return any(p.met_by(comp, tree, training, world_size) for p in self.parts)


@dataclass(frozen=True)
class KnownBug:
    """One torch bug, and everything the suite knows of it: adding a bug is adding a record (to
    :mod:`fuzz.known_bugs`), its corpus entry and its doc; every list of the registry
    (:data:`fuzz.known.BUGS`, :data:`fuzz.known.CONDITIONS`, the tags of
    :func:`fuzz.known.mismatch_tags`, the checks the state-dict judges rename) is derived from
    the records. ``upstream`` is ``owner/repo#N`` (an issue or a pull request) or
    :data:`NONE_FOUND`; ``relation`` says how it relates (``same bug``, ``same symptom``,
    ``related``) and ``state`` what is known of its fix."""

    id: str
    title: str
    #: What the bug shows as: "mismatch" (wrong values, ranks alive), "exception", "crash",
    #: "hang", "contract" (a documented state violated, no value wrong: its entries match by
    #: signature, in cases that meet its condition). A mismatch met in a case that meets the
    #: bug's condition is this bug whatever
    #: property, layout or check it shows through (:func:`fuzz.known.explains`).
    symptoms: frozenset[str] = frozenset({"exception"})
    upstream: str = NONE_FOUND
    relation: str = ""
    state: str = ""
    ends_ranks: bool = True
    odds: int = KNOWN_BUG_ODDS
    #: The suffix the judges add to a mismatch's API family when a case meets the bug's
    #: condition through the composition charged (:func:`fuzz.known.mismatch_tags`), or that
    #: names the bug in a state-dict judge's renamed mismatch (:attr:`renames`); empty for bugs
    #: that raise, crash or hang, which their exception and frame name.
    tag: str = ""
    #: Other upstream issues and pull requests worth reading beside ``upstream``.
    see_also: tuple[str, ...] = ()
    #: Where the torch-only reproducer is.
    docs: str = "docs/known_bugs.md"
    #: The first torch release (``major.minor``) without the bug; empty while the newest torch
    #: the suite runs has it. See :func:`present`.
    fixed_in: str = ""
    #: The first torch release (``major.minor``) the bug is in, where an older torch the suite
    #: runs lacks it (its case passes there); empty if every torch the suite runs has it.
    introduced_in: str = ""
    #: An exception matches this bug's entries only in cases that meet its condition
    #: (:func:`fuzz.known.meets`): for bugs whose exception type and innermost frame other bugs
    #: share (selective checkpointing's replay raises the same error for any mismatch it sees).
    conditional: bool = False
    #: The bug changes only what a training step computes (a gradient, a forward value), the
    #: same way in every run of one composition. In the state-dict and DCP properties it then
    #: accounts for a mismatch only between trainings of two compositions (resuming into
    #: another layout, :data:`RESUME_CHECKS`), never for a round trip's values or a resume into
    #: the same composition, which meet it alike on both sides (:func:`fuzz.known.explains`).
    training_only: bool = False
    #: The bug's failure races (a collective racing a hook, say): a case that meets it fails in
    #: some runs only.
    races: bool = False
    #: When a case meets the bug (None: no case can tell, the bug needs what the case does not
    #: say, an accelerator). The one place a bug's condition is written: strategies keep it
    #: rare, judges name mismatches by it, health runs skip cases it ends the ranks of.
    condition: Condition | None = field(default=None, compare=False, repr=False)
    #: Where the tag names a setup wider than the bug's condition (``:shard1``, a shard
    #: dimension of size 1 under any wrapper, which other bugs' entries carry too): the judges
    #: add the tag wherever a composition meets this, whatever is fixed.
    tag_setup: Condition | None = field(default=None, compare=False, repr=False)
    #: A metamorphic mismatch is charged to the variant; a bug with this set tags it also where
    #: the base composition meets the bug (:func:`fuzz.known.base_tags`).
    tags_through_base: bool = False
    #: The state-dict and DCP judges' checks whose mismatch, in a case that meets the bug, is
    #: this bug whichever of them fails first (:data:`OPTIMIZER_CHECKS`: a wrong optimizer
    #: state after the load, or a resume trained from it): such a mismatch is named
    #: ``mismatch:<property>:<renamed_at>:<tag>``. :data:`ALL_CHECKS`: any check whose
    #: signature carries the tag, which the mismatch keeps with its API family (the check left
    #: out, as the training properties' signatures do).
    renames: tuple[str, ...] = ()
    #: The call a renamed mismatch is charged to (:data:`SAVE_CALL`: the case's save call).
    renamed_at: str = ""

    @property
    def fix(self) -> tuple[Patch, ...]:
        """The bug's fix as changes to torch's source (:class:`Patch`, one or more), where one
        is written (``fuzz/fixes/<id>.json``): a build without the bug, on which a reduced
        script must pass (docs/repro.md); () where none is."""
        return fix_of(self.id)

    @property
    def url(self) -> str | None:
        """A link to the upstream issue or pull request, or None."""
        owner_repo, sep, number = self.upstream.partition("#")
        if not sep or "/" not in owner_repo or not number.split()[0].isdigit():
            return None
        return f"https://github.com/{owner_repo}/issues/{number.split()[0]}"


def release(version: str) -> tuple[int, int]:
    """(major, minor) of a torch version string ("2.11.0+cu130", "2.13.0a0+git...")."""
    major, minor = [*version.split("+")[0].split("."), "0"][:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def present(bug: KnownBug, torch_version: str) -> bool:
    """Whether ``bug`` is in the torch of version ``torch_version`` (per ``introduced_in`` and
    ``fixed_in``): where it is not, its corpus entry cannot fail and the strategies need not
    keep it rare."""
    here = release(torch_version)
    if bug.introduced_in and here < release(bug.introduced_in):
        return False
    return not bug.fixed_in or here < release(bug.fixed_in)


#: The environment variable that names the known bugs whose fixes the ranks run under
#: (comma-separated ids; ``python -m fuzz explore --fix BUG`` sets it for the campaign and its
#: ranks, beside the patch harness that applies the fixes, :func:`fuzz.patching.fix_env`).
FIXED_ENV = "SHARDFUZZ_FIXED"


def fixed() -> frozenset[str]:
    """The ids of the known bugs whose fixes this campaign's ranks run under (:data:`FIXED_ENV`).
    Such a bug is absent: no case meets its condition, no mismatch carries its tag, its corpus
    entries take no failure (:func:`fuzz.corpus.CorpusIndex`), and the strategies draw its path
    as often as any other (``strategies/_odds.py``), so that the path is soaked, not kept rare."""
    return frozenset(filter(None, os.environ.get(FIXED_ENV, "").split(",")))
