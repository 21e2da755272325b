"""Terminal manners of the finding panel, on a real pseudo-terminal: it fits 80 and 120 columns, it is plain
text (no box characters, no colour) when piped or under ``TERM=dumb``, and ``NO_COLOR`` turns colour off."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

from rich.cells import cell_len

REPO_ROOT = Path(__file__).resolve().parents[2]
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_BOX = set("╭╮╰╯│─")

# One process (torch imported once): a real guard finding, printed by the same function `gradguard run` uses,
# once per terminal setting. The pseudo-terminal's width is changed between prints, as a user resizing would.
_CHILD = r"""
import fcntl, os, struct, sys, termios
import torch, gradguard
from gradguard.report.text import print_findings

x = torch.randn(4, 4, requires_grad=True)
try:
    with gradguard.guard():
        scores = torch.sigmoid(x @ x)
        scores.mul_(0.5)
        scores.sum().backward()
except gradguard.GradientHazardError as error:
    finding = error.finding
for setting in sys.argv[1:]:
    columns, _, env = setting.partition(":")
    fcntl.ioctl(2, termios.TIOCSWINSZ, struct.pack("HHHH", 40, int(columns), 0, 0))
    for name in ("NO_COLOR", "TERM"):
        os.environ.pop(name, None)
    if env:
        name, _, value = env.partition("=")
        os.environ[name] = value
    print(f"=== {setting}", file=sys.stderr, flush=True)
    print_findings([finding], sys.stderr, "InplaceModificationError")
    sys.stderr.flush()
"""


def _run_in_pty(argv: list[str], columns: int = 80, env: dict | None = None) -> str:
    """Run ``argv`` with stdin/stdout/stderr on a pseudo-terminal of ``columns`` columns; return what it printed."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    environment = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR")}
    environment.update({"TERM": "xterm-256color", "OMP_NUM_THREADS": "1", **(env or {})})
    process = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, cwd=REPO_ROOT, env=environment,
                               close_fds=True)
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    assert process.wait(timeout=120) is not None
    return b"".join(chunks).decode("utf-8", "replace").replace("\r\n", "\n")


def _sections(output: str) -> dict[str, str]:
    parts = re.split(r"^=== (\S+)\n", output, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def _widest(text: str) -> int:
    return max(cell_len(_ANSI.sub("", line)) for line in text.splitlines())


def test_panel_fits_the_terminal_and_follows_no_color_and_dumb_terminals():
    settings = ["80", "120", "80:NO_COLOR=1", "120:TERM=dumb"]
    output = _run_in_pty([sys.executable, "-c", _CHILD, *settings])
    sections = _sections(output)
    assert sorted(sections) == sorted(settings), output

    narrow, wide = sections["80"], sections["120"]
    for text, columns in ((narrow, 80), (wide, 120)):
        assert "╭─ gradguard: InplaceModificationError" in _ANSI.sub("", text)
        assert _widest(text) <= columns, text
        assert _ANSI.search(text), "a colour terminal gets colour"
    assert _widest(narrow) > 70, "the text uses the width it has"
    assert 90 < _widest(wide) <= 104, "at most the exception message's 100 columns plus the frame"
    plain_narrow = [_ANSI.sub("", line)[2:].rstrip("│ ") for line in narrow.splitlines()[1:-1]]
    assert "saved for backward" in " ".join(plain_narrow)

    no_color = sections["80:NO_COLOR=1"]
    assert "╭─ gradguard" in _ANSI.sub("", no_color)
    assert not re.search(r"\x1b\[[0-9;]*3\dm", no_color), "NO_COLOR: no foreground colour"

    dumb = sections["120:TERM=dumb"]
    assert not (_BOX & set(dumb)), dumb
    assert not _ANSI.search(dumb)
    assert dumb.startswith("gradguard: InplaceModificationError\n")


def test_gradguard_run_on_an_80_column_terminal_and_piped():
    script = "examples/inplace/05_scale_tanh_output_buggy.py"
    command = [sys.executable, "-m", "gradguard", "run", "--mode", "sentinel", script]
    on_terminal = _run_in_pty(command, columns=80)
    assert "╭─ gradguard: InplaceModificationError" in _ANSI.sub("", on_terminal), on_terminal
    panel = _ANSI.sub("", on_terminal).split("╭", 1)[1]  # the traceback above is Python's paths, not ours
    assert _widest("╭" + panel) <= 80, on_terminal

    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    piped = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, env=env, timeout=120)
    assert piped.returncode == 1
    assert not (_BOX & set(piped.stderr)), piped.stderr
    assert not _ANSI.search(piped.stderr)
    assert "\ngradguard: InplaceModificationError\na tensor saved for backward" in piped.stderr
