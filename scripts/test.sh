#!/usr/bin/env bash
# Set up (CPU torch, pinned so no CUDA packages are downloaded: requirements-cpu.txt) and run the
# test suite on CPU. Extra arguments go to pytest.
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
python3 -m pip install --quiet --disable-pip-version-check -r requirements-cpu.txt -e '.[dev]'
# Chromium renders the campaign report in tests/test_report.py (skipped, with its reason, if
# there is none). Installed from Debian's packages where this runs as root with apt-get.
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    { timeout 300 apt-get install -y -qq chromium || { timeout 300 apt-get update -qq && timeout 300 apt-get install -y -qq chromium; }; } >/dev/null 2>&1 \
        || echo "scripts/test.sh: chromium could not be installed; the report screenshot test will skip" >&2
fi
export CI="${CI:-true}"   # loads the derandomized 'ci' Hypothesis profile
python3 -m ruff check fuzz strategies tests
python3 -m ruff format --check fuzz strategies tests
python3 -m mypy
# imports point down (pyproject.toml [tool.importlinter], docs/design.md); the script pip installed
"$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/lint-imports" --no-cache
# Tests marked slow (minutes each, each path also covered by a faster test) are left to the slow
# tier: `bash scripts/test.sh -m slow` (or tox -e slow); a later -m replaces this one.
python3 -m pytest -n 2 -m "not slow" --durations=20 "$@"
