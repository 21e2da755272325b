"""Running the bundled examples under ``gradguard run`` for the expected-output tests.

Buggy examples run one subprocess each (exactly what a user runs), in parallel. Fixed examples only have
to run clean, so they share one subprocess that calls the CLI entry point once per script: PyTorch's and
Dynamo's import time (~3 s per process on a 2-core machine) is paid once instead of 21 times.

Under pytest-xdist each worker is a process of its own, and the tests of one module are spread over the workers:
the runs are made once per test session all the same, by the first worker that asks, and the other workers read
them from a file in the workers' common temporary folder (SHARED_DIR, set by tests/fast/conftest.py).
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from gradguard.report import read_findings

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = REPO_ROOT / "examples"
EXPECTED_DIR = REPO_ROOT / "tests" / "expected"
SEED_BLOG = EXAMPLES / "seed000" / "rnn_blog.py"
BUGGY = [SEED_BLOG, *sorted((EXAMPLES / "inplace").glob("*_buggy.py"))]
FIXED = [EXAMPLES / "seed000" / "rnn_fixed.py", *sorted((EXAMPLES / "inplace").glob("*_fixed.py"))]
_TIMEOUT_S = 300  # generous: the machine may be shared; a hang still fails


@dataclass
class Run:
    script: Path
    returncode: int
    findings: list = field(default_factory=list)
    stdout: str = ""
    stderr: str = ""

    @property
    def relative(self) -> str:
        return self.script.relative_to(REPO_ROOT).as_posix()


def _env() -> dict:
    return {**os.environ, "PYTHONHASHSEED": "0", "COLUMNS": "110"}


def run_one(script: Path) -> Run:
    """``python -m gradguard run --json FILE script`` from the repository root (paths come out relative)."""
    with tempfile.TemporaryDirectory() as tmp:
        json_path = os.path.join(tmp, "findings.json")
        done = subprocess.run(
            [sys.executable, "-m", "gradguard", "run", "--json", json_path, script.relative_to(REPO_ROOT).as_posix()],
            cwd=REPO_ROOT, capture_output=True, text=True, env=_env(), timeout=_TIMEOUT_S,
        )
        findings = read_findings(json.loads(Path(json_path).read_text())) if os.path.exists(json_path) else []
    return Run(script, done.returncode, findings, done.stdout, done.stderr)


_CACHE: dict[Path, Run] = {}  # one run per script per test session: test modules share the results
SHARED_DIR: Path | None = None  # under pytest-xdist: the folder the workers share (tests/fast/conftest.py)


def run_all(buggy: list[Path], fixed: list[Path]) -> dict[Path, Run]:
    """Buggy scripts in parallel subprocesses and the fixed ones' batch, all at once; cached, and shared with the
    other xdist workers through SHARED_DIR: one worker runs a script, the others wait for its result."""
    if SHARED_DIR is None:
        return _run_missing(buggy, fixed)
    store = Path(SHARED_DIR) / "gradguard-example-runs.json"
    with open(Path(SHARED_DIR) / "gradguard-example-runs.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # released when the file closes, also if a run raises
        if store.exists():
            for entry in json.loads(store.read_text()):
                _CACHE.setdefault(Path(entry["script"]), Run(**{**entry, "script": Path(entry["script"])}))
        runs = _run_missing(buggy, fixed)
        partial = store.with_suffix(".partial")
        partial.write_text(json.dumps([{**vars(run), "script": str(run.script)} for run in _CACHE.values()]))
        partial.replace(store)
    return runs


def _run_missing(buggy: list[Path], fixed: list[Path]) -> dict[Path, Run]:
    """Buggy scripts in parallel subprocesses and the fixed ones' batch, all at once; cached."""
    todo = [s for s in buggy if s not in _CACHE]
    todo_fixed = [s for s in fixed if s not in _CACHE]
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        batch = pool.submit(run_batch, todo_fixed) if todo_fixed else None
        _CACHE.update(zip(todo, pool.map(run_one, todo)))
        if batch is not None:
            _CACHE.update(batch.result())
    return {s: _CACHE[s] for s in [*buggy, *fixed]}


# The demo's runner (examples/run_examples.py) and these tests run fixed examples the same way: one script.
_spec = importlib.util.spec_from_file_location("_gradguard_run_examples", EXAMPLES / "run_examples.py")
_run_examples = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_run_examples)
_BATCH = _run_examples._BATCH


def run_batch(scripts: list[Path]) -> dict[Path, Run]:
    """Run each script through ``gradguard.cli.main(["run", "--json", ...])`` in one shared subprocess."""
    relative = [s.relative_to(REPO_ROOT).as_posix() for s in scripts]
    done = subprocess.run([sys.executable, "-c", _BATCH, *relative], cwd=REPO_ROOT, capture_output=True, text=True,
                          env=_env(), timeout=_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"the batch runner itself failed:\n{done.stderr}")
    raw = json.loads(done.stdout.strip().splitlines()[-1])
    return {s: Run(s, raw[r]["returncode"], raw[r]["findings"], raw[r]["stdout"], raw[r]["stderr"])
            for s, r in zip(scripts, relative)}


def panel_message(stderr: str) -> str:
    """The finding as the user reads it: the title line (error type) and the finding's text.

    Captured output is not a terminal, so gradguard writes the plain-text form: ``gradguard: <Error>`` and
    the finding's text, ended by a blank line. A rich panel (a terminal, or FORCE_COLOR) is read too, frame
    removed. Either way the body is ``render_finding`` (the exception message) line for line.
    """
    lines = stderr.splitlines()
    top = next((i for i, line in enumerate(lines) if line.startswith("╭")), None)
    if top is not None:
        bottom = next((i for i in range(top + 1, len(lines)) if lines[i].startswith("╰")), None)
        if bottom is None:
            return ""
        title = lines[top].strip("╭─ ").split(" ─")[0].strip()
        body = [line[2:].rstrip("│").rstrip() for line in lines[top + 1:bottom]]
        return "\n".join([title, *body]) + "\n"
    top = next((i for i, line in enumerate(lines) if re.match(r"gradguard: \w+(Error|Warning)\b", line)), None)
    if top is None:
        return ""
    bottom = next((i for i in range(top + 1, len(lines)) if not lines[i].strip()), len(lines))
    return "\n".join(lines[top:bottom]) + "\n"


# The expected files are written with the pinned torch (requirements-dev.txt). On the other torch releases the
# CI tests (oldest and newest declared), torch's own details differ: line numbers inside torch's sources, and the
# aten overload a Python statement dispatches to (`p[p < 0.1] = 0` is index_put_ on 2.13, masked_fill_ on 2.15).
# There the messages are compared with those details masked and line wrapping ignored; everything gradguard
# writes itself must still match word for word.
def comparable(message: str) -> str:
    import torch

    if torch.__version__.split("+")[0] == "2.13.0":
        return message
    message = re.sub(r"(torch/\S+\.py):\d+", r"\1:N", message)
    message = re.sub(r"aten\.[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)?", "aten.<op>", message)
    return " ".join(message.split())


def line_of(script: Path, code: str) -> int:
    """1-based number of the first line of ``script`` whose stripped text starts with ``code``."""
    for number, text in enumerate(script.read_text().splitlines(), 1):
        if text.strip().startswith(code):
            return number
    raise AssertionError(f"{code!r} not found in {script}")
