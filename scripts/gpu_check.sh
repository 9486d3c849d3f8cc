#!/usr/bin/env bash
# The prepared GPU check, run in one call on a machine with a CUDA GPU, from the repository root:
#   scripts/gpu_check.sh            (writes $OUT/gpu_check.json when $OUT is set, else bench/results/gpu_check.json)
# 1. the tests marked gpu (CUDA trainer/engine paths against the CPU ones);
# 2. scripts/gpu_check.py: a short real loop on a randomly initialised Qwen2 of ~0.5B parameters
#    (no hub): generation tokens/s, seconds per training step, peak memory, loss curve, a LoRA step,
#    pinned-RNG repeatability. Each stage reports even when another fails;
# 3. scripts/gpu_check.py --stages vllm: the vllm engine (bf16 server and trainer on the 0.5B body):
#    tokens/s, push latency per transport, the verified-sync probe's gap; where the vLLM venv exists.
# Stages 1-2 take up to 600 s and stage 3 up to VLLM_TIMEOUT_S (300): where one device call may take at
# most 10 minutes, run stage 3 as a call of its own: scripts/gpu_check.py --stages vllm --out DIR/gpu_check_vllm.json
# Needs python with torch (CUDA build), transformers, peft, pydantic, pyyaml: .venv if present.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=${PYTHON:-python3}; fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
export CUBLAS_WORKSPACE_CONFIG=:4096:8
OUT_DIR=${OUT:-bench/results}
mkdir -p "$OUT_DIR"
"$PY" - <<'PY' || { echo "gpu_check: environment check failed (see above)"; exit 2; }
import importlib.util, sys
missing = [m for m in ("torch", "transformers", "peft", "pydantic", "yaml") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"gpu_check: missing {missing}")
import torch
print(f"torch {torch.__version__} cuda {torch.version.cuda} available={torch.cuda.is_available()}",
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
sys.exit(0 if torch.cuda.is_available() else "gpu_check: no CUDA device")
PY
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null | tee "$OUT_DIR/gpu_check_nvidia.txt"
rc=0
if "$PY" -c "import pytest" 2>/dev/null; then
  timeout 180 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/trainer tests/engine 2>&1 | tail -n 25 | tee "$OUT_DIR/gpu_check_pytest.txt" || rc=1
fi
timeout 420 "$PY" scripts/gpu_check.py --stages loop lora pinned --out "$OUT_DIR/gpu_check.json" "$@" 2>&1 | tee "$OUT_DIR/gpu_check_log.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
# 3. the vllm engine on CUDA (bf16, the 0.5B body): only where the vLLM venv exists (make vllm-venv, or
#    POSTTRAIN_VLLM_PYTHON); it cannot be carried to a machine without network (3.4 GB). Its own time limit.
VLLM_PY=${POSTTRAIN_VLLM_PYTHON:-.venv-vllm/bin/python}
if [ -x "$VLLM_PY" ]; then
  timeout "${VLLM_TIMEOUT_S:-300}" "$PY" scripts/gpu_check.py --stages vllm --out "$OUT_DIR/gpu_check_vllm.json" "$@" 2>&1 | tee "$OUT_DIR/gpu_check_vllm_log.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
else
  echo "gpu_check: vllm stage skipped: no vLLM venv at $VLLM_PY (make vllm-venv)" | tee "$OUT_DIR/gpu_check_vllm_log.txt"
fi
exit $rc
