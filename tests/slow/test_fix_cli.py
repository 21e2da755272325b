"""``gradguard fix`` end to end: the diff it prints for the bundled examples (exact), --apply/--backup/--json,
an edit that does not verify is never offered, nothing to fix, and usage errors. Each test runs the real
command (the script runs under the guard, then once per candidate edit); the two tests of seed 000's diff share
one run of it."""

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

# SAC's update order (toshikwa/soft-actor-critic.pytorch#1): every loss first, then a helper per loss that steps.
HELPER_STEPS = """
    import torch

    torch.manual_seed(0)
    critic, policy = torch.nn.Linear(2, 1), torch.nn.Linear(2, 2)
    critic_opt = torch.optim.SGD(critic.parameters(), lr=0.1)
    policy_opt = torch.optim.SGD(policy.parameters(), lr=0.1)


    def update(opt, loss):
        opt.zero_grad()
        loss.backward()
        opt.step()


    states = torch.randn(4, 2)
    critic_loss = critic(states).pow(2).mean()
    policy_loss = -critic(policy(states)).mean()
    update(critic_opt, critic_loss)
    update(policy_opt, policy_loss)
"""

HELPER_STEPS_DIFF = """\
--- a/script.py
+++ b/script.py
@@ -14,6 +14,6 @@ line 17 (moved after line 18): compute `policy_loss` from a fresh forward after the steps that run before its backward (after line 18) (also proposed, not verified: backpropagate `policy_loss` and step right after it is made (line 17), before the steps that update the weights its forward saved, line 19)
 
 states = torch.randn(4, 2)
 critic_loss = critic(states).pow(2).mean()
+update(critic_opt, critic_loss)
 policy_loss = -critic(policy(states)).mean()
-update(critic_opt, critic_loss)
 update(policy_opt, policy_loss)
"""

# SinGAN's generator loop (tamarott/SinGAN#148): `fake` made once, before the loop that steps the generator.
MADE_BEFORE_THE_LOOP = """
    import torch

    torch.manual_seed(0)
    gen = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Tanh(), torch.nn.Linear(2, 2))
    disc = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(gen.parameters(), lr=0.1)
    noise = torch.randn(4, 2)
    fake = gen(noise)
    for step in range(2):
        opt.zero_grad()
        loss = -disc(fake).mean()
        loss.backward(retain_graph=True)
        opt.step()
"""

MADE_BEFORE_THE_LOOP_DIFF = """\
--- a/script.py
+++ b/script.py
@@ -8,6 +8,7 @@ line 11: recompute `fake` in the loop (it was made once, at line 8, and the loop's step updates the weights its forward saved) (also proposed, not verified: each backward then frees its own iteration's graph, line 12)
 fake = gen(noise)
 for step in range(2):
     opt.zero_grad()
+    fake = gen(noise)
     loss = -disc(fake).mean()
     loss.backward(retain_graph=True)
     opt.step()
"""


# karpathy/nn-zero-to-hero#31: the forward computed once, `loss.backward()` and the update repeated in a loop.
FORWARD_BEFORE_THE_LOOP = """
    import torch

    torch.manual_seed(0)
    w = torch.randn(3, 3, requires_grad=True)
    x = torch.randn(4, 3)
    hidden = (x @ w).tanh()
    loss = hidden.pow(2).mean()
    for step in range(3):
        w.grad = None
        loss.backward()
        with torch.no_grad():
            w -= 0.1 * w.grad
"""

FORWARD_BEFORE_THE_LOOP_DIFF = """\
--- a/script.py
+++ b/script.py
@@ -7,6 +7,8 @@ line 10: the forward (lines 6-7) runs in every iteration, so each backward has its own graph
 loss = hidden.pow(2).mean()
 for step in range(3):
     w.grad = None
+    hidden = (x @ w).tanh()
+    loss = hidden.pow(2).mean()
     loss.backward()
     with torch.no_grad():
         w -= 0.1 * w.grad
"""

# sgadgil6/cnslab_fmri#4: a recurrent state kept on the module across batches (`out, self.hidden = ...`).
STATE_ON_THE_MODULE = """
    import torch
    from torch import nn

    torch.manual_seed(0)


    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = nn.GRU(3, 4, batch_first=True)
            self.hidden = torch.zeros(1, 2, 4)

        def forward(self, x):
            out, self.hidden = self.rnn(x, self.hidden)
            return out[:, -1]


    model = Tagger()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for batch in range(2):
        opt.zero_grad()
        loss = model(torch.randn(2, 5, 3)).pow(2).mean()
        loss.backward()
        opt.step()
"""

STATE_ON_THE_MODULE_DIFF = """\
--- a/script.py
+++ b/script.py
@@ -12,6 +12,7 @@ line 14: `self.hidden` carries values into the next batch, not its graph
 
     def forward(self, x):
         out, self.hidden = self.rnn(x, self.hidden)
+        self.hidden = self.hidden.detach()
         return out[:, -1]
 
 
"""

# hill-a/stable-baselines#550: an observation buffer refilled in place (`obs[:], ... = env.step(...)`).
REFILLED_BUFFER = """
    import torch

    torch.manual_seed(0)
    policy = torch.nn.Linear(4, 2)
    obs = torch.randn(2, 4)
    log_probs = []
    for step in range(3):
        dist = torch.distributions.Categorical(logits=policy(obs))
        log_probs.append(dist.log_prob(dist.sample()))
        obs[:], done = torch.randn(2, 4), False
    loss = -torch.stack(log_probs).mean()
    loss.backward()
"""

REFILLED_BUFFER_DIFF = """\
--- a/script.py
+++ b/script.py
@@ -7,6 +7,6 @@ line 10: `obs` then names the new tensor; the one backward saved keeps its values
 for step in range(3):
     dist = torch.distributions.Categorical(logits=policy(obs))
     log_probs.append(dist.log_prob(dist.sample()))
-    obs[:], done = torch.randn(2, 4), False
+    obs, done = torch.randn(2, 4), False
 loss = -torch.stack(log_probs).mean()
 loss.backward()
"""

# gdrl's SAC (mimoralea/gdrl#13): the policy loss is built from critic outputs, then the critics step, then the
# policy's backward: the policy's zero_grad, backward and step move up to where its loss is made.
LOSS_INPUTS_MADE_BEFORE_THE_STEPS = """
    import torch

    torch.manual_seed(0)
    critic, policy = torch.nn.Linear(4, 1), torch.nn.Linear(2, 2)
    critic_opt = torch.optim.SGD(critic.parameters(), lr=0.1)
    policy_opt = torch.optim.SGD(policy.parameters(), lr=0.1)
    states, actions, targets = torch.randn(4, 2), torch.randn(4, 2), torch.randn(4, 1)

    q_policy = critic(torch.cat([states, policy(states)], 1))
    policy_loss = -q_policy.mean()
    q = critic(torch.cat([states, actions], 1))
    critic_loss = (q - targets).pow(2).mean()
    critic_opt.zero_grad()
    critic_loss.backward()
    critic_opt.step()
    policy_opt.zero_grad()
    policy_loss.backward()
    policy_opt.step()
"""

LOSS_INPUTS_MADE_BEFORE_THE_STEPS_DIFF = """\
--- a/script.py
+++ b/script.py
@@ -8,11 +8,11 @@ lines 16-18 (moved after line 10): backpropagate `policy_loss` and step right after it is made (line 10), before the steps that update the weights its forward saved (also proposed, not verified: recompute `q_policy = critic(torch.cat([states, policy(states)], 1))` from a fresh forward after the step at line 15, line 15)
 
 q_policy = critic(torch.cat([states, policy(states)], 1))
 policy_loss = -q_policy.mean()
+policy_opt.zero_grad()
+policy_loss.backward()
+policy_opt.step()
 q = critic(torch.cat([states, actions], 1))
 critic_loss = (q - targets).pow(2).mean()
 critic_opt.zero_grad()
 critic_loss.backward()
 critic_opt.step()
-policy_opt.zero_grad()
-policy_loss.backward()
-policy_opt.step()
"""

# R-Drop (dropreg/R-Drop#8): the criterion backpropagates the loss it returns, and its caller does it again.
SAME_LOSS_TWICE = """
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)


    def criterion(x):
        loss = model(x).tanh().sum()
        loss.backward()
        return loss


    for step in range(2):
        loss = criterion(torch.randn(4, 3))
        with torch.autograd.profiler.record_function("backward"):
            loss.backward()
        opt.step()
"""

SAME_LOSS_TWICE_DIFF = """\
--- a/script.py
+++ b/script.py
@@ -13,6 +13,4 @@ line 17: `loss` is already backpropagated at line 10
 
 for step in range(2):
     loss = criterion(torch.randn(4, 3))
-    with torch.autograd.profiler.record_function("backward"):
-        loss.backward()
     opt.step()
"""


LOOP_OVER_UNBOUND_VIEWS = """
    import torch

    image = torch.randn(1, 3, 2, 2, requires_grad=True)
    out = image.clone()
    for channel, mean, std in zip(out[0], [0.5, 0.4, 0.3], [0.2, 0.3, 0.4]):
        channel.mul_(std).add_(mean)
    out.sum().backward()
    print(image.grad[0, :, 0, 0].tolist())
"""

LOOP_OVER_UNBOUND_VIEWS_DIFF = """\
--- a/script.py
+++ b/script.py
@@ -2,7 +2,8 @@ line 5: `channel` becomes an indexed view of the tensor (`[i]`), which can be written in place; the write still reaches the tensor
 
 image = torch.randn(1, 3, 2, 2, requires_grad=True)
 out = image.clone()
-for channel, mean, std in zip(out[0], [0.5, 0.4, 0.3], [0.2, 0.3, 0.4]):
+for i, (channel, mean, std) in enumerate(zip(out[0], [0.5, 0.4, 0.3], [0.2, 0.3, 0.4])):
+    channel = out[0][i]
     channel.mul_(std).add_(mean)
 out.sum().backward()
 print(image.grad[0, :, 0, 0].tolist())
"""


VALUE_MADE_FROM_THE_STEPPED_MODEL = """
    import torch
    from torch import nn

    torch.manual_seed(0)
    vae = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
    disc = nn.Sequential(nn.Linear(2, 4), nn.Tanh(), nn.Linear(4, 1))
    opt_vae = torch.optim.Adam(vae.parameters())
    opt_disc = torch.optim.Adam(disc.parameters())
    z = vae(torch.randn(3, 4))
    d_z = disc(z)
    vae_loss = z.square().mean() + d_z.mean()
    opt_vae.zero_grad()
    vae_loss.backward(retain_graph=True)
    opt_vae.step()
    disc_loss = (d_z - 1).square().mean()
    opt_disc.zero_grad()
    disc_loss.backward()
    opt_disc.step()
    print("done")
"""

# 1Konny/FactorVAE#15's shape: the discriminator's loss reuses D(z) made before the VAE's step
VALUE_MADE_FROM_THE_STEPPED_MODEL_DIFF = """\
--- a/script.py
+++ b/script.py
@@ -12,6 +12,7 @@ line 14: recompute `d_z` from `z.detach()` after the step: the second loss then stays out of the stepped model's graph (also proposed, not verified: recompute `z = vae(torch.randn(3, 4))` from a fresh forward after the step at line 14, line 14)
 opt_vae.zero_grad()
 vae_loss.backward(retain_graph=True)
 opt_vae.step()
+d_z = disc(z.detach())
 disc_loss = (d_z - 1).square().mean()
 opt_disc.zero_grad()
 disc_loss.backward()
"""


def run(args, cwd, **kw):
    # wide enough that hunk headings and notices are compared whole (test_output_width checks 80 columns)
    env = dict(os.environ, OMP_NUM_THREADS="1", COLUMNS="1000")
    return subprocess.run([*FIX, *args], cwd=cwd, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL,
                          timeout=600, **kw)


def copy(tmp_path, source: str, name: str) -> str:
    shutil.copy(source, tmp_path / name)
    return name


@pytest.fixture(scope="module")
def seed000_fix(once_per_session, tmp_path_factory):
    """``gradguard fix rnn_blog.py`` on a copy (no --apply), run once per session (tests/slow/conftest.py): its
    exit code, output, and the copy's text before and after."""

    def make() -> dict:
        folder = tmp_path_factory.mktemp("seed000-fix")
        name = copy(folder, os.path.join(ROOT, "examples", "seed000", "rnn_blog.py"), "rnn_blog.py")
        before = (folder / name).read_text()
        proc = run([name], folder)
        return {"returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr, "before": before,
                "after": (folder / name).read_text()}

    return once_per_session("gradguard-fix-cli-seed000", make)


def test_seed000_diff_is_exact_and_the_file_is_untouched(seed000_fix):
    proc = seed000_fix
    assert proc["returncode"] == 0, proc["stderr"]
    assert proc["stdout"] == SEED000_DIFF
    assert proc["after"] == proc["before"]
    assert "the script now runs clean (2 runs)" in proc["stderr"]
    assert "its side effects, such as files it writes, happen again on every run" in proc["stderr"]


def test_diff_applies_with_git_apply(tmp_path, seed000_fix):
    name = copy(tmp_path, os.path.join(ROOT, "examples", "seed000", "rnn_blog.py"), "rnn_blog.py")
    (tmp_path / "fix.patch").write_text(seed000_fix["stdout"])
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
            "parameters that the optimizer step after it updates (optimizer 1 in the order they are made): the "
            "error goes away, but so does their gradient") in proc.stderr


# CI's selection (CI=true: -m "not exhaustive") leaves out the shapes marked `exhaustive` below: a CI-selected test
# derives the same repair from the same shape.
# - loop-over-unbound-views: tests/fast/test_eager_errors.py::
#   test_multi_output_view_bound_by_a_loop_is_not_told_to_rebind (the finding's one intent: index_loop_variable on
#   `channel`) and tests/fast/test_fix_edits.py::test_index_loop_variable_over_a_tensor_and_inside_zip (the edit on
#   `for channel, mean in zip(t[0], means)`)
# - value-made-from-the-stepped-model: tests/fast/test_rules_intents.py::
#   test_crossing_recompute_detaches_the_stepped_models_output (FactorVAE's shape: `D_z = D(z.detach())`)
_COVERED_IN_CI = pytest.mark.exhaustive


@pytest.mark.parametrize("script, diff", [
    pytest.param(HELPER_STEPS, HELPER_STEPS_DIFF, id="loss-made-before-a-helper-steps"),
    pytest.param(MADE_BEFORE_THE_LOOP, MADE_BEFORE_THE_LOOP_DIFF, id="value-made-before-the-loop-that-steps"),
    pytest.param(FORWARD_BEFORE_THE_LOOP, FORWARD_BEFORE_THE_LOOP_DIFF, id="forward-made-before-the-loop"),
    pytest.param(STATE_ON_THE_MODULE, STATE_ON_THE_MODULE_DIFF, id="state-kept-on-the-module"),
    pytest.param(REFILLED_BUFFER, REFILLED_BUFFER_DIFF, id="refilled-buffer"),
    pytest.param(LOSS_INPUTS_MADE_BEFORE_THE_STEPS, LOSS_INPUTS_MADE_BEFORE_THE_STEPS_DIFF,
                 id="loss-inputs-made-before-the-steps"),
    pytest.param(SAME_LOSS_TWICE, SAME_LOSS_TWICE_DIFF, id="same-loss-twice"),
    pytest.param(LOOP_OVER_UNBOUND_VIEWS, LOOP_OVER_UNBOUND_VIEWS_DIFF, id="loop-over-unbound-views",
                 marks=_COVERED_IN_CI),
    pytest.param(VALUE_MADE_FROM_THE_STEPPED_MODEL, VALUE_MADE_FROM_THE_STEPPED_MODEL_DIFF,
                 id="value-made-from-the-stepped-model", marks=_COVERED_IN_CI)])
def test_repairs_of_public_bug_report_shapes(tmp_path, script, diff):
    (tmp_path / "script.py").write_text(textwrap.dedent(script).lstrip())
    proc = run(["script.py"], tmp_path)
    assert (proc.returncode, proc.stdout) == (0, diff), proc.stderr


RESBLOCK_DIFF = """\
--- a/script.py
+++ b/script.py
@@ -17,7 +17,7 @@ line 20: construct ReLU with inplace=False: `input` keeps its value for the read at line 28 (also proposed, not verified: pass a copy of `input`: the module writes into the copy, line 27)
     def __init__(self, in_channel, channel):
         super().__init__()
         self.conv = nn.Sequential(
-            nn.ReLU(inplace=True),
+            nn.ReLU(inplace=False),
             nn.Conv2d(in_channel, channel, 3, padding=1),
             nn.ReLU(inplace=True),
             nn.Conv2d(channel, in_channel, 1),
"""


def test_a_module_writing_its_callers_input_is_fixed_in_forensic_mode(tmp_path):
    """Only the write log sees this hazard: `--mode forensic` for every run, the edit at the constructing line."""
    name = copy(tmp_path, os.path.join(ROOT, "examples", "hygiene", "05_resblock_inplace_relu_buggy.py"), "script.py")
    proc = run(["--mode", "forensic", name], tmp_path)
    assert (proc.returncode, proc.stdout) == (0, RESBLOCK_DIFF), proc.stderr


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


@pytest.mark.exhaustive  # every bundled example repaired; the repair shapes above cover the edits one by one
def test_bundled_examples_run_clean_after_apply(tmp_path):
    """Every loud bundled example runs clean under plain python after `gradguard fix --apply` (two at a time: the
    runs are subprocesses)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        results = dict(zip(LOUD_EXAMPLES, pool.map(
            lambda p: _fix_then_run_plain(p, tmp_path / os.path.basename(p)[:2]), LOUD_EXAMPLES)))
    unfixed = {os.path.basename(p): err[-300:] for p, (fix, plain, err) in results.items() if (fix, plain) != (0, 0)}
    assert unfixed == {}


ACTOR_CRITIC_DIFF = """\
--- a/script.py
+++ b/script.py
@@ -19,6 +19,8 @@ line 21: a fresh forward after the step at line 21: the backward at line 23 then uses the weights the step wrote
     critic_opt.zero_grad()
     critic_loss.backward(retain_graph=True)
     critic_opt.step()
+    q = critic(torch.cat([state, action], dim=1))
+    actor_loss = -q.mean()
     actor_opt.zero_grad()
     actor_loss.backward()
     actor_opt.step()
"""


def test_actor_critic_example_gets_a_fresh_critic_forward_after_the_critic_step(tmp_path):
    # DDPG's order: `q` and the actor's loss recomputed from the stepped critic. Moving the critic's step after
    # the actor's backward also ends the error, but the critic would then train on the actor's loss too
    # (NOTE [One loss per optimizer stays one loss per optimizer]); `critic_loss` is not recomputed.
    name = copy(tmp_path, os.path.join(ROOT, "examples", "inplace", "02_actor_critic_buggy.py"), "script.py")
    proc = run([name], tmp_path)
    assert (proc.returncode, proc.stdout) == (0, ACTOR_CRITIC_DIFF), proc.stderr
