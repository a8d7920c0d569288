#!/usr/bin/env bash
# Set up (CPU torch, pinned) and run the main job: a short exploration campaign on CPU, gloo,
# 2 ranks. Failures go to ./corpus, a JSON summary to ./reports/latest. Extra arguments go to
# `python -m fuzz explore` (e.g. --budget 10m --seed 7).
set -euo pipefail
cd "$(dirname "$0")/.."
# requirements-cpu.txt names PyTorch's CPU wheel index. pip asks every index about every package
# it resolves and retries one it cannot reach 5 times (about 8 s a package, so a minute or more
# for a fresh environment). Where that index cannot be reached (an offline machine that has the
# pinned wheel at hand, in pip's find-links or installed), the retries only cost time, so pip
# is told not to retry. Behind a proxy pip may reach the index where this probe cannot; there,
# and where PIP_RETRIES is set already, nothing changes.
if [ -z "${PIP_RETRIES:-}${HTTPS_PROXY:-}${https_proxy:-}" ] &&
    ! python3 -c 'import socket; socket.create_connection(("download.pytorch.org", 443), timeout=3).close()' 2>/dev/null; then
    export PIP_RETRIES=0
fi
python3 -m pip install --quiet --disable-pip-version-check -r requirements-cpu.txt -e .
exec python3 -m fuzz explore --budget 120 --backend gloo --world-size 2 --corpus corpus --report reports/latest "$@"
