"""Stored reproducer scripts: the one kept beside a corpus entry (``NAME.repro.py`` for ``NAME.json``).

A script printed from its case (:func:`fuzz.repro.printed.print_entry`) is stored only once it
reproduces under torchrun here (exit 1 with a ``REPRODUCED`` line) and, where its known bug has
a fix written (:attr:`fuzz.known.KnownBug.fix`, fuzz/fixes), exits 0 saying PASS on torch with
that fix (:func:`store_printed`); it is written whole, through a temporary file. Its second line
says what it is, :data:`PRINTED_HEADER` with a hash of the entry (:func:`entry_hash`) and the
seconds storing took; it is current while the entry hashes the same (:func:`is_current`).

Scripts kept from before scripts were printed (:data:`REDUCED_HEADER`, cut down from the rank
side's carried program) are standalone torch programs too: they stay valid as they are, current
by the same entry hash, read and run as the printed ones are.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from fuzz import known
from fuzz.corpus import Entry
from fuzz.errors import InvalidArgument
from fuzz.model import to_jsonable
from fuzz.patching import patch_env
from fuzz.repro import print_contract
from fuzz.repro.printed import print_entry
from fuzz.repro.script import code_lines
from fuzz.stop import raise_if_stopped

#: The second line of a stored printed script.
PRINTED_HEADER = "# shardfuzz printed reproducer:"
#: The second line of a script kept from the reducer that came before printing.
REDUCED_HEADER = "# shardfuzz reduced reproducer:"
#: Seconds a script may run under torchrun before it counts as timed out.
RUN_TIMEOUT_S = 300.0
#: The words a verdict line starts with.
VERDICT_WORDS = ("PASS", "FAIL", "REPRODUCED")
#: The verdict lines of a stored script that found nothing wrong: a printed script's (an
#: exception's, a hang's, a crash's, a mismatch's), then the kept reduced scripts' own.
PASSING = frozenset(
    {
        "PASS: no rank raised",
        "PASS: every rank finished",
        "PASS: no rank died",
        "PASS: every loss, gradient and parameter agrees",
        "PASS or another failure: None",
        print_contract.PASSED,
    }
)
_VERDICT_START = re.compile(r"(?=PASS|FAIL \(|REPRODUCED)")
_ERROR_LINE = re.compile(r"^\s*(?:[\w.]+(?:Error|Exception|Interrupt)|AssertionError)\b.*", re.MULTILINE)
#: Entry fields a campaign updates when it meets the entry again; a script does not depend on them.
_COUNTERS = ("count", "reruns", "reproduced")


def stored_path(entry_path: Path) -> Path:
    """Where the script of the entry at ``entry_path`` is kept."""
    return entry_path.with_name(entry_path.name.removesuffix(".json") + ".repro.py")


def entry_hash(entry: Entry) -> str:
    """A hash of what a stored script depends on: the entry but for its counters, with the case
    encoded sparsely (fields at their defaults left out), so that a field the model gains later
    does not make every stored script stale."""
    data = {k: v for k, v in entry.to_json().items() if k not in _COUNTERS}
    data["case"] = to_jsonable(entry.case, sparse=True)
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def printed_header(entry: Entry, seconds: float) -> str:
    """The second line of a stored printed script."""
    return f"{PRINTED_HEADER} entry={entry_hash(entry)} seconds={seconds:.1f}"


def header_fields(script: str) -> dict[str, str]:
    """The ``key=value`` fields of a stored script's header (printed or kept reduced); {} where
    ``script`` has none (one printed or rendered, not stored)."""
    for line in script.splitlines()[:3]:
        for head in (PRINTED_HEADER, REDUCED_HEADER):
            if line.startswith(head):
                return dict(part.split("=", 1) for part in line[len(head) :].split() if "=" in part)
    return {}


def is_current(script: str, entry: Entry) -> bool:
    """Whether ``script`` was stored for this entry as it is now."""
    return header_fields(script).get("entry") == entry_hash(entry)


def stored_script(entry_path: Path, entry: Entry) -> str | None:
    """The script stored beside the entry if it is current, else None."""
    try:
        text = stored_path(entry_path).read_text(encoding="utf-8")
    except OSError:
        return None
    return text if is_current(text, entry) else None


def run_script(
    text: str, *, timeout: float = RUN_TIMEOUT_S, env: dict[str, str] | None = None, nproc: int | None = None
) -> tuple[int | None, str, float]:
    """(exit status or None on a timeout, stdout and stderr, seconds) of ``python FILE.py``, or
    with ``nproc`` of ``torchrun --standalone --nproc-per-node N FILE.py``. Every process still
    running the file afterwards (torchrun puts ranks in sessions of their own) is ended by its pid.
    The run's temporary directory (``TMPDIR``) is a new empty one: a script finds nothing an
    earlier run left. A stop already requested (:mod:`fuzz.stop`) is raised again instead."""
    raise_if_stopped()
    with tempfile.TemporaryDirectory(prefix="shardfuzz-repro-") as tmp:
        file = Path(tmp) / "repro.py"
        file.write_text(text)
        own_tmp = Path(tmp) / "tmp"
        own_tmp.mkdir()
        log = Path(tmp) / "output"
        start = time.monotonic()
        status: int | None
        command = [sys.executable, str(file)]
        if nproc is not None:
            command[1:1] = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
        with log.open("w") as out:
            proc = subprocess.Popen(
                command,
                cwd=tmp,
                env={**os.environ, "TMPDIR": str(own_tmp), **(env or {})},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                status = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                status = None
            finally:  # on a timeout, or a stop (KeyboardInterrupt) while it runs
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                _end_processes_running(str(file))
        return status, log.read_text(errors="replace"), time.monotonic() - start


def _end_processes_running(file: str) -> None:
    """SIGKILL every process of this user whose command line names ``file`` (a unique path)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if file in (proc / "cmdline").read_bytes().decode(errors="replace").split("\0"):
                os.kill(int(proc.name), signal.SIGKILL)


def verdicts(output: str) -> list[str]:
    """The verdict lines of a script's output (the ranks share torchrun's output, and a print's
    text and its newline are two writes: two ranks' verdicts can meet on one line)."""
    return [
        v.strip()
        for line in output.splitlines()
        if line.startswith(VERDICT_WORDS)
        for v in _VERDICT_START.split(line)
        if v.strip()
    ]


def passed(output: str) -> bool:
    """Whether a script's output says it passed: verdicts, each of them one of :data:`PASSING`."""
    said = verdicts(output)
    return bool(said) and all(v in PASSING for v in said)


def why_not(status: int | None, output: str) -> str:
    """One line on why a run did not reproduce: its verdict where it printed one, else the last
    exception a rank raised (not torchrun's own ``ChildFailedError``), else its last line that
    has words; with its exit status or "timed out"."""
    said = "timed out" if status is None else f"exit {status}"
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [e.strip() for e in _ERROR_LINE.findall(output) if "ChildFailedError" not in e]
    worded = [line for line in lines if re.search(r"[A-Za-z]{2}", line)]
    last = (verdicts(output) or errors or worded or ["no output"])[-1]
    return f"{said}: {last[:300]}"


def run_fixed(script: str, entry: Entry, directory: Path) -> str | None:
    """How ``script`` of ``entry`` ran under torchrun on torch with its known bug's fix
    (``passed``: exit 0 and every verdict PASS, or what it did instead), or None where the bug
    has no fix written or the fix does not apply to this torch. ``directory`` holds the fix."""
    bug = known.BUGS.get(entry.bug or "")
    env = patch_env(bug.fix, str(directory)) if bug is not None and bug.fix else None
    if env is None:
        return None
    status, output, seconds = run_script(script, env=env, nproc=entry.case.world_size)
    if status == 0 and passed(output):
        return "passed"
    said = verdicts(output) or output.splitlines()
    last = said[-1].strip()[:200] if said else "no output"
    return f"{'timed out' if status is None else f'exit {status}'} in {seconds:.1f} s: {last}"


def store_printed(entry_path: Path, entry: Entry, *, say: Callable[[str], None] = lambda _: None) -> str:
    """The entry's script printed from its case, stored beside the entry once it reproduces
    under torchrun here (exit 1, REPRODUCED) and passes with its bug's fix where one is written
    (exit 0, PASS); returns what was stored. A stored script that is current and is what
    printing gives now is returned as it is. Else InvalidArgument (a :class:`NotPrintable`
    naming what the printers do not write yet, or why the script was refused), and nothing
    changes."""
    start = time.monotonic()
    script = print_entry(entry)
    stored = stored_script(entry_path, entry)
    if stored is not None and stored.split("\n", 2)[2:] == script.split("\n", 1)[1:]:
        say(f"{entry_path}: its stored script is what printing gives now")
        return stored
    status, output, seconds = run_script(script, timeout=600.0, nproc=entry.case.world_size)
    said = verdicts(output)
    if status != 1 or not any(line.startswith("REPRODUCED") for line in said):
        raise InvalidArgument(f"{entry_path}: its printed script does not reproduce here ({why_not(status, output)})")
    say(f"{entry_path}: printed, {code_lines(script)} code lines, reproduced in {seconds:.1f} s: {said[0][:200]}")
    with tempfile.TemporaryDirectory(prefix="shardfuzz-fixed-") as tmp:
        with_fix = run_fixed(script, entry, Path(tmp))
    if with_fix not in (None, "passed"):
        raise InvalidArgument(f"{entry_path}: its printed script does not pass with its bug's fix ({with_fix})")
    say(f"{entry_path}: with its bug's fix: {with_fix or 'no fix written'}")
    return _write(stored_path(entry_path), script, printed_header(entry, time.monotonic() - start))


def _write(path: Path, script: str, header: str) -> str:
    """``script`` with ``header`` as its second line, written whole to ``path`` (a temporary file
    renamed into place); returns what was written."""
    lines = script.splitlines(keepends=True)
    text = "".join([lines[0], header + "\n", *lines[1:]])
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return text
