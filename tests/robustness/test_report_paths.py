"""A report path is checked before anything runs, the same way for ``run``, ``fix`` and ``advise``: never over the
script or a file named among its arguments, never into a missing directory; the error names the argument, what it
expects and what it got. A report that cannot be written after the run costs the report, not the exit code."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SCRIPT = """\
import pathlib
import torch

pathlib.Path("marker").write_text("ran")
x = torch.randn(3, requires_grad=True)
y = x.exp()
y += 1
y.sum().backward()
"""


def _gradguard(tmp_path, *args):
    env = {**os.environ, "COLUMNS": "300", "PYTHONWARNINGS": "ignore"}
    return subprocess.run([sys.executable, "-m", "gradguard", *args], cwd=tmp_path, capture_output=True, text=True,
                          env=env, timeout=300)


@pytest.mark.parametrize("arguments, message", [
    (["fix", "--html", "script.py", "script.py"], "argument --html: expected a new report file, got 'script.py', "
                                                  "which is the file being run"),
    (["fix", "--json", "script.py", "script.py"], "argument --json: expected a new report file, got 'script.py'"),
    (["fix", "--json", "data.txt", "script.py", "data.txt"], "argument --json: expected a new report file, got "
                                                             "'data.txt'"),
    (["fix", "--json", "missing/fix.json", "script.py"], "argument --json: expected a file in an existing directory,"
                                                         " got 'missing/fix.json'"),
    (["advise", "--json", "script.py", "script.py"], "argument --json: expected a new report file, got 'script.py'"),
    (["advise", "--json", "missing/a.json", "script.py"], "argument --json: expected a file in an existing "
                                                          "directory, got 'missing/a.json'"),
])
def test_fix_and_advise_never_write_a_report_over_an_input(tmp_path, arguments, message):
    (tmp_path / "script.py").write_text(SCRIPT)
    (tmp_path / "data.txt").write_text("data")
    result = _gradguard(tmp_path, *arguments)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "marker").exists(), "the check comes before any run"
    assert (tmp_path / "script.py").read_text() == SCRIPT and (tmp_path / "data.txt").read_text() == "data"


def test_a_report_lost_after_the_run_keeps_the_exit_code(tmp_path):
    # The script removes the report's directory while it runs: the report is lost and said so, exit code 0 stays.
    (tmp_path / "out").mkdir()
    (tmp_path / "clean.py").write_text("import shutil\nshutil.rmtree('out')\nprint('done')\n")
    result = _gradguard(tmp_path, "run", "--json", "out/r.json", "clean.py")
    assert (result.returncode, result.stdout) == (0, "done\n"), result.stderr
    assert "gradguard: could not write the --json report to" in result.stderr
    assert "Traceback" not in result.stderr


def test_fix_json_is_the_versioned_envelope(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    from gradguard.schemas import load_schema

    (tmp_path / "script.py").write_text(SCRIPT)
    result = _gradguard(tmp_path, "fix", "--json", "fix.json", "script.py")
    assert result.returncode in (0, 1), result.stderr
    document = json.loads((tmp_path / "fix.json").read_text())
    jsonschema.Draft202012Validator(load_schema("fix")).validate(document)
    assert (document["format_version"], document["tool"], document["report"]) == (2, "gradguard", "fix")
    assert [f["kind"] for f in document["findings"]] == ["inplace_modification"]
