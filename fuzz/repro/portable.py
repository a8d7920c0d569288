"""Reduced scripts that every supported Python parses.

The reducer writes its scripts with :func:`ast.unparse`. From Python 3.12 on (PEP 701) that may
reuse the outer quote inside an f-string's replacement field (``f'{p.rpartition('/x/')[0]}'``),
which Python 3.11 cannot parse. :func:`portable` turns such inner quotes into the other kind,
and keeps a change only where the code means the same (equal ASTs).
"""

from __future__ import annotations

import ast


def _requote(line: str) -> str:
    """``line`` with the quotes inside each f-string's replacement fields switched to the kind
    the f-string does not use."""
    out: list[str] = []
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        starts = (
            c in "fF"
            and i + 1 < n
            and line[i + 1] in "'\""
            and (i == 0 or not (line[i - 1].isalnum() or line[i - 1] == "_"))
        )
        if not starts:
            out.append(c)
            i += 1
            continue
        quote = line[i + 1]
        other = '"' if quote == "'" else "'"
        out.append(line[i : i + 2])
        i += 2
        depth = 0
        while i < n:
            ch = line[i]
            if depth == 0 and ch == quote:
                out.append(ch)
                i += 1
                break
            if depth == 0 and ch in "{}" and i + 1 < n and line[i + 1] == ch:
                out.append(ch * 2)  # an escaped brace
                i += 2
                continue
            depth += {"{": 1, "}": -1}.get(ch, 0)
            out.append(other if depth > 0 and ch == quote else ch)
            i += 1
    return "".join(out)


def portable(text: str) -> str:
    """``text`` with every line whose f-strings reuse their quote requoted, where that leaves
    the module's AST unchanged (on a Python that cannot parse ``text``: where the whole
    requoted text then parses)."""
    try:
        tree: str | None = ast.dump(ast.parse(text))
    except SyntaxError:
        tree = None
    lines = text.split("\n")
    if tree is None:
        requoted = "\n".join(_requote(line) for line in lines)
        try:
            ast.parse(requoted)
        except SyntaxError:
            return text
        return requoted
    for k, line in enumerate(lines):
        new = _requote(line)
        if new == line:
            continue
        candidate = "\n".join([*lines[:k], new, *lines[k + 1 :]])
        try:
            same = ast.dump(ast.parse(candidate)) == tree
        except SyntaxError:
            same = False
        if same:
            lines[k] = new
    return "\n".join(lines)
