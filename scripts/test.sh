#!/usr/bin/env bash
# Set up (CPU torch, pinned so no CUDA packages are downloaded) and run the test suite on CPU.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
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
python3 -m pytest -n 2 "$@"
