"""The reproducer script of a corpus entry, built from the rank side's own code.

A script is the entry's case (JSON), what the entry recorded (its signature and aliases,
whether it is a known bug, the module of its property's judge), and the source of every
shardfuzz module that running and judging the case needs, read from their files when the
script is rendered, as pytest-xdist (execnet) ships its worker module to a remote host. The
script installs them as in-memory modules (a finder on ``sys.meta_path`` that serves those
modules and refuses any other of shardfuzz), then runs :func:`fuzz.repro.runtime.main`: the
body's rank program (:attr:`fuzz.model.Body.PROGRAM`) on every rank under torchrun, judged on
rank 0 by the property's judge. Nothing of shardfuzz, and no Hypothesis, needs to be installed
where it runs; only torch.

Which modules: those the runtime, the rank program, the rank side's entry points and the
judge's module import, followed through every ``import`` statement of their sources (at
module level and in functions, except under ``if TYPE_CHECKING:`` and in
:data:`NOT_FOLLOWED`), so a script carries what its case runs and no more. ``fuzz.repro``
itself is carried as an empty package: only its runtime runs in a script.
"""

from __future__ import annotations

import ast
import json
import pprint
import textwrap
from pathlib import Path
from typing import Any

import fuzz
from fuzz import known
from fuzz.corpus import Entry
from fuzz.errors import InvalidArgument
from fuzz.model import case_to_json
from fuzz.properties import Property, get_property

#: The repository root: modules are carried from the files under it.
ROOT = Path(fuzz.__file__).resolve().parent.parent
RUNTIME = "fuzz.repro.runtime"
#: Modules every script runs besides the body's program and the judge's module.
ENTRY_POINTS = (RUNTIME, "fuzz._rank.programs", "fuzz._rank.context", "fuzz._rank.worker", "fuzz.model")
#: Packages carried without their code: the script runs one module under them.
STUBS = {"fuzz.repro": '"""Reproducer scripts: only their runtime is carried (fuzz.repro.runtime)."""\n'}
#: Functions whose imports a script does not follow: ``fuzz.properties._load`` imports every
#: property for the registry (Hypothesis's strategies among them); a script imports its one.
NOT_FOLLOWED = {("fuzz.properties", "_load")}


def module_file(name: str) -> Path | None:
    """The file of module ``name`` under :data:`ROOT`, or None."""
    base = ROOT.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def relative(name: str) -> str:
    path = module_file(name)
    if path is None:
        return name.replace(".", "/") + "/__init__.py"  # a stub package
    return path.relative_to(ROOT).as_posix()


def imported_modules(name: str, source: str) -> set[str]:
    """The shardfuzz modules that ``source`` (module ``name``) imports."""
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for other in node.orelse:
                visit(other)
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (name, node.name) in NOT_FOLLOWED:
            return
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "fuzz")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                raise InvalidArgument(f"{relative(name)}: relative imports cannot be carried into a script")
            module = node.module or ""
            if module.split(".")[0] == "fuzz":
                out.add(module)
                out.update(f"{module}.{a.name}" for a in node.names if module_file(f"{module}.{a.name}"))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    return out


def carried_modules(roots: list[str]) -> dict[str, str]:
    """Module name -> source, for ``roots`` and everything they import, with parent packages."""
    sources: dict[str, str] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in sources:
            continue
        parts = name.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))
        if name in STUBS:
            sources[name] = STUBS[name]
            continue
        path = module_file(name)
        if path is None:
            raise InvalidArgument(f"module {name} has no file under {ROOT} to carry into a script")
        sources[name] = path.read_text(encoding="utf-8")
        todo.extend(imported_modules(name, sources[name]))
    return dict(sorted(sources.items()))


def roots_for(prop: Property, program: str) -> list[str]:
    """The modules a script runs: :data:`ENTRY_POINTS`, the body's program, the judge's module,
    and the modules of the case's bodies, which the decoder imports by name
    (:data:`fuzz.model.case.BODY_MODULES`)."""
    from fuzz.model.case import BODY_MODULES

    return [*ENTRY_POINTS, program.split(":")[0], prop.judge.__module__, *BODY_MODULES]


def literal(text: str) -> str:
    """``text`` as a triple-quoted literal that keeps its lines."""
    if not text.endswith("\n"):
        text += "\n"
    out = '"""' + text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"') + '"""'
    assert ast.literal_eval(out) == text
    return out


def expected_of(entry: Entry, prop: Property) -> dict[str, Any]:
    """What the script compares its failure with."""
    return {
        "property": entry.case.property,
        "world_size": entry.case.world_size,
        "signature": entry.signature,
        "signatures": sorted(entry.signatures),
        "known": entry.status == "known",
        "judge": prop.judge.__module__,
    }


def upstream_of(entry: Entry) -> tuple[str | None, str | None]:
    """(the upstream reference, its URL) of a known entry, from the registry where it names its record."""
    if entry.bug:
        bug = known.get(entry.bug)
        return bug.upstream, bug.url
    return entry.upstream, None


def run_command(entry: Entry, script: str = "repro.py") -> str:
    backend = " --backend nccl" if entry.backend == "nccl" else ""
    return f"torchrun --nproc-per-node {entry.case.world_size} {script}{backend}"


def _docstring(entry: Entry, source: str) -> str:
    name = Path(source).name if source else entry.file_name
    width = 96
    lines = [f"Reproduces shardfuzz corpus entry {name}: {entry.signature}", ""]
    lines += textwrap.wrap(" ".join(entry.summary.split()), width) or ["(no summary)"]
    if entry.status == "known":
        upstream, url = upstream_of(entry)
        bug = known.get(entry.bug).title if entry.bug else None
        said = f"Known torch bug{f': {bug}' if bug else ''}; upstream: {url or upstream or 'not linked'}."
        lines += ["", *textwrap.wrap(said, width)]
    gpu = entry.backend == "nccl" or entry.device_kind != "cpu"
    lines += [
        "",
        "Run it with",
        "",
        f"    {run_command(entry, 'THIS_FILE.py')} [--timeout SECONDS]",
        "",
        "(or `python THIS_FILE.py`, which starts torchrun itself; gloo on CPU by default, `--backend nccl` for",
        "one GPU per rank). Exit status: 1 if the failure reproduces (the same signature, or for a known",
        "bug the same bug), 0 if not, 2 for bad input.",
    ]
    if gpu:
        lines += ["", f"This case was found with {entry.backend} on {entry.device_kind}: it needs GPUs, one per rank."]
    lines += [
        "",
        "Every rank runs the case below (CASE) with the code shardfuzz's ranks run, carried verbatim",
        "at the end of this file (SOURCES) and imported from memory: only torch needs to be installed.",
        "Rank 0 judges what every rank did with the property's own judge and prints the verdict.",
    ]
    return "\n".join(lines)


_LOADER = '''
class CarriedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports shardfuzz's modules from SOURCES, and refuses any other of shardfuzz."""

    def find_spec(self, name, path=None, target=None):
        if name != "fuzz" and not name.startswith("fuzz."):
            return None
        file = MODULES.get(name)
        if file is None:
            raise ModuleNotFoundError(f"{name} is not carried by this script", name=name)
        return importlib.util.spec_from_loader(name, self, origin=file, is_package=file.endswith("/__init__.py"))

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        file = module.__spec__.origin
        source = SOURCES[file[len(PREFIX) :]]
        module.__file__ = file
        linecache.cache[file] = (len(source), None, source.splitlines(True), file)
        exec(compile(source, file, "exec", dont_inherit=True), module.__dict__)


def main():
    sys.meta_path.insert(0, CarriedModules())
    from fuzz.repro.runtime import main as run

    return run(CASE, EXPECTED)
'''


def render(entry: Entry, source: str = "") -> str:
    """The script for ``entry`` (``source`` names the entry's file in its docstring)."""
    case = entry.case
    prop = get_property(case.property)
    modules = carried_modules(roots_for(prop, case.body.PROGRAM))
    files = {relative(name): text for name, text in modules.items()}
    case_text = json.dumps(case_to_json(case), indent=1, sort_keys=True)
    parts = [
        "#!/usr/bin/env python3",
        literal(_docstring(entry, source)),
        "",
        "import importlib.abc",
        "import importlib.util",
        "import linecache",
        "import sys",
        "",
        "CASE = " + literal(case_text),
        "",
        "EXPECTED = " + pprint.pformat(expected_of(entry, prop), width=100, sort_dicts=True),
        "",
        "#: Where tracebacks say the carried modules are.",
        'PREFIX = "shardfuzz/"',
        _LOADER,
        "",
        "SOURCES = {",
        *(f"    {json.dumps(path)}: {literal(text)}," for path, text in files.items()),
        "}",
        "MODULES = {",
        *(f"    {json.dumps(name)}: PREFIX + {json.dumps(relative(name))}," for name in modules),
        "}",
        "",
        'if __name__ == "__main__":',
        "    sys.exit(main())",
        "",
    ]
    return "\n".join(parts)


def code_lines(script: str) -> int:
    """Lines that are neither blank nor comments."""
    return sum(1 for line in script.splitlines() if line.strip() and not line.lstrip().startswith("#"))


def generated_lines(script: str) -> int:
    """Code lines of the part written for the entry: everything but the carried modules."""
    head, _, rest = script.partition("\nSOURCES = {\n")
    _, _, tail = rest.partition("\n}\nMODULES = {\n")
    return code_lines(head) + code_lines(tail.partition("\n}\n")[2])
