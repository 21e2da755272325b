# Paddle tests run in .venv-paddle (no torch). `import paddle` writes $HOME/.cache/paddle: HOME and cwd go to a temp dir.
import os
import tempfile

import importlib.util
import warnings

# A bare `pytest` in another framework's venv collects this folder too: there paddle is missing (or only this
# folder answers to its name), so the folder is left out with a warning. `make test-paddle` runs it in .venv-paddle;
# under CI a missing paddle is an error, never a skip.
_spec = importlib.util.find_spec("paddle")
if (_spec is None or _spec.origin is None) and os.environ.get("CI") != "true":
    collect_ignore_glob = ["test_*.py"]
    warnings.warn("tests/paddle left out: paddle is not installed in this Python (make test-paddle runs them in .venv-paddle)")
else:
    _home = tempfile.mkdtemp(prefix="gg-paddle-home-")
    os.environ["HOME"] = _home

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    yield
    import paddle

    assert paddle.is_grad_enabled(), "a test left Paddle's autograd disabled"
