"""``gradguard fix`` for pytest tests: ``gradguard fix -m pytest NODEID`` and ``pytest --gradguard-fix``, which
shows the verified diff under the finding (NOTE [Verifying an edit by re-running one test])."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

TEST_MODULE = """
    import torch


    def test_training_step():
        torch.manual_seed(0)
        w = torch.randn(3, requires_grad=True)
        y = torch.sigmoid(w * 2)
        y *= 2
        y.sum().backward()
        assert w.grad is not None


    def test_no_edit_verifies():
        w = torch.randn(3, requires_grad=True)
        first = None
        for step in range(2):
            out = (w * 2).sigmoid()
            if first is None:
                first = out
            loss = torch.nn.functional.mse_loss(first, torch.zeros(3))
            loss.backward()
"""

DIFF = """\
--- a/test_model.py
+++ b/test_model.py
@@ -5,7 +5,7 @@ line 8: `y = y * 2` makes a new tensor and leaves the saved one intact
     torch.manual_seed(0)
     w = torch.randn(3, requires_grad=True)
     y = torch.sigmoid(w * 2)
-    y *= 2
+    y = y * 2
     y.sum().backward()
     assert w.grad is not None
 
"""


def run(args, cwd):
    # wide enough that the hunk heading is compared whole (test_output_width checks 80 columns)
    env = dict(os.environ, OMP_NUM_THREADS="1", COLUMNS="1000")
    env.pop("GRADGUARD_FIX_PYTEST_REPORT", None)
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, env=env,
                          stdin=subprocess.DEVNULL, timeout=600)


def write(tmp_path):
    (tmp_path / "test_model.py").write_text(textwrap.dedent(TEST_MODULE).lstrip())
    return (tmp_path / "test_model.py").read_text()


def test_gradguard_fix_on_one_test_prints_the_verified_diff(tmp_path):
    before = write(tmp_path)
    proc = run(["-m", "gradguard", "fix", "-m", "pytest", "-q", "test_model.py::test_training_step"], tmp_path)
    assert (proc.returncode, proc.stdout) == (0, DIFF), proc.stderr
    assert (tmp_path / "test_model.py").read_text() == before


def test_pytest_gradguard_fix_shows_the_diff_under_the_finding_or_why_none(tmp_path):
    before = write(tmp_path)
    proc = run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "--gradguard", "--gradguard-fix"], tmp_path)
    assert proc.returncode == 1
    assert "2 failed" in proc.stdout
    section = proc.stdout.split("Captured gradguard fix call")[1]
    assert section.split("\n", 1)[1].startswith(
        "verified edit (this test then passes with no finding; 2 runs of this test; `git apply` takes it):\n"
        + DIFF)
    assert ("not fixed: backward ran through a part of the graph that an earlier backward already freed "
            "[freed_graph_reused]: no proposed edit verified: detach_argument at line 20: the edited script exits "
            "1, not 0") in proc.stdout
    assert "gradguard fix, test_model.py::test_training_step:" in proc.stdout  # the terminal summary
    assert (tmp_path / "test_model.py").read_text() == before  # nothing is applied
