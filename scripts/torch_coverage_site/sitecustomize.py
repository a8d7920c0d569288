"""Torch coverage for the ranks of a shardfuzz checkout whose worker does not measure it (one
older than ``--torch-coverage``), to compare campaigns across versions of the suite.

Put this directory first on ``PYTHONPATH`` and set ``SHARDFUZZ_TORCH_COVERAGE`` (the data
directory) and ``SHARDFUZZ_TORCH_COVERAGE_PACKAGES`` (comma-separated torch packages) for the
old checkout's ``python -m fuzz explore``; its pool hands the environment to every rank. Each
rank process (``SHARDFUZZ_RANK`` set) then starts this checkout's rank-side measurement
(fuzz/_rank/torch_coverage.py, loaded by its path) at interpreter start-up, imports the measured
packages and saves, then saves every 2 seconds and at exit (the old worker does not save after
each case, so a rank killed after a failure loses at most 2 seconds). Read the data with
``python -m fuzz coverage --torch DIR`` in this checkout. docs/campaigns.md has the figures this
gave.
"""

import atexit
import importlib.util
import os
import threading
import time

if os.environ.get("SHARDFUZZ_RANK") is not None and os.environ.get("SHARDFUZZ_TORCH_COVERAGE"):
    _path = os.path.join(os.path.dirname(__file__), "..", "..", "fuzz", "_rank", "torch_coverage.py")
    _spec = importlib.util.spec_from_file_location("shardfuzz_rank_torch_coverage", _path)
    assert _spec is not None and _spec.loader is not None
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
    _recorder = _module.start(os.environ, int(os.environ["SHARDFUZZ_RANK"]))
    if _recorder is not None:
        _recorder.started()
        atexit.register(_recorder.save)

        def _save_every_2_s() -> None:
            while True:
                time.sleep(2.0)
                _recorder.save()

        threading.Thread(target=_save_every_2_s, daemon=True).start()
