"""Acceptance for seed 000 (the blog post's RNN): `gradguard run` names the parameter, the saver line,
the optimizer step line and the fix, in the JSON and in the message the user reads."""

from __future__ import annotations

import pytest

from _example_runs import REPO_ROOT, SEED_BLOG, line_of, panel_message, run_all


@pytest.fixture(scope="module")
def seed_run():
    return run_all([SEED_BLOG], [])[SEED_BLOG]  # shared with test_examples_expected when both run


@pytest.fixture(scope="module")
def finding(seed_run):
    assert len(seed_run.findings) == 1
    return seed_run.findings[0]


def test_fails_like_plain_pytorch_at_iteration_two(seed_run):
    assert seed_run.returncode == 1
    # Iterations 0 and 1 print their output before iteration 2's backward fails (as without gradguard).
    assert seed_run.stdout.count("tensor(") == 2
    assert "Traceback (most recent call last):" in seed_run.stderr
    assert "rnn_loss.backward(retain_graph=True)" in seed_run.stderr.split("╭")[0]


def test_json_names_the_parameter_saver_and_writer(finding):
    assert finding["kind"] == "inplace_modification"
    assert finding["tensor"]["name"] == "rnn.weight_hh_l0"
    assert finding["tensor"]["role"] == "parameter"
    assert finding["saved_at"]["op"] == "AddmmBackward0.mat2"
    assert (REPO_ROOT / finding["saved_at"]["file"]).resolve() == SEED_BLOG.resolve()
    assert finding["saved_at"]["line"] == line_of(SEED_BLOG, "train_output, h_next = rnn(train_set_x[i], h_cur)")
    [write] = finding["modified_at"]
    assert write["line"] == line_of(SEED_BLOG, "opt.step()")
    assert write["code"] == "opt.step()"
    assert write["via"] == "Adadelta.step()"
    assert write["category"] == "optimizer"
    assert write["op"] == "aten.add_.Tensor"
    assert (write["version_before"], write["version_after"]) == (2, 3)
    assert finding["versions"] == {"saved": 2, "now": 3}


def test_json_explains_the_retained_graph_and_suggests_detaching(finding):
    assert finding["rule"] == "retained_graph_across_steps"
    assert "retain_graph=True" in finding["explanation"]
    assert "`h_cur` carries it into the next iteration" in finding["explanation"]
    assert "`h_cur = h_next.detach()`" in finding["suggestion"]
    assert "drop retain_graph=True" in finding["suggestion"]
    assert finding["context"]["retain_graph"] is True


def test_message_shows_the_same_diagnosis(seed_run):
    message = panel_message(seed_run.stderr)
    assert message.startswith("gradguard: InplaceModificationError\n")
    flat = " ".join(message.split())
    assert "parameter rnn.weight_hh_l0 (float32[1, 1])" in flat
    assert "AddmmBackward0.mat2, saved in the forward call at examples/seed000/rnn_blog.py:16" in flat
    assert "via Adadelta.step() at examples/seed000/rnn_blog.py:19 (version 2 -> 3)" in flat
    assert "| opt.step()" in flat
    assert "`h_cur = h_next.detach()` (line 21)" in flat
    assert "drop retain_graph=True from `rnn_loss.backward(retain_graph=True)` (line 18)" in flat
