# posttrain: `make demo` sets everything up and runs the main job on the embedded
# default; `make test` sets everything up and runs the tests.
PYTHON ?= /usr/bin/python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
export OMP_WAIT_POLICY ?= PASSIVE

.PHONY: install demo test test-slow test-ray bench bench-peer lint clean

$(STAMP): pyproject.toml scripts/install_system.sh
	bash scripts/install_system.sh
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade "pip>=24"
	$(BIN)/pip install -q -e '.[all,dev]'
	touch $(STAMP)

install: $(STAMP)

# each demo run gets its own folder under runs/; the last line is the verdict (exit 1 on FAIL)
ifndef DEMO_RUN
DEMO_RUN := demo-$(shell date -u +%Y%m%d-%H%M%S)
endif
demo: install
	$(BIN)/posttrain train configs/default.yaml run.name=$(DEMO_RUN)
	@$(BIN)/python -m posttrain.model.demo runs/$(DEMO_RUN)

test: install
	$(BIN)/pytest -q

test-slow: install
	$(BIN)/pytest -q -m slow

test-ray: install
	$(BIN)/pytest -q -m ray

# ruff (lint rules in pyproject), mypy strict on the contracts, and the import-layer contracts
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: install
	$(BIN)/python bench/learning.py
	$(BIN)/python bench/generation.py

# bench/peer.py: posttrain against TRL's GRPOTrainer (issue 16). TRL lives in its own venv,
# pinned, with the project's torch (the CPU wheel) and transformers, and posttrain installed
# into it so the TRL side uses posttrain's tasks, chat template and verifiers.
PEER_VENV  := .venv-peer
PEER_STAMP := $(PEER_VENV)/.installed-stamp
PEER_PINS  := torch==2.13.0 transformers==5.23.0 trl==1.16.0 accelerate==1.15.0 datasets==5.2.0 py-spy==0.4.3

$(PEER_STAMP): pyproject.toml Makefile
	test -x $(PEER_VENV)/bin/python || $(PYTHON) -m venv $(PEER_VENV)
	$(PEER_VENV)/bin/pip install -q --upgrade "pip>=24"
	$(PEER_VENV)/bin/pip install -q $(PEER_PINS) -e .
	touch $(PEER_STAMP)

bench-peer: install $(PEER_STAMP)
	@echo "peer venv ready: $(BIN)/python bench/peer.py --seeds 0 1 2 --jobs 2 --report bench/results/peer.md"

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache .import_linter_cache
