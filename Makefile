# tfamp_rewrite — every target installs what it needs; nothing is done by hand.
#
#   make demo    run the main demo (creates .venv and installs on first use)
#   make test    lint + the whole test suite (what CI runs), the 2-process Horovod tests included,
#                then the session, training, examples, doctor and CLI tests again with TF1 behaviour
#   make bench   the benchmarks in benchmarks/ (ratios, printed as tables)
#   make test-gpu  the fused op's CUDA kernel on this machine's GPU (without one: says so, exits 0)
#   make test-tf115  the checks against TensorFlow 1.15 itself (part of make test)
#   make test-tf1-behavior  the TF1-behaviour pass (part of make test)
#   make test-avx2 the suite as an AVX2-only machine sees it, on any x86-64 machine
#   make fuzz    20 000 damaged saved graphs through tfamp-rewrite convert (FUZZ_CASES=N for more or less)
#
# Another TensorFlow for a compatibility run, in its own virtualenv:
#   make test VENV=.venv-tf221 TF_PACKAGE="tensorflow-cpu==2.21.0 tf-keras"

PYTHON     ?= python3
VENV       ?= .venv
TF_PACKAGE ?= tensorflow-cpu==2.15.1
PY         := $(VENV)/bin/python
PIP        := $(PY) -m pip
# What the installed environment was made from; a change reinstalls.
DEPS_KEY   := $(TF_PACKAGE) | $(shell cat setup.py | cksum)
STAMP      := $(VENV)/.tfamp-deps
PYTEST_ARGS ?=
# Horovod for the distributed tests: PyPI has only its source, built here against the
# installed TensorFlow (--no-build-isolation) for Gloo on CPU. Minutes once; pip's wheel
# cache makes later installs fast. tests/support/horovod_support.py knows which TensorFlow it cannot
# build against; the distributed tests skip there, with the same reason.
HOROVOD_VERSION := 0.28.1
HOROVOD_STAMP   := $(VENV)/.tfamp-horovod
HOROVOD_BUILD   := HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
                   HOROVOD_WITHOUT_MPI=1 HOROVOD_WITH_GLOO=1 HOROVOD_CPU_OPERATIONS=GLOO MAKEFLAGS=-j2 \
                   $(PIP) install -q --no-build-isolation horovod==$(HOROVOD_VERSION)

export TF_CPP_MIN_LOG_LEVEL ?= 1
# TensorFlow >= 2.16 serves tf.compat.v1.layers from Keras 2 (tf-keras) only with this set.
# Only where tf-keras is installed: without it, TensorFlow 2.15's tf.keras fails to import.
ifneq ($(findstring tf-keras,$(TF_PACKAGE))$(findstring tf_keras,$(TF_PACKAGE)),)
export TF_USE_LEGACY_KERAS ?= 1
endif
# An editable install does not place setup.py's start-up .pth file; copy it ourselves.
export INSTALL_STARTUP_HOOK = import shutil, sysconfig; shutil.copy("tfamp_rewrite_startup.pth", sysconfig.get_paths()["purelib"])

.PHONY: venv horovod op lint test test-tf115 test-tf1-behavior test-avx2 test-gpu demo bench fuzz clean

venv:
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@if [ "$$(cat $(STAMP) 2>/dev/null)" != "$(DEPS_KEY)" ]; then \
	  echo "installing $(TF_PACKAGE) and the package into $(VENV)"; \
	  $(PIP) install -q --upgrade pip setuptools wheel && \
	  $(PIP) install -q $(TF_PACKAGE) -e ".[test]" && \
	  $(PY) -c "$$INSTALL_STARTUP_HOOK" && \
	  echo "$(DEPS_KEY)" > $(STAMP); \
	fi

# A wheel in pip's cache may have been built against another TensorFlow (it is keyed by the
# source only): if the installed Horovod does not load, it is rebuilt without the cache.
horovod: venv
	@if [ "$$(cat $(HOROVOD_STAMP) 2>/dev/null)" != "$(DEPS_KEY)" ]; then \
	  if ! reason=$$($(PY) tests/support/horovod_support.py); then echo "horovod: not installed: $$reason"; \
	  else \
	    echo "installing Horovod $(HOROVOD_VERSION) built against $(TF_PACKAGE) into $(VENV) (minutes, once)"; \
	    $(HOROVOD_BUILD) && \
	    { $(PY) -c "import horovod.tensorflow" 2>/dev/null || \
	      $(HOROVOD_BUILD) --force-reinstall --no-deps --no-cache-dir; } && \
	    $(PY) -c "import horovod.tensorflow" && echo "$(DEPS_KEY)" > $(HOROVOD_STAMP); \
	  fi; \
	fi

op: venv
	$(PY) -m tfamp_rewrite.fused_op.build

lint: venv
	$(PY) -m ruff check tfamp_rewrite tfamp_rewrite_startup.py tests setup.py benchmarks examples
	$(VENV)/bin/vermin -q --no-tips --violations -t=3.7- --eval-annotations --backport dataclasses \
	  tfamp_rewrite tfamp_rewrite_startup.py setup.py tests examples benchmarks

# Three runs at once, so that both cores stay busy to the end: the main pass and the
# TF1-behaviour pass, each over TEST_WORKERS worker processes (pytest-xdist; whole modules go
# to a worker, so a module's fixtures are built once, longest modules first: tests/conftest.py),
# and the TensorFlow 1.15 checks.  Their outputs follow one another; any failing fails the target.
TEST_WORKERS ?= 2
XDIST        := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder)
TF1_BEHAVIOR_LOG := .pytest-tf1-behavior.log
TF115_LOG        := .pytest-tf115.log
test: venv op lint horovod
	@$(PY) tests/support/tf115_wheel.py
	@$(TF115_PYTEST) > $(TF115_LOG) 2>&1 & tf115=$$!; \
	$(PY) -m pytest $(XDIST) --tf1-behavior $(TF1_BEHAVIOR_TESTS) $(PYTEST_ARGS) > $(TF1_BEHAVIOR_LOG) 2>&1 & tf1=$$!; \
	$(PY) -m pytest $(XDIST) --ignore=tests/tf115 $(PYTEST_ARGS); main=$$?; \
	wait $$tf1; tf1_status=$$?; wait $$tf115; tf115_status=$$?; \
	echo "== the same tests with TF1 behaviour (pytest --tf1-behavior $(TF1_BEHAVIOR_TESTS))"; \
	cat $(TF1_BEHAVIOR_LOG); rm -f $(TF1_BEHAVIOR_LOG); \
	echo "== the checks against TensorFlow 1.15 (pytest tests/tf115)"; \
	cat $(TF115_LOG); rm -f $(TF115_LOG); \
	test $$main -eq 0 -a $$tf1_status -eq 0 -a $$tf115_status -eq 0

# TF1 programs' behaviour (reference variables, Switch/Merge and Enter/Exit control flow, graph
# mode) on this TensorFlow: tf.compat.v1.disable_v2_behavior() before any test module loads.
# TensorFlow 1.15's own Python needs Python <= 3.7, which no registry here offers.
TF1_BEHAVIOR_TESTS ?= tests/training tests/examples tests/doctor tests/saved_graph
test-tf1-behavior: venv op horovod
	$(PY) -m pytest $(XDIST) --tf1-behavior $(TF1_BEHAVIOR_TESTS) $(PYTEST_ARGS)

# TensorFlow 1.15 itself (tests/tf115): the fused op built against its headers, graphs run in
# its runtime through its C API, our TensorFlow names looked up in its API. Its wheel
# (tensorflow==1.15.5, 106 MB; TFAMP_TF115_REQUIREMENT picks another) is downloaded from PyPI
# once and cached in ~/.cache/tfamp_rewrite/tf1.15; without network access the first time,
# this fails and says so.
TF115_PYTEST = $(PY) -m pytest tests/tf115 $(PYTEST_ARGS)
test-tf115: venv
	$(PY) tests/support/tf115_wheel.py
	$(TF115_PYTEST)

# An AVX2-only CPU's view on an AVX-512 machine, as far as TensorFlow lets it be masked:
# oneDNN off (its bfloat16 AMP pass and kernels need AVX-512; the tests that use them skip
# and say why), oneDNN capped at AVX2 for anything still reaching it, and the fused op's
# CPU kernel on its AVX2 path. (ONEDNN_MAX_CPU_ISA alone is not enough: TensorFlow picks
# oneDNN's bfloat16 kernels by the real CPU, which then crash.)
test-avx2:
	TF_ENABLE_ONEDNN_OPTS=0 ONEDNN_MAX_CPU_ISA=AVX2 TFAMP_CPU_ISA=avx2 $(MAKE) test

# The machine's own python3 (with numpy) and nvcc, no virtualenv: GPU machines need no
# TensorFlow. Correctness, bandwidth against cudaMemcpy, compute-sanitizer (tests/gpu/).
test-gpu:
	$(PYTHON) tests/gpu/gpu_check.py $(GPU_CHECK_ARGS)

demo: venv op
	$(PY) examples/demo.py

# The long run of tests/saved_graph/test_cli_fuzz.py: a table of outcomes per format; exit 1 on any
# violation of the command line's contract (tests/support/cli_fuzz.py says which).
FUZZ_CASES ?= 20000
fuzz: venv
	$(PY) tests/support/cli_fuzz.py --cases $(FUZZ_CASES)

bench: venv op horovod
	for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf build dist *.egg-info .pytest_cache out
