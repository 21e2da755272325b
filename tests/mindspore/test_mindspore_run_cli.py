"""`gradguard run` in a venv that has MindSpore and no torch: the backend is chosen when the script imports
its framework, and the MindSpore finding comes out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from gradguard.report.json import read_findings


def test_mindspore_hazard_script_gives_the_mindspore_finding(tmp_path):
    (tmp_path / "hazard.py").write_text(textwrap.dedent("""
        import mindspore as ms
        import numpy as np
        from mindspore import Tensor, ops
        def step(x):
            y = x * 1
            z = ops.sin(y)
            y[0] = 10.0
            return z.sum()
        ms.grad(step)(Tensor(np.array([1.0, 2.0, 3.0]), ms.float64))
    """))
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "gradguard", "run", "--json", "out.json", "hazard.py"],
                            cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 1, result.stderr
    assert "No module named 'torch'" not in result.stderr
    assert "gradguard: SilentModificationError" in result.stderr
    (finding,) = read_findings(json.loads((tmp_path / "out.json").read_text()))
    assert finding["backend"] == "mindspore"
    assert (finding["saved_at"]["op"], finding["saved_at"]["line"]) == ("sin", 7)
    assert [(w["op"], w["line"]) for w in finding["modified_at"]] == [("mindspore.Tensor.__setitem__", 8)]


def test_mode_bisect_pins_a_write_no_mindspore_op_made(tmp_path):
    (tmp_path / "direct.py").write_text(textwrap.dedent("""
        import mindspore as ms
        import numpy as np
        from mindspore import Tensor, ops
        def step(x):
            y = x * 1
            z = ops.sin(y)
            y.asnumpy()[0] = 5.0
            return z.sum()
        ms.grad(step)(Tensor(np.array([1.0, 2.0, 3.0]), ms.float64))
    """))
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "gradguard", "run", "--mode", "bisect", "--json", "out.json",
                             "direct.py"], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 1, result.stderr
    assert "gradguard: SilentModificationError" in result.stderr
    (finding,) = read_findings(json.loads((tmp_path / "out.json").read_text()))
    assert (finding["backend"], finding["saved_at"]["line"]) == ("mindspore", 7)
    assert [w["line"] for w in finding["modified_at"]] == [8]
