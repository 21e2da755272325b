"""The automatic forensic re-run of `gradguard run`: announced before it starts, bounded in time, skippable,
started from the original directory, never waiting on stdin, and interruptible (SIGINT/SIGTERM kill the child
and still print and write the first run's finding). Report paths are checked before the script runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from gradguard.report.json import read_findings

GRADGUARD = [sys.executable, "-m", "gradguard", "run"]
ANNOUNCE = "gradguard: re-running script.py with write tracking to name the writer"

# The hazard (exp's saved output written by `+=`), after a side effect that makes the *second* run slow: the
# marker file exists only once the first run has passed this point.
HAZARD = """
    import os, sys, time
    {prelude}
    if os.path.exists("marker"):
        open("rerun.pid.part", "w").write(str(os.getpid()))  # closed at once (refcount)
        os.replace("rerun.pid.part", "rerun.pid")  # whole or absent: a signal cannot find it empty
        time.sleep({second_run_sleep})
    open("marker", "w").close()
    import torch
    torch.manual_seed(0)
    x = torch.randn(3, requires_grad=True)
    y = x.exp()
    y += 1
    y.sum().backward()
"""


def _script(tmp_path, prelude="", second_run_sleep=0):
    body = textwrap.dedent(HAZARD).format(prelude=prelude, second_run_sleep=second_run_sleep)
    (tmp_path / "script.py").write_text(body)


def _run(tmp_path, *args, stdin=None):
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    return subprocess.run([*GRADGUARD, *args], cwd=tmp_path, capture_output=True, text=True, env=env,
                          timeout=180, input=stdin)


def _writes(path):
    (finding,) = read_findings(json.loads(path.read_text()))
    return [(w["op"], w["line"]) for w in finding["modified_at"]], finding["notes"]


def test_rerun_is_announced_once_and_names_the_writer(tmp_path):
    _script(tmp_path)
    result = _run(tmp_path, "--json", "out.json", "script.py")
    assert result.returncode == 1
    assert result.stderr.count(ANNOUNCE) == 1
    start = result.stderr.index(ANNOUNCE)  # one notice, wrapped at the width (80 columns in a pipe)
    announce = " ".join(result.stderr[start:result.stderr.index("Traceback")].split())
    assert "side effects happen again" in announce and "--no-rerun" in announce
    width = int(os.environ.get("COLUMNS") or 80)
    assert max(len(line) for line in result.stderr[start:result.stderr.index("Traceback")].splitlines()) <= width
    assert result.stderr.index(ANNOUNCE) < result.stderr.index("Traceback")  # before it starts, not after
    assert _writes(tmp_path / "out.json")[0] == [("aten.add_.Tensor", 13)]


def test_no_rerun_reports_the_sentinel_finding_without_running_twice(tmp_path):
    _script(tmp_path, prelude='open("runs", "a").write("run\\n")')
    result = _run(tmp_path, "--no-rerun", "--json", "out.json", "script.py")
    assert result.returncode == 1 and "InplaceModificationError" in result.stderr
    assert "re-running" not in result.stderr
    assert (tmp_path / "runs").read_text() == "run\n"  # the side effect happened once
    assert _writes(tmp_path / "out.json")[0] == []


def test_rerun_timeout_stops_the_child_and_keeps_the_first_finding(tmp_path):
    _script(tmp_path, second_run_sleep=60)
    started = time.monotonic()
    result = _run(tmp_path, "--rerun-timeout", "3", "--json", "out.json", "script.py")
    assert time.monotonic() - started < 50
    assert result.returncode == 1
    assert "gradguard: the re-run to name the writer was stopped after 3 s (--rerun-timeout)" in " ".join(
        result.stderr.split())
    writes, notes = _writes(tmp_path / "out.json")
    assert writes == [] and any("--rerun-timeout" in note for note in notes)
    _assert_dead(tmp_path)


def test_rerun_starts_in_the_original_directory_when_the_script_chdirs(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    _script(tmp_path, prelude='os.chdir("elsewhere")')
    result = _run(tmp_path, "--json", "out.json", "script.py")
    assert result.returncode == 1
    assert _writes(tmp_path / "out.json")[0] == [("aten.add_.Tensor", 13)]


def test_script_reading_stdin_first_run_gets_it_rerun_gets_empty_stdin(tmp_path):
    _script(tmp_path, prelude='print("read", repr(sys.stdin.read()))')
    result = _run(tmp_path, "--json", "out.json", "script.py", stdin="hello\n")
    assert result.returncode == 1
    assert result.stdout == "read 'hello\\n'\n"  # the re-run's stdout is not shown; it read '' and went on
    assert _writes(tmp_path / "out.json")[0] == [("aten.add_.Tensor", 13)]


def _assert_dead(tmp_path):
    pid = int((tmp_path / "rerun.pid").read_text())
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    pytest.fail("the re-run's child outlived gradguard")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_during_rerun_kills_child_and_reports_first_finding(tmp_path, signum):
    _script(tmp_path, second_run_sleep=120)
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([*GRADGUARD, "--json", "out.json", "script.py"], cwd=tmp_path, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (tmp_path / "rerun.pid").exists():  # the child is in its second run
        assert time.monotonic() < deadline and process.poll() is None, process.communicate()
        time.sleep(0.2)
    process.send_signal(signum)
    _out, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signum
    assert "gradguard: InplaceModificationError" in err and "ExpBackward0.result" in err
    assert _writes(tmp_path / "out.json")[0] == []
    _assert_dead(tmp_path)


@pytest.mark.parametrize("arguments, message", [
    (["--html", "script.py", "script.py"], "argument --html: expected a new report file, got 'script.py', which is "
                                           "the file being run or one of its arguments; gradguard never writes a "
                                           "report over an input file"),
    (["--json", "data.txt", "script.py", "data.txt"], "argument --json: expected a new report file, got 'data.txt'"),
    (["--json", "r", "--html", "r", "script.py"], "--json and --html name the same file 'r'"),
    (["--json", "missing/out.json", "script.py"], "argument --json: expected a file in an existing directory, got "
                                                  "'missing/out.json'"),
    (["--json", ".", "script.py"], "argument --json: expected a file name, got '.', which is a directory"),
])
def test_report_paths_are_checked_before_the_script_runs(tmp_path, arguments, message):
    _script(tmp_path)
    source = (tmp_path / "script.py").read_text()
    (tmp_path / "data.txt").write_text("data")
    result = _run(tmp_path, *arguments)
    assert result.returncode == 2
    assert result.stderr.startswith("usage: gradguard run")
    assert f"gradguard run: error: {message}" in " ".join(result.stderr.split())  # wrapped at the width
    assert not (tmp_path / "marker").exists()  # the script never ran
    assert (tmp_path / "script.py").read_text() == source and (tmp_path / "data.txt").read_text() == "data"


TWO_STALE = """
import torch
x = torch.randn(3, requires_grad=True)
a = x.exp()
b = x.sigmoid()
a += 1
b += 1
(a + b).sum().backward()
"""


def test_the_rerun_keeps_every_stale_tensor_it_found(tmp_path):
    # corpus 024, 025, 043: two tensors overwritten before one backward; PyTorch names one, the re-run finds both
    (tmp_path / "script.py").write_text(TWO_STALE)
    result = _run(tmp_path, "--json", "out.json", "script.py")
    assert result.returncode == 1
    findings = read_findings(json.loads((tmp_path / "out.json").read_text()))
    assert sorted((f["tensor"]["name"], [w["line"] for w in f["modified_at"]]) for f in findings) == [
        ("a", [6]), ("b", [7])]
