# The conformance machine runs in each backend's own venv (they cannot share a process): .venv (torch),
# .venv-paddle, .venv-mindspore (Makefile: test-torch, test-paddle, test-mindspore). This conftest knows which venv
# it is in from the venv's name, not from what imports, and deselects the other frameworks' cases: a case of this
# venv's framework whose framework is missing fails (a skip for a missing package would hide it).
import os
import pathlib
import sys
import tempfile

import pytest

VENV_FRAMEWORK = {".venv-paddle": "paddle", ".venv-mindspore": "mindspore"}.get(pathlib.Path(sys.prefix).name, "torch")
# a framework without a venv of its own -> the venv its cases run in (autograd is pure Python on numpy, installed in
# the torch venv by requirements-dev.txt)
HOST_VENV = {"autograd": "torch"}
HERE = pathlib.Path(__file__).parent

# torch-only modules (they import torch at the top)
collect_ignore = [] if VENV_FRAMEWORK == "torch" else ["test_engine_core.py"]

if VENV_FRAMEWORK != "torch":  # `import paddle` writes $HOME/.cache; a failed MindSpore compile writes into the cwd
    os.environ["HOME"] = tempfile.mkdtemp(prefix=f"gg-{VENV_FRAMEWORK}-home-")


def pytest_collection_modifyitems(config, items):
    kept, other = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        # a module of one framework's cases says so in FRAMEWORK (test_torch_conformance.py: "torch")
        module = getattr(getattr(item, "module", None), "FRAMEWORK", VENV_FRAMEWORK)
        here = HERE in pathlib.Path(str(item.fspath)).parents
        case = params.get("framework", module)
        (other if here and HOST_VENV.get(case, case) != VENV_FRAMEWORK else kept).append(item)
    if other:
        config.hook.pytest_deselected(items=other)
        items[:] = kept


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
