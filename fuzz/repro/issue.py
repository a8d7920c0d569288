"""A corpus entry as Markdown for an upstream issue: ``python -m fuzz repro ENTRY --issue``.

What a PyTorch maintainer pastes as it is: a title under 80 characters in their words (the
API, the symptom), the versions, the script (which needs only torch) and the command, what
running that very script printed (Observed: it is run here, under torchrun, as the issue is
written), what the documentation promises (Expected, one or two sentences), and the upstream
issue where the known-bug registry (:mod:`fuzz.known`) links one. Nothing in it points into
shardfuzz: the script's header comments, which name the corpus entry, are left out.
"""

from __future__ import annotations

import re

from fuzz import known
from fuzz.corpus import Entry
from fuzz.repro.script import run_command, upstream_of
from fuzz.signature import Signature, shorten

#: Lines of a rank's traceback quoted under "Observed".
TRACEBACK_LINES = 30
#: The longest title.
TITLE_CHARS = 79
#: Seconds the script may run while the issue is written.
RUN_TIMEOUT_S = 600.0

#: The APIs a mismatch is charged to (:class:`fuzz.signature.Signature` ``where``), as their
#: maintainers name them.
_FAMILIES = {
    "fsdp2": "fully_shard",
    "fsdp1": "FSDP",
    "ddp": "DistributedDataParallel",
    "replicate": "replicate",
    "save": "distributed checkpoint",
    # properties, where the signature names no API
    "parity": "torch.distributed",
    "metamorphic": "torch.distributed",
    "dcp": "DCP",
    "state_dict": "distributed state_dict",
    "mixed_precision": "MixedPrecisionPolicy",
}

#: Expected, by property and kind, where the registry's record says nothing of its own.
_EXPECTED = {
    "parity": "Training the distributed model gives the losses, gradients and parameters of the same plain "
    "model trained on the global batch with its gradients averaged across ranks (up to float rounding).",
    "metamorphic": "These options change how the work is distributed, not the numerics: both runs give the same "
    "losses, gradients and parameters (up to float rounding).",
    "state_dict": "A state dict taken with these options and loaded back restores exactly what was saved: "
    "the same model and optimizer values, and training continues as it would have.",
    "dcp": "A checkpoint saved and loaded with these options restores exactly what was saved: the same model "
    "and optimizer values, and training continues as it would have.",
    "exception": "These calls are documented for this model and these options: every rank returns from them.",
    "hang": "Every rank returns from these calls; none waits forever in a collective.",
    "crash": "No rank dies: the calls return (or raise a Python exception).",
}


def _symptom(entry: Entry) -> str:
    """What went wrong, in a few words, from the signature."""
    sig = Signature.parse(entry.signature)
    if sig is None:
        return entry.kind
    function = sig.where.split(":")[1] if sig.where.count(":") >= 1 else sig.where
    if entry.kind == "exception":
        return f"{sig.check.rsplit('.', 1)[-1]} in {function}"
    if entry.kind == "crash":
        return f"{sig.check.removeprefix('signal ')} in {function}"
    if entry.kind == "hang":
        return f"hangs in {function}"
    return "wrong results, no error"


def _api(entry: Entry, title: str) -> str:
    """The API a title starts with (``set_optimizer_state_dict``, ``DTensor``), else the one the
    signature charges (``fully_shard``), else the property."""
    first = re.match(r"[\w.]+", title)
    word = first[0] if first else ""
    if "_" in word or "." in word or any(c.isupper() for c in word):
        return word
    sig = Signature.parse(entry.signature)
    prop = entry.case.property
    return _FAMILIES.get(sig.where if sig is not None else "", _FAMILIES.get(prop, prop))


def title_of(entry: Entry) -> str:
    """A title under 80 characters: the registry's record's title where it is that short, else
    its first clause (the API and its options) with the symptom, else the API with the symptom.
    The record's own short title is the better source (see the report of this change)."""
    symptom = _symptom(entry)
    title = " ".join(known.get(entry.bug).title.split()) if entry.bug else ""
    head = re.split(r": |; ", title, maxsplit=1)[0]
    for candidate in (title, f"{head}: {symptom}"):
        if candidate and len(candidate) <= TITLE_CHARS and head:
            return candidate
    return shorten(f"{_api(entry, title)}: {symptom}", TITLE_CHARS)


def expected_of(entry: Entry) -> str:
    if entry.kind == "mismatch":
        return _EXPECTED.get(entry.case.property, _EXPECTED["parity"])
    return _EXPECTED[entry.kind]


def _fence(text: str, lang: str = "") -> str:
    run = max((len(m) for m in re.findall(r"`+", text)), default=0)
    ticks = "`" * max(3, run + 1)
    return f"{ticks}{lang}\n{text.rstrip()}\n{ticks}"


def without_header(script: str) -> str:
    """``script`` without its leading comments (they name the corpus entry), shebang kept."""
    lines = script.splitlines(keepends=True)
    shebang = lines[:1] if lines and lines[0].startswith("#!") else []
    rest = lines[len(shebang) :]
    while rest and (rest[0].startswith("#") or not rest[0].strip()):
        rest = rest[1:]
    return "".join(shebang + rest)


_RANK_LINE = re.compile(r"^\[rank(\d+)\]: ?(.*)$")
_VERDICT = re.compile(r"^(REPRODUCED|FAIL \(|PASS)")


def observed(output: str, status: int | None) -> str:
    """What a maintainer needs of a run's output: the first rank's traceback (at most
    :data:`TRACEBACK_LINES` lines, from "Traceback": torch's ``[rankN]:`` lines, or the first
    traceback a script printed itself), the stuck rank's stack, and the verdict lines;
    torchrun's and torch's warnings and torchrun's own traceback left out."""
    by_rank: dict[int, list[str]] = {}
    for line in output.splitlines():
        m = _RANK_LINE.match(line)
        if m:
            by_rank.setdefault(int(m[1]), []).append(m[2])
    quoted: list[str] = []
    for rank, lines in sorted(by_rank.items()):
        starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
        if starts:
            quoted = [f"rank {rank}:", *lines[starts[0] :][-TRACEBACK_LINES:]]
            break
    lines = output.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
    if not quoted and starts:  # a script that prints its rank's traceback itself, before its verdict
        end = next((j for j in range(starts[0], len(lines)) if _VERDICT.match(lines[j])), len(lines))
        quoted = lines[starts[0] : end][-TRACEBACK_LINES:]
    stack = [line for line in lines if line.startswith("  File ") or line.startswith("    ")]
    if not quoted and stack:
        quoted = stack[-TRACEBACK_LINES:]
    verdicts = [line for line in output.splitlines() if _VERDICT.match(line)]
    said = "timed out" if status is None else f"exit status {status}"
    return "\n".join([*quoted, *([""] if quoted else []), *verdicts, f"(torchrun: {said})"])


def run_for_issue(script: str, entry: Entry) -> tuple[int | None, str]:
    """``script`` run under torchrun here: (exit status, output)."""
    from fuzz.repro.store import run_script

    status, output, _ = run_script(script, timeout=RUN_TIMEOUT_S, nproc=entry.case.world_size)
    return status, re.sub(r'File "[^"]*/repro\.py"', 'File "repro.py"', output)  # where it ran here


def render_issue(entry: Entry, script: str, source: str = "", run: tuple[int | None, str] | None = None) -> str:
    """The Markdown for ``entry``; ``script`` is its reduced script (kept beside the entry) or its
    unreduced one (fuzz.repro.render_entry); ``run`` is (exit status, output) of running it
    under torchrun, which is done here where not given."""
    del source  # the issue names nothing of shardfuzz
    case = entry.case
    versions = entry.versions
    status, output = run if run is not None else run_for_issue(script, entry)
    gpu = entry.backend == "nccl"
    command = run_command(entry)
    lines = [
        f"# {title_of(entry)}",
        "",
        "| torch | Python | backend | world size | device |",
        "| --- | --- | --- | --- | --- |",
        f"| {versions.get('torch', '?')} | {versions.get('python', '?')} | {entry.backend} | {case.world_size} | "
        f"{versions.get('device', entry.device_kind)} |",
        "",
        f"Save the script below as `repro.py` and run it on {'one GPU per rank' if gpu else 'CPU'} "
        "(it needs only torch):",
        "",
        _fence(command, "sh"),
        "",
        "It exits 1 and prints `REPRODUCED ...` while the bug is there, exits 0 and prints `PASS` once it is "
        "fixed, and exits 2 if it cannot run here or fails another way (torchrun itself exits 1 whenever a "
        "rank exits non-zero; its summary lists each rank's exit code).",
        "",
        _fence(without_header(script), "python"),
        "",
        "## Observed",
        "",
        f"`{command}` here:",
        "",
        _fence(observed(output, status), "text"),
        "",
        "## Expected",
        "",
        expected_of(entry),
    ]
    upstream, url = upstream_of(entry)
    if url or (upstream and upstream.startswith(("http", "pytorch/"))):
        lines += ["", "## Upstream", "", url or upstream or ""]
        if entry.bug:
            lines += [f"See also {other}." for other in known.get(entry.bug).see_also]
    return "\n".join(lines) + "\n"
