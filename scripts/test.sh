#!/usr/bin/env bash
# Set up (CPU torch, pinned so no CUDA packages are downloaded) and run the test suite on CPU.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check -r requirements-cpu.txt -e '.[dev]'
export CI="${CI:-true}"   # loads the derandomized 'ci' Hypothesis profile
python3 -m ruff check fuzz strategies tests
python3 -m ruff format --check fuzz strategies tests
python3 -m mypy
python3 -m pytest -n 2 "$@"
