"""Apply one fault to a torch module at import time, in every process that starts with this
directory on PYTHONPATH (spawned ranks included); nothing in site-packages changes.

``SHARDFUZZ_FAULT`` names a JSON file of :mod:`tests/faults` (``module``, ``old``, ``new``):
the module's source must contain ``old`` exactly once, and ``new`` replaces it before the
module is compiled. Anything else raises at import, so a fault never runs unapplied.
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

    class _Loader(importlib.machinery.SourceFileLoader):
        def get_data(self, path):  # type: ignore[no-untyped-def]
            data = super().get_data(path)
            if path == self.path:
                source = data.decode()
                n = source.count(_fault["old"])
                if n != 1:
                    raise RuntimeError(f"fault {_path}: its 'old' text occurs {n} times in {path}")
                data = source.replace(_fault["old"], _fault["new"]).encode()
            return data

        def path_stats(self, path):  # type: ignore[no-untyped-def]
            raise OSError  # never the cached bytecode of the unmodified source

    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
            if name != _fault["module"]:
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
