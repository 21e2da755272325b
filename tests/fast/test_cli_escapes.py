"""Escape sequences in the user's source (ANSI colours, OSC window titles / hyperlinks, a backspace)
never reach the terminal through gradguard's output: quoted code lines show them as visible \\x1b escapes."""

from __future__ import annotations

import os
import subprocess
import sys


ESCAPES = "\x1b]0;owned\x07\x1b[2J\x1b[31m\x08"


def _hazard_script(tmp_path):
    (tmp_path / "script.py").write_text(
        "import torch\n"
        "x = torch.randn(3, requires_grad=True)\n"
        f"y = x.sigmoid()  # {ESCAPES}\n"
        f"y.mul_(2)  # {ESCAPES}\n"
        f"y.sum().backward()  # {ESCAPES}\n"
    )


def test_gradguard_run_output_has_no_control_characters(tmp_path):
    _hazard_script(tmp_path)
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "gradguard", "run", "--mode", "forensic", "script.py"],
                            cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 1 and "gradguard: InplaceModificationError" in result.stderr
    assert "\x1b" not in result.stderr and "\x07" not in result.stderr and "\x08" not in result.stderr
    assert "| y.mul_(2)  # \\x1b]0;owned\\x07\\x1b[2J\\x1b[31m\\x08" in result.stderr


def test_exception_message_and_pytest_summary_are_sanitised(pytester):
    pytester.makepyfile(test_escapes=(
        "import torch\n"
        "def test_hazard():\n"
        "    x = torch.randn(3, requires_grad=True)\n"
        f"    y = x.exp()  # {ESCAPES}\n"
        f"    y.add_(1)  # {ESCAPES}\n"
        "    y.sum().backward()\n"
    ))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--gradguard", timeout=300)
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert "| y.add_(1)  # \\x1b]0;owned" in text
    # gradguard's lines (quoted code, summary); pytest's own listing of the test source is pytest's business
    ours = [line for line in text.splitlines() if "| y" in line or line.startswith("    fix:")]
    assert len(ours) >= 2 and not any("\x1b" in line or "\x07" in line for line in ours), ours


pytest_plugins = ["pytester"]
