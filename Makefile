# posttrain: `make demo` sets everything up and runs the main job on the embedded
# default; `make test` sets everything up and runs the tests.
PYTHON ?= /usr/bin/python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
export OMP_WAIT_POLICY ?= PASSIVE

.PHONY: install demo test test-slow test-ray bench lint clean

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
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: install
	$(BIN)/python bench/learning.py
	$(BIN)/python bench/generation.py

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache .import_linter_cache
