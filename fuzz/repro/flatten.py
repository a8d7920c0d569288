"""Flattening: the carried modules of a reduced script as one module, with no import hook.

Every top-level name of every module becomes a global of the script: a name that more than one
module defines is renamed after its module (``_mismatch_state_dict``); an import of shardfuzz
(``from fuzz.model import Case``, ``from fuzz import known`` then ``known.get``) becomes the
name it stands for, followed through re-exports; imports of anything else are written once at
the top. Modules are written in the order their top-level imports need.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

#: A binding: ("def", module, name) for a name a module defines, ("import", text) for an import
#: of anything but shardfuzz, ("alias", module, name) for ``from fuzz.m import name``,
#: ("module", module) for a shardfuzz module bound as a name.
Binding = tuple[str, ...]


def _is_fuzz(module: str | None) -> bool:
    return bool(module) and (module == "fuzz" or str(module).startswith("fuzz."))


@dataclass
class _Module:
    name: str
    tree: ast.Module
    bindings: dict[str, Binding] = field(default_factory=dict)


def _bound_names(node: ast.stmt) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        targets = [node.target]
    out = []
    for target in targets:
        out += [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]
    return out


def _collect(mod: _Module, modules: set[str]) -> None:
    for node in mod.tree.body:
        if isinstance(node, ast.ImportFrom) and _is_fuzz(node.module):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                mod.bindings[a.asname or a.name] = (
                    ("module", sub) if sub in modules else ("alias", node.module or "", a.name)
                )
        elif isinstance(node, ast.Import) and any(_is_fuzz(a.name) for a in node.names):
            for a in node.names:
                if a.asname:
                    mod.bindings[a.asname] = ("module", a.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                if isinstance(node, ast.Import):
                    key = a.asname or a.name.split(".")[0]
                    text = f"import {a.name}" + (f" as {a.asname}" if a.asname else "")
                else:
                    key = a.asname or a.name
                    text = f"from {'.' * node.level}{node.module or ''} import {a.name}" + (
                        f" as {a.asname}" if a.asname else ""
                    )
                if getattr(node, "module", None) != "__future__":
                    mod.bindings[key] = ("import", text)
        else:
            for name in _bound_names(node):
                mod.bindings.setdefault(name, ("def", mod.name, name))


class _Flattener:
    """Resolves every module's names to the flat module's names."""

    def __init__(self, sources: dict[str, str]) -> None:
        self.mods = {name: _Module(name, ast.parse(text)) for name, text in sources.items()}
        for mod in self.mods.values():
            _collect(mod, set(self.mods))
        self.flat: dict[Binding, str] = {}
        self._name_definitions()

    def resolve(self, binding: Binding, depth: int = 0) -> Binding:
        """A binding followed through ``alias`` bindings to a definition, import or module."""
        while binding[0] == "alias" and depth < 20:
            module, name = binding[1], binding[2]
            if f"{module}.{name}" in self.mods:
                return ("module", f"{module}.{name}")
            mod = self.mods.get(module)
            if mod is None or name not in mod.bindings:
                raise KeyError(f"{module}.{name} is not carried")
            binding = mod.bindings[name]
            depth += 1
        return binding

    def _name_definitions(self) -> None:
        taken: dict[str, Binding] = {}
        for mod in self.mods.values():
            for name, binding in mod.bindings.items():
                if binding[0] not in ("def", "import") or binding in self.flat:
                    continue
                flat = name
                if (flat in taken and taken[flat] != binding) or flat in ("main", "attempt"):
                    short = mod.name.split(".")[-1].lstrip("_")
                    flat = f"{name}_{short}"
                    while flat in taken:
                        flat += "_"
                taken[flat] = binding
                self.flat[binding] = flat

    def renames(self, mod: _Module) -> tuple[dict[str, str], dict[str, str]]:
        """(name -> flat name, module alias -> module) within ``mod``."""
        names: dict[str, str] = {}
        aliases: dict[str, str] = {}
        for name, binding in mod.bindings.items():
            target = self.resolve(binding)
            if target[0] == "module":
                aliases[name] = target[1]
            else:
                names[name] = self.flat[target]
        return names, aliases

    def local_imports(self, tree: ast.AST) -> dict[str, str]:
        """Names bound by shardfuzz imports inside functions, to their flat names."""
        out: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and _is_fuzz(node.module):
                for a in node.names:
                    try:
                        target = self.resolve(("alias", node.module or "", a.name))
                    except KeyError:  # not carried: the code importing it never ran
                        continue
                    if target[0] != "module":
                        out[a.asname or a.name] = self.flat[target]
        return out

    def attribute(self, module: str, attr: str) -> str:
        target = self.resolve(("alias", module, attr))
        return self.flat[target]


class _Rename(ast.NodeTransformer):
    def __init__(self, flattener: _Flattener, names: dict[str, str], aliases: dict[str, str]) -> None:
        self.f = flattener
        self.names = names
        self.aliases = aliases

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in self.names:
            node.id = self.names[node.id]
        return node

    def visit_arg(self, node: ast.arg) -> ast.AST:
        if node.arg in self.names:
            node.arg = self.names[node.arg]
        self.generic_visit(node)
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        if isinstance(node.value, ast.Name) and node.value.id in self.aliases:
            return ast.copy_location(ast.Name(self.f.attribute(self.aliases[node.value.id], node.attr), node.ctx), node)
        self.generic_visit(node)
        return node

    def _named(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> ast.AST:
        node.name = self.names.get(node.name, node.name)
        self.generic_visit(node)
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _named

    def visit_Global(self, node: ast.Global) -> ast.AST:
        node.names = [self.names.get(n, n) for n in node.names]
        return node

    visit_Nonlocal = visit_Global  # type: ignore[assignment]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.AST | None:
        return None if _is_fuzz(node.module) else node

    def visit_Import(self, node: ast.Import) -> ast.AST | None:
        return None if any(_is_fuzz(a.name) for a in node.names) else node


def _fill(tree: ast.AST) -> None:
    """An empty body left by a dropped import gets ``pass``."""
    for node in ast.walk(tree):
        for name in ("body", "orelse", "finalbody"):
            stmts = getattr(node, name, None)
            if isinstance(stmts, list) and not stmts and name == "body":
                setattr(node, name, [ast.Pass()])


def _order(mods: dict[str, _Module]) -> list[str]:
    """Modules in the order their top-level shardfuzz imports need (a module after those it imports)."""
    needs: dict[str, set[str]] = {}
    for name, mod in mods.items():
        deps: set[str] = set()
        for node in mod.tree.body:
            if isinstance(node, ast.ImportFrom) and _is_fuzz(node.module):
                deps.add(node.module or "")
                deps.update(f"{node.module}.{a.name}" for a in node.names)
        needs[name] = {d for d in deps if d in mods and d != name}
    out: list[str] = []
    seen: set[str] = set()

    def visit(name: str, stack: tuple[str, ...]) -> None:
        if name in seen or name in stack:
            return
        for dep in sorted(needs[name]):
            visit(dep, (*stack, name))
        seen.add(name)
        out.append(name)

    for name in sorted(mods):
        visit(name, ())
    return out


def flatten(sources: dict[str, str], main: str) -> tuple[ast.Module, dict[str, tuple[str, str]]]:
    """(one module: the imports of everything but shardfuzz, every module's code, then ``main``
    (the source of a function that imports carried names as ``from fuzz.m import name``); the
    module and name each of its top-level definitions came from)."""
    f = _Flattener(sources)
    origins = {flat: (binding[1], binding[2]) for binding, flat in f.flat.items() if binding[0] == "def"}
    imports: dict[str, ast.stmt] = {}
    body: list[ast.stmt] = []
    for name in _order(f.mods):
        mod = f.mods[name]
        names, aliases = f.renames(mod)
        names.update({k: v for k, v in f.local_imports(mod.tree).items() if k not in names})
        tree = _Rename(f, names, aliases).visit(mod.tree)
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                if not (isinstance(node, ast.ImportFrom) and node.module == "__future__"):
                    for a in node.names:
                        key = a.asname or (a.name.split(".")[0] if isinstance(node, ast.Import) else a.name)
                        if names.get(key, key) != key:
                            a.asname = names[key]
                    imports.setdefault(ast.unparse(node), node)
                continue
            body.append(node)
    main_tree = ast.parse(main)
    main_names = f.local_imports(main_tree)
    main_tree = _Rename(f, main_names, {}).visit(main_tree)
    out = ast.Module(
        body=[
            ast.ImportFrom(module="__future__", names=[ast.alias("annotations")], level=0),
            *imports.values(),
            *body,
            *main_tree.body,
        ],
        type_ignores=[],
    )
    _fill(out)
    return ast.fix_missing_locations(out), origins
