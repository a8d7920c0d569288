#!/usr/bin/env bash
# The NCCL checks, for a host with >= 2 GPUs: the pool's failure handling on NCCL, the
# benchmark, a campaign with its report, two pools side by side on disjoint GPUs, and the
# health benchmark. Logs and reports go to $OUT if set (else reports/gpu).
# Then the checkpoint paths on NCCL: FSDP1 under the state-dict functions and DCP (app, patched,
# the classic recipe, rank0_only) and a dcp + state_dict campaign.
# Knobs: PYTEST_FILES, BENCH_CASES (0 skips), EXPLORE_BUDGET, POOLS_BUDGET, HEALTH_CASES (0 skips),
# CHECKPOINT_BUDGET (0 skips the checkpoint part).
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
out="${OUT:-reports/gpu}"; mkdir -p "$out"
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$out/install.log" 2>&1 || echo "editable install failed; see install.log"
gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())')
python3 -c 'import torch, hypothesis; print("torch", torch.__version__, "gpus", torch.cuda.device_count(), "hypothesis", hypothesis.__version__)'
cp -r corpus "$out/corpus"
CI=true python3 -m pytest -q -p no:cacheprovider ${PYTEST_FILES:-tests/test_parity.py tests/test_nccl.py} --shardfuzz-backend nccl 2>&1 | tee "$out/pytest-nccl.log" | tail -15
if [ "${BENCH_CASES:-200}" != 0 ]; then
    python3 -m fuzz bench --backend nccl --world-size 2 --cases "${BENCH_CASES:-200}" --spawn-cases 3 2>&1 | tee "$out/bench-nccl.log" | tail -5
fi
python3 -m fuzz explore --backend nccl --world-size 2 --budget "${EXPLORE_BUDGET:-60}" --seed 1 --no-database \
    --corpus "$out/corpus" --report "$out/report-1pool" 2>&1 | tail -6
# two pools side by side, each on its own GPUs (world size 1 each on a 2-GPU host)
per_pool=$(( gpus / 2 )); [ "$per_pool" -ge 1 ] || per_pool=1
python3 -m fuzz explore --backend nccl --world-size "$per_pool" --pools 2 --budget "${POOLS_BUDGET:-40}" --seed 2 \
    --no-database --corpus "$out/corpus" --report "$out/report-2pools" 2>&1 | tail -6
grep -h "ranks on" "$out"/report-2pools/pool-*/explore.log | head -4
if [ "${HEALTH_CASES:-300}" != 0 ]; then
    python3 -m fuzz.health --backend nccl --world-size 2 --cases "${HEALTH_CASES:-300}" --marks "50,${HEALTH_CASES:-300}" 2>&1 | tee "$out/health-nccl.log" | tail -12
fi
if [ "${CHECKPOINT_BUDGET:-120}" != 0 ]; then
    CI=true python3 -m pytest -q -p no:cacheprovider tests/test_state_dict_fsdp1.py tests/test_state_dict_fsdp1_dsd.py \
        tests/test_state_dict_fsdp1_dcp.py --shardfuzz-backend nccl 2>&1 | tee "$out/pytest-checkpoint-nccl.log" | tail -8
    python3 -m fuzz explore --backend nccl --world-size 2 --budget "${CHECKPOINT_BUDGET:-120}" --seed 3 --no-database \
        --property dcp --property state_dict --corpus "$out/corpus" --report "$out/report-checkpoint" 2>&1 | tail -8
fi
