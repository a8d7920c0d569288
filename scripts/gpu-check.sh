#!/usr/bin/env bash
# The NCCL checks, for a host with >= 2 GPUs: the end-to-end property on the nccl pool, the
# pool's failure handling on NCCL, the benchmark, and a short campaign. Logs go to $OUT if set.
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
out="${OUT:-reports/gpu}"; mkdir -p "$out"
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$out/install.log" 2>&1 || echo "editable install failed; see install.log"
python3 -c 'import torch, hypothesis; print("torch", torch.__version__, "gpus", torch.cuda.device_count(), "hypothesis", hypothesis.__version__)'
CI=true python3 -m pytest -q -p no:cacheprovider tests/test_parity.py tests/test_nccl.py --shardfuzz-backend nccl 2>&1 | tee "$out/pytest-nccl.log" | tail -15
python3 -m fuzz bench --backend nccl --world-size 2 --cases "${BENCH_CASES:-200}" --spawn-cases 3 2>&1 | tee "$out/bench-nccl.log" | tail -5
python3 -m fuzz explore --backend nccl --world-size 2 --budget "${EXPLORE_BUDGET:-60}" --seed 1 --corpus "$out/corpus" --report "$out/report" 2>&1 | tail -4
