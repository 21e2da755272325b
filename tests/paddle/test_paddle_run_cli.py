"""`gradguard run` in a venv that has Paddle and no torch: the backend is chosen when the script imports its
framework (nothing imports torch), the Paddle finding comes out, and a missing framework is one line with
the install command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from gradguard.report.json import read_findings

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _gradguard(*args, cwd):
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "gradguard", "run", *args], cwd=cwd, capture_output=True,
                          text=True, env=env, timeout=300)


def test_paddle_hazard_script_gives_the_paddle_finding_with_the_writer(tmp_path):
    (tmp_path / "hazard.py").write_text(textwrap.dedent("""
        import paddle
        x = paddle.to_tensor([1.0, 2.0, 3.0], stop_gradient=False)
        y = x * 1
        z = y.sin()
        y.add_(paddle.to_tensor(1.0))
        z.sum().backward()
    """))
    result = _gradguard("--json", "out.json", "hazard.py", cwd=tmp_path)
    assert result.returncode == 1
    assert "torch" not in result.stderr.replace("torch ops", "")
    assert "gradguard: InplaceModificationError" in result.stderr
    (finding,) = read_findings(json.loads((tmp_path / "out.json").read_text()))
    assert finding["backend"] == "paddle"
    assert (finding["saved_at"]["op"], finding["saved_at"]["line"]) == ("sin", 5)
    assert [(w["op"], w["line"]) for w in finding["modified_at"]] == [("paddle.Tensor.add_", 6)]  # the re-run


def test_seed001_example_runs_under_gradguard_run(tmp_path):
    result = _gradguard(os.path.join(ROOT, "examples", "seed001", "paddle_inplace.py"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "No module named 'torch'" not in result.stderr
    assert "gradguard: PaddleLeafInplaceError" in result.stdout
    assert "a tensor saved for backward was modified in place before backward used it" in result.stdout
    # the script's own guard() logs writes under run's sentinel session, as torch's nested guard does
    assert "1. paddle.Tensor.add_ at " in result.stdout and "write tracking was off" not in result.stdout.split(
        "=== set_value")[0]
    assert "gradient: [ 120.51322  890.479   6579.799  ]" in result.stdout  # Paddle's own numbers unchanged


def test_missing_framework_is_one_line_with_the_install_command(tmp_path):
    (tmp_path / "uses_torch.py").write_text("print('start')\nimport torch\n")
    plain = subprocess.run([sys.executable, "uses_torch.py"], cwd=tmp_path, capture_output=True, text=True)
    result = _gradguard("uses_torch.py", cwd=tmp_path)
    assert (result.returncode, result.stdout) == (plain.returncode, plain.stdout) == (1, "start\n")
    assert result.stderr == plain.stderr + (f"gradguard: torch is not installed in this Python ({sys.executable}); "
                                            "install it with: python -m pip install torch\n")


def test_mode_bisect_pins_a_dlpack_write_to_its_line(tmp_path):
    (tmp_path / "direct.py").write_text(textwrap.dedent("""
        import numpy as np, paddle
        x = paddle.to_tensor([1.0, 2.0, 3.0], stop_gradient=False)
        y = x * 1
        z = y.sin()
        alias = np.from_dlpack(y.detach())
        alias[0] = 10.0
        z.sum().backward()
    """))
    result = _gradguard("--mode", "bisect", "--json", "out.json", "direct.py", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert "gradguard: SilentModificationError" in result.stderr
    assert "bisect mode saw its bytes change at direct.py:7" in " ".join(result.stderr.split())  # wrapped text
    (finding,) = read_findings(json.loads((tmp_path / "out.json").read_text()))
    assert (finding["backend"], finding["saved_at"]["line"]) == ("paddle", 5)
    assert [w["line"] for w in finding["modified_at"]] == [7]
