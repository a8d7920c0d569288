"""Apply one fault to a torch module at import time, in every process that starts with this
directory on PYTHONPATH (spawned ranks included); nothing in site-packages changes.

``SHARDFUZZ_FAULT`` names a JSON file of :mod:`tests/faults` (``module``, ``old``, ``new``),
or one whose ``changes`` is a list of such objects (a known bug's fix may take several): each
module's source must contain each of its ``old`` texts exactly once, and ``new`` replaces it
before the module is compiled. Anything else raises at import, so a fault never runs unapplied.
"""

import importlib.abc
import importlib.machinery
import json
import os
import sys

_path = os.environ.get("SHARDFUZZ_FAULT")
if _path:
    with open(_path) as f:
        _fault = json.load(f)
    _changes: dict[str, list[tuple[str, str]]] = {}
    for _change in _fault.get("changes", [_fault]):
        _changes.setdefault(_change["module"], []).append((_change["old"], _change["new"]))

    class _Loader(importlib.machinery.SourceFileLoader):
        def get_data(self, path):  # type: ignore[no-untyped-def]
            data = super().get_data(path)
            if path == self.path:
                source = data.decode()
                for old, new in _changes[self.name]:
                    n = source.count(old)
                    if n != 1:
                        raise RuntimeError(f"fault {_path}: its 'old' text occurs {n} times in {path}")
                    source = source.replace(old, new)
                data = source.encode()
            return data

        def path_stats(self, path):  # type: ignore[no-untyped-def]
            raise OSError  # never the cached bytecode of the unmodified source

    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
            if name not in _changes:
                return None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    spec.loader = _Loader(name, spec.origin)
                    return spec
            return None

    sys.meta_path.insert(0, _Finder())
