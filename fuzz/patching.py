"""Torch with one change to its source: the faults of tests/faults and ../shared/mutants, and the
fixes of known torch bugs (:class:`fuzz.known.Patch`). The change is made as the module is
imported, in every process started with the patch harness (``tests/faults/harness``) on its
``PYTHONPATH``; nothing installed changes."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fuzz import known


def fault_applies(fault: dict[str, Any]) -> bool:
    """Whether each ``old`` text of the fault (its own, or each of its ``changes``) occurs
    exactly once in this torch's module (a fault is written against one version's code)."""
    import importlib.util

    olds: dict[str, list[str]] = {}
    for change in fault.get("changes", [fault]):
        olds.setdefault(str(change["module"]), []).append(str(change["old"]))
    for module, texts in olds.items():
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            return False
        if spec is None or spec.origin is None:
            return False
        with open(spec.origin) as f:
            source = f.read()
        if any(source.count(old) != 1 for old in texts):
            return False
    return True


def patch_env(patches: Sequence[known.Patch], directory: str) -> dict[str, str] | None:
    """The environment variables under which a process imports torch with ``patches`` applied
    (written as one fault file into ``directory``, applied by tests/faults/harness of the
    checkout this package runs from); None where that harness is not there or a patch's text
    is not in this torch."""
    import json

    harness = Path(__file__).resolve().parent.parent / "tests" / "faults" / "harness"
    fault = {"changes": [{"module": p.module, "old": p.old, "new": p.new} for p in patches]}
    if not patches or not (harness / "sitecustomize.py").is_file() or not fault_applies(fault):
        return None
    path = os.path.join(directory, "fix.json")
    with open(path, "w") as f:
        json.dump(fault, f)
    python_path = os.pathsep.join(p for p in (str(harness), os.environ.get("PYTHONPATH")) if p)
    return {"SHARDFUZZ_FAULT": path, "PYTHONPATH": python_path}


def fix_env(bug_ids: Sequence[str], directory: str) -> dict[str, str]:
    """The environment of a campaign whose ranks run under the fixes of the known bugs
    ``bug_ids`` (``explore --fix``): :func:`patch_env` of their changes, and
    :data:`fuzz.known.FIXED_ENV` naming them, so that the registry takes them for absent.
    InvalidArgument names an unknown id, a bug without a written fix, or fixes that do not
    apply to this torch."""
    from fuzz.errors import InvalidArgument

    bugs = []
    for bug_id in dict.fromkeys(bug_ids):
        bug = known.BUGS.get(bug_id)
        if bug is None:
            raise InvalidArgument(f"--fix {bug_id}: no known bug of that id; known: {', '.join(sorted(known.BUGS))}")
        if not bug.fix:
            with_fix = sorted(b.id for b in known.BUGS.values() if b.fix)
            raise InvalidArgument(
                f"--fix {bug_id}: the bug has no fix in fuzz/fixes/; bugs with one: {', '.join(with_fix)}"
            )
        bugs.append(bug)
    env = patch_env([p for bug in bugs for p in bug.fix], directory)
    if env is None:
        import torch

        written = "; ".join(
            f"{b.id}'s for torch {known.fix_written_for(b.id)}" for b in bugs if known.fix_written_for(b.id)
        )
        raise InvalidArgument(
            f"--fix {','.join(b.id for b in bugs)}: the fix does not apply to torch {torch.__version__} "
            "(its text is not in this torch's source, or tests/faults/harness is missing)"
            + (f"; written against another release's source: {written}" if written else "")
        )
    return {**env, known.FIXED_ENV: ",".join(b.id for b in bugs)}
