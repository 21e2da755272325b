"""Every line gradguard writes fits the width it is given: at ``COLUMNS=80`` in a pipe, the output of ``run``
(re-run notice, traceback head, finding, HTML report path), ``fix`` (messages and diff), ``advise`` and
``check_op`` (text and rich panel) is at most 80 columns wide."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest

WIDTH = 80

HAZARD = """\
import torch

torch.manual_seed(0)
x = torch.randn(3, requires_grad=True)
y = x.exp()
y += 1
y.sum().backward()
"""

ADVISE = """\
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
h = torch.sigmoid(torch.randn(4, 8) * 2)
h = h + 1
loss = model(h).pow(2).sum()
opt.zero_grad()
loss.backward()
opt.step()
"""

CHECK_OP = """\
import torch
from rich.console import Console

import gradguard


class XSinWrong(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * torch.sin(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x * torch.cos(x)  # the product rule forgotten


torch.manual_seed(0)
report = gradguard.check_op(XSinWrong.apply, torch.randn(10, dtype=torch.float64),
                            reference=lambda x: x * torch.sin(x))
print(report)
Console().print(report)
"""


@pytest.fixture()
def short_dir():
    # A short path, so that Python's own traceback lines (which quote it) fit too; pytest's tmp_path may not.
    with tempfile.TemporaryDirectory(prefix="ggw", dir="/tmp") as folder:
        yield folder


def _run(folder, *command):
    env = {**os.environ, "COLUMNS": str(WIDTH), "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *command], cwd=folder, capture_output=True, text=True, env=env,
                          timeout=600, stdin=subprocess.DEVNULL)


def _too_wide(*texts):
    return [line for text in texts for line in text.splitlines() if len(line) > WIDTH]


def _write(folder, name, text):
    with open(os.path.join(folder, name), "w", encoding="utf-8") as handle:
        handle.write(text)


def test_run_output_fits(short_dir):
    _write(short_dir, "s.py", HAZARD)
    result = _run(short_dir, "-m", "gradguard", "run", "--html", "r.html", "s.py")
    assert result.returncode == 1, result.stderr
    assert "gradguard: re-running s.py" in result.stderr and "HTML report" in result.stderr
    assert _too_wide(result.stdout, result.stderr) == []


def test_fix_output_fits(short_dir):
    _write(short_dir, "s.py", HAZARD)
    result = _run(short_dir, "-m", "gradguard", "fix", "s.py")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("--- a/s.py\n") and "@@ -3," in result.stdout
    assert _too_wide(result.stdout, result.stderr) == []
    applied = subprocess.run(["patch", "-p1", "--dry-run"], input=result.stdout, cwd=short_dir, text=True,
                             capture_output=True)
    assert applied.returncode == 0, applied.stdout + applied.stderr  # a cut heading keeps the diff applicable


def test_advise_output_fits(short_dir):
    _write(short_dir, "a.py", ADVISE)
    result = _run(short_dir, "-m", "gradguard", "advise", "--repeats", "0", "--no-allocator-check", "a.py")
    assert result.returncode == 0, result.stderr
    assert "gradguard advise" in result.stdout
    assert _too_wide(result.stdout, result.stderr) == []


def test_check_op_text_and_panel_fit_in_a_pipe(short_dir):
    _write(short_dir, "c.py", CHECK_OP)
    result = _run(short_dir, "c.py")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("gradguard.check_op FAILED") == 2 and "╰" in result.stdout
    assert _too_wide(result.stdout) == []
    panel = result.stdout[result.stdout.index("╭"):].splitlines()
    assert all(line[0] in "╭│╰" and line[-1] in "╮│╯" for line in panel), "the border is whole"


def test_the_width_is_columns_else_the_terminal_else_80(monkeypatch, tmp_path):
    from gradguard.report.text import output_width, wrap_notice

    with open(tmp_path / "out.txt", "w") as not_a_terminal:
        monkeypatch.setenv("COLUMNS", "50")
        assert output_width(not_a_terminal) == 50
        notice = wrap_notice("word " * 40, file=not_a_terminal)
        assert max(len(line) for line in notice.splitlines()) <= 50 and notice.startswith("gradguard: word")
        monkeypatch.delenv("COLUMNS")
        assert output_width(not_a_terminal) == 80
