"""`gradguard run -m module`: Python's own words when the module cannot run, usage errors for a missing
program (exit 2)."""

from __future__ import annotations

import os
import subprocess
import sys

PYTHON = sys.executable


def _run(cmd, cwd):
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env, timeout=120)


def test_missing_module_reported_like_python(tmp_path):
    plain = _run([PYTHON, "-m", "no_such_module_xyz"], tmp_path)
    guarded = _run([PYTHON, "-m", "gradguard", "run", "-m", "no_such_module_xyz"], tmp_path)
    assert (guarded.returncode, guarded.stderr) == (plain.returncode, plain.stderr)
    assert guarded.stderr == f"{PYTHON}: No module named no_such_module_xyz\n"


def test_module_from_the_current_directory_with_arguments(tmp_path):
    (tmp_path / "tool.py").write_text("import sys\nprint(__name__, __spec__.name, sys.argv[1:])\n")
    plain = _run([PYTHON, "-m", "tool", "--flag", "-m", "x"], tmp_path)
    guarded = _run([PYTHON, "-m", "gradguard", "run", "-m", "tool", "--flag", "-m", "x"], tmp_path)
    assert (guarded.returncode, guarded.stdout) == (plain.returncode, plain.stdout) == (
        0, "__main__ tool ['--flag', '-m', 'x']\n")


def test_no_program_is_a_usage_error(tmp_path):
    for args in (["run"], ["run", "-m"]):
        result = _run([PYTHON, "-m", "gradguard", *args], tmp_path)
        assert result.returncode == 2
        assert result.stderr.startswith("usage: gradguard run")
        assert "gradguard run: error: " in result.stderr


def test_script_main_module_looks_like_pythons(tmp_path):
    (tmp_path / "script.py").write_text(
        "import sys\n"
        "print(type(__builtins__).__name__, __builtins__.len('ab'), sys.modules['__main__'].__dict__ is globals())\n"
        "print(__spec__, __package__, __file__ == sys.modules['__main__'].__file__)\n")
    plain = _run([PYTHON, "script.py"], tmp_path)
    guarded = _run([PYTHON, "-m", "gradguard", "run", "script.py"], tmp_path)
    assert (guarded.returncode, guarded.stdout) == (plain.returncode, plain.stdout) == (
        0, "module 2 True\nNone None True\n")
