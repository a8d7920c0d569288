#!/usr/bin/env bash
# Set up (CPU torch, pinned) and run the main job: a short exploration campaign on CPU, gloo,
# 2 ranks. Failures go to ./corpus, a JSON summary to ./reports/latest. Extra arguments go to
# `python -m fuzz explore` (e.g. --budget 10m --seed 7).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check -r requirements-cpu.txt -e .
exec python3 -m fuzz explore --budget 120 --backend gloo --world-size 2 --corpus corpus --report reports/latest "$@"
