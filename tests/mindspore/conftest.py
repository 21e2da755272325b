# MindSpore tests run in .venv-mindspore (numpy<2, no torch, no paddle). A failed graph compile writes
# rank_0/om/analyze_fail.ir into the cwd: HOME and cwd go to temp dirs.
import os
import tempfile

os.environ["HOME"] = tempfile.mkdtemp(prefix="gg-ms-home-")

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    import mindspore as ms

    ms.set_context(mode=ms.PYNATIVE_MODE)
    yield
