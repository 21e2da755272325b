"""``gradguard fix`` end to end: the diff it prints for the bundled examples (exact), --apply/--backup/--json,
an edit that does not verify is never offered, nothing to fix, and usage errors. Each test runs the real
command (the script runs under the guard, then once per candidate edit)."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIX = [sys.executable, "-m", "gradguard", "fix"]

SEED000_DIFF = """\
--- a/rnn_blog.py
+++ b/rnn_blog.py
@@ -15,7 +15,7 @@ line 18: each backward then frees its own iteration's graph; line 21: detach `h_cur` where it crosses into the next iteration
         opt.zero_grad()
         train_output, h_next = rnn(train_set_x[i], h_cur)
         rnn_loss = loss(train_output,train_set_y[i])
-        rnn_loss.backward(retain_graph=True)
+        rnn_loss.backward()
         opt.step()
         print(train_output)
-        h_cur = h_next
+        h_cur = h_next.detach()
"""

# The only edit the diagnosis can propose (detach `first` where the loss uses it) leaves a loss without a graph:
# the edited script fails with an error of its own, so gradguard must say so and print no diff.
UNVERIFIABLE = """
    import torch

    w = torch.randn(3, requires_grad=True)
    first = None
    for step in range(2):
        out = (w * 2).sigmoid()
        if first is None:
            first = out
        loss = torch.nn.functional.mse_loss(first, torch.zeros(3))
        loss.backward()
"""

# The error goes away with `head(features.detach())`, and so does the encoder's gradient that opt.step() uses.
CUTS_A_GRADIENT = """
    import torch

    torch.manual_seed(0)
    encoder = torch.nn.Linear(3, 3)
    head = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD([*encoder.parameters(), *head.parameters()], lr=0.1)
    features = encoder(torch.randn(4, 3))
    for step in range(2):
        loss = head(features).pow(2).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def run(args, cwd, **kw):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([*FIX, *args], cwd=cwd, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL,
                          timeout=600, **kw)


def copy(tmp_path, source: str, name: str) -> str:
    shutil.copy(source, tmp_path / name)
    return name


def test_seed000_diff_is_exact_and_the_file_is_untouched(tmp_path):
    name = copy(tmp_path, os.path.join(ROOT, "examples", "seed000", "rnn_blog.py"), "rnn_blog.py")
    before = (tmp_path / name).read_text()
    proc = run([name], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == SEED000_DIFF
    assert (tmp_path / name).read_text() == before
    assert "the script now runs clean (2 runs)" in proc.stderr
    assert "its side effects, such as files it writes, happen again on every run" in proc.stderr


def test_diff_applies_with_git_apply(tmp_path):
    name = copy(tmp_path, os.path.join(ROOT, "examples", "seed000", "rnn_blog.py"), "rnn_blog.py")
    (tmp_path / "fix.patch").write_text(run([name], tmp_path).stdout)
    applied = subprocess.run(["git", "apply", "fix.patch"], cwd=tmp_path, capture_output=True, text=True)
    assert applied.returncode == 0, applied.stderr
    assert "h_cur = h_next.detach()" in (tmp_path / name).read_text()


def test_apply_backup_and_json(tmp_path):
    name = copy(tmp_path, os.path.join(ROOT, "examples", "seed000", "rnn_blog.py"), "rnn_blog.py")
    before = (tmp_path / name).read_text()
    proc = run(["--apply", "--backup", "--json", "fix.json", "--html", "fix.html", name], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / (name + ".orig")).read_text() == before
    after = (tmp_path / name).read_text()
    assert "rnn_loss.backward()" in after and "h_cur = h_next.detach()" in after
    plain = subprocess.run([sys.executable, name], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert plain.returncode == 0, plain.stderr
    document = json.loads((tmp_path / "fix.json").read_text())
    assert document["clean"] is True and document["unfixed"] == []
    [edit] = document["edits"]
    assert edit["finding"]["rule"] == "retained_graph_across_steps"
    assert [(i["action"], i["line"]) for i in edit["intents"]] == [("detach_assignment", 21), ("drop_keyword", 18)]
    assert document["diff"] == SEED000_DIFF
    page = (tmp_path / "fix.html").read_text()
    assert '<th>verified edit</th>' in page
    assert '<span class="add">+        h_cur = h_next.detach()</span>' in page
    assert '<span class="del">-        rnn_loss.backward(retain_graph=True)</span>' in page


def test_an_edit_that_does_not_verify_is_not_offered(tmp_path):
    (tmp_path / "script.py").write_text(textwrap.dedent(UNVERIFIABLE).lstrip())
    before = (tmp_path / "script.py").read_text()
    proc = run(["--apply", "script.py"], tmp_path)
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert (tmp_path / "script.py").read_text() == before
    assert ("gradguard fix: not fixed: backward ran through a part of the graph that an earlier backward already "
            "freed [freed_graph_reused]: no proposed edit verified: detach_argument at line 9: the edited script "
            "exits 1, not 0 (RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn)"
            ) in proc.stderr


def test_an_edit_that_cuts_a_gradient_the_optimizer_uses_is_not_offered(tmp_path):
    (tmp_path / "script.py").write_text(textwrap.dedent(CUTS_A_GRADIENT).lstrip())
    proc = run(["script.py"], tmp_path)
    assert (proc.returncode, proc.stdout) == (1, "")
    assert ("no proposed edit verified: detach_argument at line 9: backward call 1 no longer reaches 2 of the 4 "
            "parameters that the optimizer step after it updates (optimizer 1 in the order they first step): the "
            "error goes away, but so does their gradient") in proc.stderr


def test_silent_write_is_reported_not_fixed(tmp_path):
    name = copy(tmp_path, os.path.join(ROOT, "examples", "inplace", "09_data_write_buggy.py"), "script.py")
    proc = run([name], tmp_path)
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert "a silent write has no failure to check an edit against" in proc.stderr


def test_nothing_to_fix(tmp_path):
    name = copy(tmp_path, os.path.join(ROOT, "examples", "seed000", "rnn_fixed.py"), "script.py")
    proc = run([name], tmp_path)
    assert (proc.returncode, proc.stdout) == (0, "")
    assert "gradguard fix: no gradient hazard found: nothing to fix" in proc.stderr


@pytest.mark.parametrize("args, message", [
    ([], "the following arguments are required: script (or -m MODULE)"),
    (["--backup", "x.py"], "argument --backup: only meaningful with --apply"),
    (["--max-rounds", "0", "x.py"], "argument --max-rounds: expected a positive number of rounds, got 0"),
])
def test_usage_errors(tmp_path, args, message):
    proc = run(args, tmp_path)
    assert proc.returncode == 2
    assert f"gradguard fix: error: {message}" in proc.stderr


def test_missing_script_is_pythons_message(tmp_path):
    proc = run(["missing.py"], tmp_path)
    assert proc.returncode == 2
    assert "can't open file" in proc.stderr and "missing.py" in proc.stderr


LOUD_EXAMPLES = sorted(p for p in glob.glob(os.path.join(ROOT, "examples", "inplace", "*_buggy.py"))
                       if not os.path.basename(p).startswith("09_"))


def _fix_then_run_plain(path: str, folder) -> tuple[int, int, str]:
    os.makedirs(folder)
    name = shutil.copy(path, os.path.join(folder, "script.py"))
    proc = run(["--apply", name], folder)
    plain = subprocess.run([sys.executable, name], cwd=folder, capture_output=True, text=True, timeout=600)
    return proc.returncode, plain.returncode, proc.stderr


def test_bundled_examples_run_clean_after_apply(tmp_path):
    """Every loud bundled example but one runs clean under plain python after `gradguard fix --apply` (two at a
    time: the runs are subprocesses). The actor-critic order has no verified edit (docs/fix.md) and says so."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        results = dict(zip(LOUD_EXAMPLES, pool.map(
            lambda p: _fix_then_run_plain(p, tmp_path / os.path.basename(p)[:2]), LOUD_EXAMPLES)))
    unfixed = {os.path.basename(p): err[-300:] for p, (fix, plain, err) in results.items() if (fix, plain) != (0, 0)}
    assert sorted(unfixed) == ["02_actor_critic_buggy.py"], unfixed
    assert "no proposed edit verified" in unfixed["02_actor_critic_buggy.py"]
