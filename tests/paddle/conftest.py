# Paddle tests run in .venv-paddle (no torch). `import paddle` writes $HOME/.cache/paddle: HOME and cwd go to a temp dir.
import os
import tempfile

_home = tempfile.mkdtemp(prefix="gg-paddle-home-")
os.environ["HOME"] = _home

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    yield
    import paddle

    assert paddle.is_grad_enabled(), "a test left Paddle's autograd disabled"
