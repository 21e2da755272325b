"""Progress for long work: shown on stderr when it is a terminal (a real pseudo-terminal here), erased when
the work ends, and absent from piped output."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from test_report_terminal import REPO_ROOT, _ANSI, _run_in_pty

from gradguard.report.progress import progress, progress_enabled

_SCRIPT = textwrap.dedent("""
    import torch
    torch.manual_seed(0)
    w = torch.randn(64, 64, requires_grad=True)
    x = torch.randn(32, 64)
    opt = torch.optim.SGD([w], lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        a = torch.relu(x @ w)
        (a @ w).sum().backward()
        opt.step()
    print("script done")
""")


def test_advise_shows_progress_on_a_terminal_only(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT)
    command = [sys.executable, "-m", "gradguard", "advise", "--repeats", "1", "--no-allocator-check", str(script)]
    on_terminal = _ANSI.sub("", _run_in_pty(command, columns=100))
    assert "gradguard advise: recording the step" in on_terminal, on_terminal
    assert "timing 1/1" in on_terminal
    assert "verified proposal" in on_terminal  # the report follows the (erased) progress line

    env = {k: v for k, v in os.environ.items() if k != "GRADGUARD_PROGRESS"}
    piped = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, env=env, timeout=240)
    assert piped.returncode == 0, piped.stderr
    assert "recording the step" not in piped.stderr + piped.stdout
    assert "\x1b[" not in piped.stderr


def test_progress_is_a_no_op_off_a_terminal(tmp_path):
    with open(tmp_path / "log.txt", "w") as handle:
        assert not progress_enabled(handle)
        with progress("work", total=3, file=handle) as tracker:
            tracker.update("step 1", advance=1)
            assert not tracker.shown
    assert (tmp_path / "log.txt").read_text() == ""
