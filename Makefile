# Two commands do all set-up on a fresh machine:
#   make demo   creates .venv, installs gradguard and its pinned dev stack, runs the bundled PyTorch examples
#               (make demo-all: also the PaddlePaddle and MindSpore demos, ~3.7 GB of frameworks)
#   make test   installs everything (PyTorch stack; PaddlePaddle and MindSpore in their own venvs), runs every test
#               and builds the documentation (make docs) with warnings as errors
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP_FLAGS := -q --disable-pip-version-check
PYTEST_FLAGS ?= -q -ra

.PHONY: chromium install install-paddle install-mindspore demo demo-all docs docs-pictures test test-torch test-paddle \
	test-mindspore bench clean

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

# The PyTorch demo first: minutes on a fresh machine (one venv, torch CPU), no other framework downloaded.
demo: install
	$(PY) examples/run_examples.py
	@echo; echo "== silent writes (Triton kernels run on CPU under TRITON_INTERPRET=1) =="
	@for f in examples/silent/*.py; do echo "--- $$f"; TRITON_INTERPRET=1 $(PY) $$f || exit 1; done
	@echo; echo "== check_op: seed 003's x*sin(x), Liger's cross entropy =="
	TRITON_INTERPRET=1 $(PY) examples/ops/xsin_seed003.py
	TRITON_INTERPRET=1 $(PY) examples/ops/liger_cross_entropy.py
	@echo; echo "== HTML report (the demo script fails on purpose) =="
	-$(PY) -m gradguard run --html gradguard-report.html examples/integrations/html_report_demo.py
	@echo; echo "PaddlePaddle and MindSpore demos: make demo-all (installs both frameworks in their own venvs)"

# Everything in `make demo`, then the PaddlePaddle and MindSpore demos (each framework in its own venv).
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
	$(PY) -m pytest $(PYTEST_FLAGS) tests/fast tests/slow tests/conformance tests/robustness

test-paddle: install-paddle
	.venv-paddle/bin/python -m pytest $(PYTEST_FLAGS) tests/paddle

test-mindspore: install-mindspore
	.venv-mindspore/bin/python -m pytest $(PYTEST_FLAGS) tests/mindspore

# Every backend, each in its own venv (they cannot share a process); none is optional. Then the docs build.
test: test-torch test-paddle test-mindspore docs

bench: install
	$(PY) benchmarks/run.py

clean:
	rm -rf $(VENV) .venv-paddle .venv-mindspore site

# Real-world corpus (issue 12): score gradguard's diagnoses on reproductions of public bug reports;
# writes benchmarks/realworld/results.md and results.json (figures only; thresholds are asserted in tests).
.PHONY: corpus
corpus: install
	$(PY) benchmarks/realworld/score.py
