# Two commands do all set-up on a fresh machine:
#   make demo   creates .venv, installs gradguard and its pinned dev stack, shows the headline (under a minute)
#               (make examples: every bundled PyTorch example; make demo-all: also the PaddlePaddle and MindSpore
#               demos, ~3.7 GB of frameworks)
#   make test   installs everything (PyTorch stack; PaddlePaddle and MindSpore in their own venvs), runs every test
#               and the examples, and builds the documentation (make docs) with warnings as errors
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP_FLAGS := -q --disable-pip-version-check
# Two workers (pytest-xdist; most tests wait on a child Python process), longest-running tests balanced by work
# stealing. PYTEST_FLAGS="-q -ra" runs serially.
PYTEST_FLAGS ?= -q -ra -n 2 --dist worksteal
# CI (.ci/run sets CI=true) runs a selection that fits ~20 minutes on 2 cores: every backend and every test file,
# less the tests marked `exhaustive` (whole-corpus end-to-end runs that repeat what cheaper tests check on samples)
# and with the parity property test at 300 generated programs instead of 1000 (100 instead of 300 on the oldest and
# newest torch, whose runs repeat the pinned torch's). `make test` elsewhere runs all.
ifeq ($(CI),true)
SELECTION := -m "not exhaustive"
PARITY_EXAMPLES := 300
MATRIX_PARITY_EXAMPLES := 100
else
SELECTION :=
PARITY_EXAMPLES := 1000
MATRIX_PARITY_EXAMPLES := 300
endif

.PHONY: lint chromium install install-paddle install-mindspore demo examples demo-all docs docs-pictures test test-torch test-paddle \
	test-mindspore test-torch-oldest test-torch-newest bench clean

$(VENV)/.installed: pyproject.toml requirements-dev.txt requirements-integrations.txt requirements-docs.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install $(PIP_FLAGS) -r requirements-dev.txt -r requirements-integrations.txt -r requirements-docs.txt
	$(PY) -m pip install $(PIP_FLAGS) --no-deps -e .
	touch $@

install: $(VENV)/.installed

# Paddle and MindSpore conflict in one process (oneDNN symbols) and MindSpore needs numpy<2: one venv each.
.venv-paddle/.installed: pyproject.toml requirements-paddle.txt
	test -x .venv-paddle/bin/python || $(PYTHON) -m venv .venv-paddle
	.venv-paddle/bin/python -m pip install $(PIP_FLAGS) -r requirements-paddle.txt
	.venv-paddle/bin/python -m pip install $(PIP_FLAGS) --no-deps -e .
	touch $@

.venv-mindspore/.installed: pyproject.toml requirements-mindspore.txt
	test -x .venv-mindspore/bin/python || $(PYTHON) -m venv .venv-mindspore
	.venv-mindspore/bin/python -m pip install $(PIP_FLAGS) -r requirements-mindspore.txt
	.venv-mindspore/bin/python -m pip install $(PIP_FLAGS) --no-deps -e .
	touch $@

install-paddle: .venv-paddle/.installed
install-mindspore: .venv-mindspore/.installed

# The headline in under a minute after the install (torch on CPU, 2 cores): seed 000's finding and its verified
# fix, one silent write (Liger-Kernel's Triton cross entropy, run on CPU by Triton's interpreter), one check_op
# report and the HTML report's path (examples/demo.py). Every other example: make examples.
demo: install
	$(PY) examples/demo.py

# Every bundled PyTorch example under gradguard, each checked against what it must report (exit 1 otherwise).
# Under CI=true the first two parts are left out: the torch suite runs the same scripts and asserts more.
# tests/fast/test_examples_expected.py runs examples/run_examples.py's examples and asserts their messages
# exactly; tests/robustness/test_device_path.py::test_silent_examples_caught_on_the_device_path runs every
# examples/silent/*.py script plainly (exit 0, the silent-write message printed) and on the device path.
examples: install
	@if [ "$(CI)" = true ]; then echo "(CI: examples/run_examples.py's runs are in the torch suite)"; \
	else $(PY) examples/run_examples.py; fi
	@echo; echo "== silent writes (Triton kernels run on CPU under TRITON_INTERPRET=1) =="
	@if [ "$(CI)" = true ]; then echo "(CI: in the torch suite, tests/robustness/test_device_path.py)"; \
	else for f in examples/silent/*.py; do echo "--- $$f"; TRITON_INTERPRET=1 $(PY) $$f || exit 1; done; fi
	@echo; echo "== check_op =="
	@for f in $(filter-out examples/ops/kernels.py,$(wildcard examples/ops/[a-z]*.py)); do \
		echo "--- $$f"; TRITON_INTERPRET=1 $(PY) $$f || exit 1; done

# `make demo`, then the PaddlePaddle and MindSpore demos (each framework in its own venv).
demo-all: demo install-paddle install-mindspore
	@echo; echo "== seed 001 (PaddlePaddle) =="
	.venv-paddle/bin/python examples/seed001/paddle_inplace.py
	.venv-paddle/bin/python examples/seed001/paddle_check_op.py
	@echo; echo "== seed 003 (MindSpore) =="
	.venv-mindspore/bin/python examples/seed003/mindspore_custom_bprop.py

# The documentation site (MkDocs + Material, API reference by mkdocstrings), warnings are errors. Output: site/
docs: install
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

# Regenerate docs/img/*.png (the README's pictures) with headless Chromium.
docs-pictures: install chromium
	$(PY) docs/img/make_pictures.py

# The HTML report test renders the page in headless Chromium (a Debian package).
chromium:
	command -v chromium >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)

test-torch: install install-paddle chromium
	GRADGUARD_PARITY_EXAMPLES=$(PARITY_EXAMPLES) $(PY) -m pytest $(PYTEST_FLAGS) $(SELECTION) tests/fast tests/slow \
		tests/conformance tests/robustness

test-paddle: install-paddle
	.venv-paddle/bin/python -m pytest $(PYTEST_FLAGS) $(SELECTION) tests/paddle tests/conformance

test-mindspore: install-mindspore
	.venv-mindspore/bin/python -m pytest $(PYTEST_FLAGS) $(SELECTION) tests/mindspore tests/conformance

# The oldest and the newest torch the package declares (pyproject: torch>=2.4,<2.16), each in its own venv, on a
# subset that covers the guard, its diagnoses and rules, the CLI, check_op's regimes and the whole robustness suite;
# the rest of the suite, the examples and their exact messages run on the pinned 2.13.0 above. The parity property
# test runs 300 generated programs here (100 under CI=true: MATRIX_PARITY_EXAMPLES). PyPI has
# only CUDA builds of these (about 3 GB each with their libraries; they run on the CPU). pip on this machine may
# be capped at the releases on its disk (/etc/xdg/pip): the newest release is installed with that configuration
# switched off.
TORCH_MATRIX_TESTS := tests/fast/test_parity.py tests/fast/test_grad_read.py tests/fast/test_guard_lifecycle.py tests/fast/test_seed000.py \
	tests/fast/test_diagnosis_rules.py tests/fast/test_guard_composition.py tests/fast/test_callback_modes.py \
	tests/fast/test_fingerprint.py tests/fast/test_cli.py tests/fast/test_function_hygiene.py \
	tests/fast/test_zoo_no_false_findings.py tests/fast/test_module_inputs.py tests/fast/test_second_order.py \
	tests/fast/test_data_in_forward.py tests/fast/test_check_op_regimes.py tests/fast/test_call_gate.py \
	tests/fast/test_silent.py tests/fast/test_patching.py tests/fast/test_ledger.py tests/fast/test_eager_errors.py \
	tests/fast/test_no_graph.py \
	tests/robustness

.venv-torch-oldest/.installed: pyproject.toml requirements-torch-oldest.txt
	test -x .venv-torch-oldest/bin/python || $(PYTHON) -m venv .venv-torch-oldest
	.venv-torch-oldest/bin/python -m pip install $(PIP_FLAGS) -r requirements-torch-oldest.txt
	.venv-torch-oldest/bin/python -m pip install $(PIP_FLAGS) --no-deps -e .
	touch $@

.venv-torch-newest/.installed: pyproject.toml requirements-torch-newest.txt
	test -x .venv-torch-newest/bin/python || $(PYTHON) -m venv .venv-torch-newest
	PIP_CONFIG_FILE=/dev/null .venv-torch-newest/bin/python -m pip install $(PIP_FLAGS) -r requirements-torch-newest.txt
	.venv-torch-newest/bin/python -m pip install $(PIP_FLAGS) --no-deps -e .
	touch $@

test-torch-oldest: .venv-torch-oldest/.installed
	.venv-torch-oldest/bin/python -c "import torch; print('torch', torch.__version__)"
	GRADGUARD_PARITY_EXAMPLES=$(MATRIX_PARITY_EXAMPLES) .venv-torch-oldest/bin/python -m pytest $(PYTEST_FLAGS) $(SELECTION) $(TORCH_MATRIX_TESTS)

test-torch-newest: .venv-torch-newest/.installed
	.venv-torch-newest/bin/python -c "import torch; print('torch', torch.__version__)"
	GRADGUARD_PARITY_EXAMPLES=$(MATRIX_PARITY_EXAMPLES) .venv-torch-newest/bin/python -m pytest $(PYTEST_FLAGS) $(SELECTION) $(TORCH_MATRIX_TESTS)

# Every backend, each in its own venv (they cannot share a process); none is optional. Then the oldest and newest
# torch the package declares, the bundled examples, then the docs build.
# ruff's pyflakes rules (unused imports and variables, undefined names) on the package and its tests; mypy --strict
# on the framework-neutral core (pyproject.toml [tool.mypy]: its files and exceptions).
lint: install
	$(PY) -m ruff check src tests
	$(PY) -m mypy

test: lint coverage test-torch test-paddle test-mindspore test-torch-oldest test-torch-newest examples docs

# Line coverage of gradguard.core (pyproject.toml [tool.coverage]) by the in-process tests of the core, run serially
# once more under coverage: a report in the log, no threshold (~1 min; their pass/fail is test-torch's to decide, so
# a failure here only shows in the log). The torch suite itself is not measured: on Python 3.11 coverage traces with
# sys.settrace (sys.monitoring needs 3.12), which made these tests 1.8x slower and changed what bisect mode sees
# (tests/conformance's direct_memory_write case), and most tests run their code in a child Python.
COVERAGE_TESTS := tests/fast/test_ledger.py tests/fast/test_core_neutral.py tests/conformance/test_engine_core.py \
	tests/fast/test_fix_edits.py tests/fast/test_source_ast.py tests/fast/test_rules_intents.py \
	tests/fast/test_diagnosis_rules.py tests/fast/test_eager_rule_rows.py

.PHONY: coverage
coverage: install
	$(PY) -m coverage erase
	-$(PY) -m coverage run -m pytest -q -p no:cacheprovider -n 0 $(COVERAGE_TESTS)
	$(PY) -m coverage report

bench: install
	$(PY) benchmarks/run.py

clean:
	rm -rf $(VENV) .venv-paddle .venv-mindspore .venv-torch-oldest .venv-torch-newest site

# Real-world corpus (issue 12): score gradguard's diagnoses on reproductions of public bug reports;
# writes benchmarks/realworld/results.md and results.json (figures only; thresholds are asserted in tests).
.PHONY: corpus
corpus: install
	$(PY) benchmarks/realworld/score.py

# Kernel-bug corpus (issue 15): check_op on published kernel bugs, buggy and fixed versions;
# writes benchmarks/kernelbugs/results.md and results.json.
.PHONY: kernelbugs
kernelbugs: install
	$(PY) benchmarks/kernelbugs/score.py --jobs 2
