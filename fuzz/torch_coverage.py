"""Which lines of torch's distributed packages the ranks ran: merged, per module, with the
functions never reached.

A campaign started with ``--torch-coverage`` (or ``python -m fuzz coverage --torch --corpus``)
gives its ranks :func:`rank_env`; each rank process then runs coverage.py over the files of
:data:`PACKAGES` and writes its own data file into the campaign's coverage directory
(:mod:`fuzz._rank.torch_coverage`, the rank side). This module is the driver side:

- :class:`ReachedLines` reads those files (every ``coverage.rank*`` file under one or more
  directories, searched recursively: a report directory of several pools holds one coverage
  directory per pool), incrementally, and merges them: a statement is reached when any rank
  process ran it. :meth:`ReachedLines.update` returns how many statements are new since the
  last call, the signal the campaign's scheduler follows (:class:`fuzz.scheduler.Scheduler`).
- :func:`module_figures` compares them with the installed torch: for every ``.py`` file under
  the packages, its executable lines (statements, as coverage.py's report counts them: its file
  reporter of the plugin API decides, default exclusions applied), how many were reached, and the
  functions none of whose statements was reached (an ``ast`` walk; the body of a function
  nested in another is its own, not the outer one's; a function with no statement of its own,
  such as one holding only its docstring, and ``typing.overload`` stubs are left out).
- :func:`torch_summary` is the ``torch_coverage`` part of ``summary.json``; :func:`format_table`
  the text of ``python -m fuzz coverage --torch``.

"Lines" in the figures are statements: a statement written over several lines counts once.
Files measured on another installation (other paths) match no file of the installed torch and
are counted as ``foreign_files``, not mixed in.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import shlex
import sqlite3
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

from fuzz.errors import ShardfuzzError

#: The packages measured: FSDP2 and FSDP1, replicate and checkpoint, distributed checkpoint
#: and state dicts, DTensor, device meshes and tensor parallelism.
PACKAGES = (
    "torch.distributed.fsdp",
    "torch.distributed._composable",
    "torch.distributed.checkpoint",
    "torch.distributed.tensor",
)
#: Environment the ranks read (fuzz._rank.torch_coverage).
ENV_DIRECTORY = "SHARDFUZZ_TORCH_COVERAGE"
ENV_PACKAGES = "SHARDFUZZ_TORCH_COVERAGE_PACKAGES"
#: The ranks' data files: ``coverage.rank<R>.pid<PID>``.
DATA_GLOB = "coverage.rank*"
#: A campaign's coverage directory, under its report directory.
SUBDIRECTORY = "torch-coverage"


def rank_env(directory: Path, packages: Sequence[str] = PACKAGES) -> dict[str, str]:
    """The environment that makes a pool's ranks measure ``packages`` into ``directory``."""
    return {ENV_DIRECTORY: str(Path(directory).resolve()), ENV_PACKAGES: ",".join(packages)}


def torch_root() -> Path:
    """The directory of the installed torch package (found without importing torch)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise ShardfuzzError("torch is not installed")
    return Path(os.path.realpath(next(iter(spec.submodule_search_locations))))


def package_files(package: str) -> list[Path]:
    """The ``.py`` files of ``package`` (a dotted name under torch) in the installed torch, sorted."""
    parts = package.split(".")
    base = torch_root().joinpath(*parts[1:])
    return sorted(p for p in base.rglob("*.py") if "__pycache__" not in p.parts)


def data_files(directories: Iterable[Path]) -> list[Path]:
    """The ranks' data files under ``directories`` (searched recursively), sorted."""
    found: set[Path] = set()
    for d in directories:
        found.update(p for p in Path(d).rglob(DATA_GLOB) if p.is_file() and not p.name.endswith("-journal"))
    return sorted(found)


class ReachedLines:
    """The statements of the installed torch that the ranks reached, merged over every data file
    under ``directories``: a statement is reached when any rank process ran it.

    :meth:`update` reads the files that are new or changed since the last call (a file is one
    rank process's; it grows while the process lives), so calling it after every chunk of a
    campaign costs what the ranks ran in that chunk, not the whole campaign. A line of a data file
    is mapped to the statement it belongs to (a statement over several lines counts once, at its
    first), as coverage.py's report does. A file that cannot be read now (a rank killed while
    saving leaves its file to be repaired by the next reader) is tried again at the next call.
    Measured files that are not files of ``packages`` in the installed torch (data measured on
    another installation) are kept apart, in :attr:`foreign`.
    """

    def __init__(self, directories: Iterable[Path], packages: Sequence[str] = PACKAGES) -> None:
        self.directories = [Path(d) for d in directories]
        self.packages = tuple(packages)
        #: File of the installed torch (real path) -> its statements reached.
        self.reached: dict[str, set[int]] = {}
        #: Measured file not of the installed torch -> the lines reached, as measured.
        self.foreign: dict[str, set[int]] = {}
        self.unreadable: dict[Path, str] = {}
        self._stamps: dict[Path, tuple[int, int]] = {}
        self._ours: frozenset[str] | None = None

    @property
    def files(self) -> int:
        """Data files read so far."""
        return len(self._stamps)

    @property
    def total(self) -> int:
        """Statements reached."""
        return sum(len(v) for v in self.reached.values())

    def update(self) -> int:
        """Read new and changed data files; returns how many statements were reached for the first time."""
        if self._ours is None:
            self._ours = frozenset(str(f) for package in self.packages for f in package_files(package))
        new = 0
        for path in data_files(self.directories):
            try:
                st = path.stat()
            except OSError:
                continue
            stamp = (st.st_size, st.st_mtime_ns)
            if self._stamps.get(path) == stamp:
                continue
            try:
                lines = read_data_file(path)
            except (OSError, sqlite3.Error, ShardfuzzError) as e:
                self.unreadable[path] = str(e)
                continue
            self.unreadable.pop(path, None)
            self._stamps[path] = stamp
            for filename, numbers in lines.items():
                real = os.path.realpath(filename)
                if real not in self._ours:
                    self.foreign.setdefault(filename, set()).update(numbers)
                    continue
                seen = self.reached.setdefault(real, set())
                before = len(seen)
                seen.update(_static(real).statements_of(numbers))
                new += len(seen) - before
        return new


def read_data_file(path: Path) -> dict[str, set[int]]:
    """The lines of one coverage.py data file, by measured file."""
    from coverage import CoverageData
    from coverage.exceptions import CoverageException

    data = CoverageData(basename=str(path))
    try:
        data.read()
        return {f: set(data.lines(f) or ()) for f in data.measured_files()}
    except CoverageException as e:
        raise ShardfuzzError(f"{path}: not a coverage.py data file: {e}") from None
    finally:
        close = getattr(data, "close", None)  # where coverage.py has it: else the connection stays open
        if close is not None:
            close()


@dataclass(frozen=True)
class _Static:
    """What a module offers, read once per file: its executable statements, its functions, and
    the coverage.py file reporter that maps a measured line to its statement."""

    statements: frozenset[int]
    functions: tuple[tuple[str, frozenset[int]], ...]  # (qualified name, its statements)
    reporter: Any = None

    def statements_of(self, lines: Iterable[int]) -> set[int]:
        """The statements that measured ``lines`` belong to."""
        if self.reporter is None:
            return set()
        return set(self.reporter.translate_lines(lines)) & self.statements


@dataclass(frozen=True)
class ModuleFigures:
    """One module of torch: its executable lines, how many were reached, the functions never reached."""

    module: str
    package: str
    file: str  # relative to the directory that holds torch, e.g. torch/distributed/fsdp/api.py
    lines: int
    reached: int
    functions: int
    never_reached: tuple[str, ...]

    @property
    def percent(self) -> float:
        return 100.0 * self.reached / self.lines if self.lines else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "module": self.module,
            "package": self.package,
            "file": self.file,
            "lines": self.lines,
            "reached": self.reached,
            "percent": round(self.percent, 1),
            "functions": self.functions,
            "never_reached": list(self.never_reached),
        }


@cache
def _static(path: str) -> _Static:
    from coverage.python import PythonFileReporter

    try:
        # The plugin API's file reporter: its lines() are the statements a coverage.py report
        # counts (excluded lines left out), translate_lines() maps measured lines onto them.
        reporter = PythonFileReporter(path, _analyser())
        statements = frozenset(reporter.lines())
        tree = ast.parse(reporter.source())
    except Exception:  # not Python that coverage.py and ast can read: nothing to count
        return _Static(frozenset(), ())
    functions = ((name, body & statements) for name, body in _functions(tree))
    return _Static(statements, tuple((name, body) for name, body in functions if body), reporter)


@lru_cache(maxsize=1)
def _analyser() -> Any:
    """A Coverage object without data, for its settings (the default exclusions)."""
    from coverage import Coverage

    return Coverage(data_file=None, config_file=False)


_Def = (ast.FunctionDef, ast.AsyncFunctionDef)


def _functions(tree: ast.Module) -> list[tuple[str, frozenset[int]]]:
    """(qualified name, the lines of its body) of every function and method, as coverage.py's
    own function index counts them: the body of a function nested in another (directly or in
    a class) is not part of the outer one's. ``typing.overload`` stubs are left out: they are
    declarations that never run."""
    out: list[tuple[str, frozenset[int]]] = []

    def body_lines(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[int]:
        return set(range(fn.body[0].lineno, (fn.body[-1].end_lineno or fn.body[-1].lineno) + 1))

    def visit(node: ast.AST, prefix: str) -> None:
        for child in _defs_in(node):
            name = f"{prefix}{child.name}"
            if isinstance(child, _Def) and not any(_is_overload(d) for d in child.decorator_list):
                own = body_lines(child)
                for inner in ast.walk(child):
                    if inner is not child and isinstance(inner, _Def):
                        own -= body_lines(inner)
                out.append((name, frozenset(own)))
            visit(child, f"{name}.")

    visit(tree, "")
    return out


def _is_overload(decorator: ast.expr) -> bool:
    return (isinstance(decorator, ast.Name) and decorator.id == "overload") or (
        isinstance(decorator, ast.Attribute) and decorator.attr == "overload"
    )


def _defs_in(node: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef]:
    """The functions and classes in ``node``'s statement lists, at any depth of ``if``, ``try``,
    ``with``... but not inside another function or class."""
    found: list[ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef] = []
    for field in ("body", "orelse", "finalbody", "handlers", "cases"):
        for child in getattr(node, field, ()) or ():
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found.append(child)
            elif isinstance(child, ast.AST):
                found.extend(_defs_in(child))
    return found


def module_figures(reached: Mapping[str, set[int]], packages: Sequence[str] = PACKAGES) -> list[ModuleFigures]:
    """One :class:`ModuleFigures` per ``.py`` file of ``packages`` in the installed torch, in
    package order and then by module name, from ``reached`` (real path -> statements reached,
    :attr:`ReachedLines.reached`); a module never imported has 0 lines reached."""
    by_real = {os.path.realpath(f): lines for f, lines in reached.items()}  # keys of ReachedLines.reached
    base = torch_root().parent
    out = []
    for package in packages:
        for path in package_files(package):
            static = _static(str(path))
            got = by_real.get(str(path), set()) & static.statements
            rel = path.relative_to(base)
            parts = list(rel.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            never = tuple(name for name, body in static.functions if not body & got)
            out.append(
                ModuleFigures(
                    module=".".join(parts),
                    package=package,
                    file=rel.as_posix(),
                    lines=len(static.statements),
                    reached=len(got),
                    functions=len(static.functions),
                    never_reached=never,
                )
            )
    return out


def torch_summary(
    lines: ReachedLines,
    *,
    packages: Sequence[str] = PACKAGES,
    per_property: Mapping[str, int] | None = None,
    signal: bool | None = None,
) -> dict[str, Any]:
    """The ``torch_coverage`` part of ``summary.json`` (docs/report.md says what each key holds)."""
    modules = module_figures(lines.reached, packages)
    totals = []
    for package in packages:
        mine = [m for m in modules if m.package == package]
        total, got = sum(m.lines for m in mine), sum(m.reached for m in mine)
        totals.append(
            {
                "package": package,
                "modules": len(mine),
                "modules_reached": sum(1 for m in mine if m.reached),
                "lines": total,
                "reached": got,
                "percent": round(100.0 * got / total, 1) if total else 0.0,
            }
        )
    total, got = sum(m.lines for m in modules), sum(m.reached for m in modules)
    out: dict[str, Any] = {
        "packages": totals,
        "lines": total,
        "reached": got,
        "percent": round(100.0 * got / total, 1) if total else 0.0,
        "modules": [m.to_json() for m in modules],
        "data_files": lines.files,
        "foreign_files": len(lines.foreign),
        "directories": [str(d) for d in lines.directories],
    }
    if per_property is not None:
        out["new_lines_per_property"] = dict(per_property)
    if signal is not None:
        out["signal"] = signal
    return out


def fresh_directory(report: Path | None) -> Path:
    """A campaign's coverage directory: ``REPORT/torch-coverage`` (the data files of an earlier
    campaign there are removed, as its report is replaced), else a new temporary directory."""
    if report is None:
        return Path(tempfile.mkdtemp(prefix="shardfuzz-torch-coverage-"))
    directory = Path(report) / SUBDIRECTORY
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob(DATA_GLOB):
        old.unlink(missing_ok=True)
    return directory


def one_line(lines: ReachedLines, packages: Sequence[str] = PACKAGES) -> str:
    """The campaign's torch coverage in one line, with the command that shows it per module."""
    modules = module_figures(lines.reached, packages)
    total, got = sum(m.lines for m in modules), sum(m.reached for m in modules)
    where = " ".join(shlex.quote(str(d)) for d in lines.directories)
    percent = 100.0 * got / total if total else 0.0
    return (
        f"torch coverage: {got} of {total} lines ({percent:.1f}%) of {', '.join(packages)}; "
        f"per module: python -m fuzz coverage --torch {where}"
    )


def load(directory: Path, packages: Sequence[str] = PACKAGES) -> ReachedLines:
    """The merged data under ``directory``; :class:`ShardfuzzError` (exit 2) naming ``--torch``
    where there is no directory, no data file, or no line of the installed torch in them."""
    if not directory.is_dir():
        what = "is not a directory" if directory.exists() else "does not exist"
        raise ShardfuzzError(f"--torch {directory}: {what}")
    lines = ReachedLines([directory], packages)
    lines.update()
    if not lines.files:
        problem = f" ({len(lines.unreadable)} unreadable: {next(iter(lines.unreadable.values()))})"
        raise ShardfuzzError(
            f"--torch {directory}: no torch coverage data in it{problem if lines.unreadable else ''}; "
            "a campaign writes it with `python -m fuzz explore --torch-coverage`"
        )
    if lines.foreign and not lines.reached:
        raise ShardfuzzError(
            f"--torch {directory}: its data names no file of the installed torch ({torch_root()}); "
            "read it where it was measured"
        )
    return lines


def format_table(summary: Mapping[str, Any]) -> str:
    """``python -m fuzz coverage --torch``: totals per package, then each module with the
    functions it never reached."""
    out = [
        f"torch lines reached: {summary['reached']} of {summary['lines']} ({summary['percent']:.1f}%), "
        f"{summary['data_files']} data files"
        + (f", {summary['foreign_files']} measured files not in this torch" if summary.get("foreign_files") else ""),
        "",
    ]
    width = max([len("package")] + [len(p["package"]) for p in summary["packages"]])
    out.append(f"{'package':<{width}}  {'modules':>9}  {'reached':>8}  {'lines':>6}  {'%':>5}")
    for p in summary["packages"]:
        mods = f"{p['modules_reached']}/{p['modules']}"
        out.append(f"{p['package']:<{width}}  {mods:>9}  {p['reached']:>8}  {p['lines']:>6}  {p['percent']:>5.1f}")
    out.append("")
    modules = summary["modules"]
    width = max([len("module")] + [len(m["module"]) for m in modules])
    out.append(f"{'module':<{width}}  {'reached':>8}  {'lines':>6}  {'%':>5}  never-reached functions")
    for m in modules:
        never = m["never_reached"]
        out.append(
            f"{m['module']:<{width}}  {m['reached']:>8}  {m['lines']:>6}  {m['percent']:>5.1f}  "
            f"{len(never)} of {m['functions']}" + (f": {', '.join(never)}" if never else "")
        )
    return "\n".join(out) + "\n"
