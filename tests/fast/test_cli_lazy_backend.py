"""`gradguard run` chooses the backend when the script imports its framework, not before: nothing is imported
on the script's behalf, the framework module keeps its own loader, and the guard is active from the import on
(also for `importlib.import_module`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from gradguard.report.json import read_findings

PYTHON = sys.executable


def _both(tmp_path, body, *options):
    (tmp_path / "script.py").write_text(textwrap.dedent(body))
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    plain = subprocess.run([PYTHON, "script.py"], cwd=tmp_path, capture_output=True, text=True, env=env,
                           timeout=120)
    guarded = subprocess.run([PYTHON, "-m", "gradguard", "run", *options, "script.py"], cwd=tmp_path,
                             capture_output=True, text=True, env=env, timeout=120)
    return plain, guarded


def test_no_framework_is_imported_before_the_script_imports_one(tmp_path):
    plain, guarded = _both(tmp_path, """
        import sys
        print(sorted(m for m in ("torch", "paddle", "mindspore", "numpy") if m in sys.modules))
        import torch
        print(type(torch.__loader__).__name__, torch.__spec__.loader is torch.__loader__)
        print("exec_module" in vars(torch.__loader__))
    """)
    assert guarded.returncode == plain.returncode == 0, guarded.stderr
    assert guarded.stdout == plain.stdout == "[]\nSourceFileLoader True\nFalse\n"


def test_guard_is_active_after_a_late_importlib_import(tmp_path):
    _plain, guarded = _both(tmp_path, """
        import importlib
        def train():
            torch = importlib.import_module("torch")
            x = torch.randn(3, requires_grad=True)
            y = x.sigmoid()
            y.mul_(2)
            y.sum().backward()
        train()
    """, "--mode", "forensic", "--json", "out.json")
    assert guarded.returncode == 1
    (finding,) = read_findings(json.loads((tmp_path / "out.json").read_text()))
    assert finding["backend"] == "torch" and finding["saved_at"]["op"] == "SigmoidBackward0.result"
    assert [(w["op"], w["line"]) for w in finding["modified_at"]] == [("aten.mul_.Tensor", 7)]


def test_script_without_a_framework_runs_unguarded_and_writes_an_empty_report(tmp_path):
    plain, guarded = _both(tmp_path, "import sys\nprint(sum(range(4)), 'torch' in sys.modules)\n",
                           "--json", "out.json")
    assert (guarded.returncode, guarded.stdout) == (plain.returncode, plain.stdout) == (0, "6 False\n")
    assert read_findings(json.loads((tmp_path / "out.json").read_text())) == []


def test_guard_that_cannot_start_never_fails_the_scripts_import(tmp_path):
    """A local module named like a framework (here torch.py next to the script): Python imports it, the guard
    cannot start on it; the script runs as under plain python and one line says the guard is off."""
    (tmp_path / "torch.py").write_text("VALUE = 42\n")
    plain, guarded = _both(tmp_path, "import torch\nprint(torch.VALUE)\n")
    assert (guarded.returncode, guarded.stdout) == (plain.returncode, plain.stdout) == (0, "42\n")
    line = " ".join(guarded.stderr.split())  # one notice, wrapped at the width
    assert line.startswith("gradguard: the guard could not start for torch (") and line.endswith(
        "); the script runs unguarded")
    width = int(os.environ.get("COLUMNS") or 80)
    assert guarded.stderr.startswith("gradguard: ") and all(len(row) <= width for row in guarded.stderr.splitlines())
