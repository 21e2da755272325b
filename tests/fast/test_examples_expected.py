"""Every message a user sees for the bundled examples, asserted exactly against tests/expected/.

Regenerate after an intended wording change with ``GRADGUARD_UPDATE_EXPECTED=1 pytest tests/fast/
test_examples_expected.py`` and review the diff of tests/expected/ by eye before committing it.
"""

from __future__ import annotations

import os

import pytest

from _example_runs import BUGGY, EXPECTED_DIR, FIXED, REPO_ROOT, comparable, line_of, panel_message, run_all

UPDATE = os.environ.get("GRADGUARD_UPDATE_EXPECTED") == "1"
_comparable = comparable


@pytest.fixture(scope="module")
def runs():
    return run_all(BUGGY, FIXED)


@pytest.fixture(scope="module")
def buggy_runs(runs):
    return runs


@pytest.fixture(scope="module")
def fixed_runs(runs):
    return runs


def _expected_path(script) -> os.PathLike:
    return EXPECTED_DIR / f"{script.parent.name}__{script.stem}.txt"


@pytest.mark.parametrize("script", BUGGY, ids=lambda p: p.stem)
def test_buggy_example_message_matches_expected(buggy_runs, script):
    run = buggy_runs[script]
    assert run.returncode == 1, f"{run.relative} exited {run.returncode}:\n{run.stderr}"
    assert len(run.findings) == 1, f"{run.relative}: expected one finding, got {len(run.findings)}"
    message = panel_message(run.stderr)
    assert message, f"no gradguard panel in the output of {run.relative}:\n{run.stderr}"
    expected = _expected_path(script)
    if UPDATE:
        expected.parent.mkdir(parents=True, exist_ok=True)
        expected.write_text(message)
    assert expected.exists(), f"{expected} is missing: run with GRADGUARD_UPDATE_EXPECTED=1 and review it"
    assert _comparable(message) == _comparable(expected.read_text())


@pytest.mark.parametrize("script", BUGGY, ids=lambda p: p.stem)
def test_buggy_example_message_is_the_json_finding(buggy_runs, script):
    """The panel shows the same why/fix the JSON carries (one finding, two views)."""
    run = buggy_runs[script]
    finding = run.findings[0]
    flat = " ".join(panel_message(run.stderr).split())
    assert " ".join(finding["explanation"].split()) in flat
    assert " ".join(finding["suggestion"].split()) in flat
    assert " ".join(finding["headline"].split()) in flat


# Per example: what the finding must say. Lines are found by their code, so editing an example's comments
# does not break the test. `saved`/`written`: the first line starting with that code.
_FACTS = {
    "rnn_blog": dict(kind="inplace_modification", rule="retained_graph_across_steps", tensor="rnn.weight_hh_l0",
                     saved_op="AddmmBackward0.mat2", saved="train_output, h_next = rnn(", write_op="aten.add_",
                     written="opt.step()"),
    "01_gan_d_step_before_g_backward_buggy": dict(
        kind="inplace_modification", rule="optimizer_step_between_backwards", tensor="D.2.weight",
        saved_op="AddmmBackward0.mat2", saved="g_loss = bce(D(fake)", write_op="aten.addcdiv_", written="opt_d.step()"),
    "02_actor_critic_buggy": dict(
        kind="inplace_modification", rule="optimizer_step_between_backwards", tensor="critic.2.weight",
        saved_op="AddmmBackward0.mat2", saved="q = critic(", write_op="aten.add_", written="critic_opt.step()"),
    "03_inplace_relu_after_sigmoid_buggy": dict(
        kind="inplace_modification", rule="inplace_activation", tensor=None, saved_op="SigmoidBackward0.result",
        saved="loss = gate(x)", write_op="aten.relu_", written="loss = gate(x)"),
    "04_residual_add_after_relu_buggy": dict(
        kind="inplace_modification", rule="augmented_assignment", tensor="out", saved_op="ReluBackward0.result",
        saved="out = self.relu(", write_op="aten.add_", written="out += identity"),
    "05_scale_tanh_output_buggy": dict(
        kind="inplace_modification", rule="augmented_assignment", tensor="h", saved_op="TanhBackward0.result",
        saved="h = torch.tanh(", write_op="aten.mul_", written="h *= 0.5"),
    "06_normalize_exp_inplace_buggy": dict(
        kind="inplace_modification", rule="augmented_assignment", tensor="weights", saved_op="ExpBackward0.result",
        saved="weights = torch.exp(", write_op="aten.div_", written="weights /= "),
    "07_slice_assignment_buggy": dict(
        kind="inplace_modification", rule="index_assignment", tensor="features", saved_op="SigmoidBackward0.result",
        saved="features = torch.sigmoid(", write_op="aten.fill_", written="features[:, 0] = 0"),
    "08_mask_assignment_buggy": dict(
        kind="inplace_modification", rule="mask_assignment", tensor="probs", saved_op="SoftmaxBackward0.result",
        saved="probs = torch.softmax(", write_op="aten.index_put_", written="probs[probs < 0.1] = 0.0"),
    "09_data_write_buggy": dict(
        kind="silent_write", rule="data_write", tensor="layer.weight", saved_op="MmBackward0.mat2",
        saved="out = layer(x)", write_op="aten.div_", written="layer.weight.data /="),
    "10_buffer_copy_refill_buggy": dict(
        kind="inplace_modification", rule="buffer_refill", tensor="norm.scale", saved_op="MulBackward0.other",
        saved="return x * self.scale", write_op="aten.copy_", written="self.scale.copy_("),
    "11_lstm_state_backward_twice_buggy": dict(
        kind="backward_twice", rule="carried_state_backward_twice", tensor="state[0]",
        saved_op="MkldnnRnnLayerBackward0", saved="out, state = lstm(chunk, state)", write_op="backward",
        written="loss.backward()"),  # the earlier backward that freed the graph
    "12_leaf_inplace_update_buggy": dict(
        kind="leaf_inplace", rule="leaf_inplace", tensor="w", saved_op=None, saved=None,
        write_op="in-place write", written="w -= 0.1 * w.grad"),
    "13_view_of_leaf_buggy": dict(
        kind="leaf_inplace", rule="view_of_leaf_inplace", tensor="embedding.weight", saved_op=None, saved=None,
        write_op="in-place write", written="embedding.weight[0] = 0"),
    "14_chunk_view_inplace_buggy": dict(
        kind="view_inplace", rule="multi_output_view_inplace", tensor="q", saved_op=None, saved=None,
        write_op="in-place write", written="q *= 8 ** -0.5"),
    "15_no_grad_view_inplace_buggy": dict(
        kind="view_inplace", rule="no_grad_view_inplace", tensor="first", saved_op=None, saved=None,
        write_op="in-place write", written="first.clamp_(min=0)"),
    "16_power_iteration_two_forwards_buggy": dict(
        kind="inplace_modification", rule="buffer_updated_by_second_forward", tensor="disc.u",
        saved_op="MmBackward0.self", saved="sigma = self.u @", write_op="aten.copy_", written="self.u.copy_("),
    "17_two_inplace_relus_buggy": dict(
        kind="inplace_modification", rule="consecutive_inplace_activation", tensor=None,
        saved_op="ReluBackward0.result", saved="loss = net(", write_op="aten.relu_", written="loss = net("),
    "18_attention_dropout_inplace_buggy": dict(
        kind="inplace_modification", rule="inplace_activation", tensor="attention", saved_op="SoftmaxBackward0.result",
        saved="attention = torch.softmax(", write_op="aten.mul_", written="attention = dropout(attention)"),
    "19_two_losses_step_between_buggy": dict(
        kind="inplace_modification", rule="optimizer_step_between_backwards", tensor="trunk.2.weight",
        saved_op="AddmmBackward0.mat2", saved="features = trunk(x)", write_op="aten.addcdiv_", written="opt.step()"),
    "20_unbind_inplace_buggy": dict(
        kind="view_inplace", rule="multi_output_view_inplace", tensor="a", saved_op=None, saved=None,
        write_op="in-place write", written="a.mul_(2)"),
}


def _same_file(reported: str, script) -> bool:
    """JSON paths are the script's path as run (relative to the repository root here) or absolute."""
    return (REPO_ROOT / reported).resolve() == script.resolve()


def test_every_buggy_example_has_facts():
    assert sorted(_FACTS) == sorted(s.stem for s in BUGGY)


@pytest.mark.parametrize("script", BUGGY, ids=lambda p: p.stem)
def test_buggy_example_json_fields(buggy_runs, script):
    facts = _FACTS[script.stem]
    finding = buggy_runs[script].findings[0]
    for key in ("kind", "tensor", "saved_at", "modified_at", "versions", "explanation", "suggestion", "rule"):
        assert key in finding
    assert finding["kind"] == facts["kind"]
    assert finding["rule"] == facts["rule"]
    assert finding["tensor"]["name"] == facts["tensor"]
    assert finding["explanation"] and finding["suggestion"]
    assert finding["saved_at"]["op"] == facts["saved_op"]
    if facts["saved"] is not None:
        assert _same_file(finding["saved_at"]["file"], script)
        assert finding["saved_at"]["line"] == line_of(script, facts["saved"])
    if facts["written"] is None:
        assert finding["modified_at"] == []
    else:
        write = finding["modified_at"][0]
        # a mask assignment dispatches to index_put_ up to torch 2.14, masked_fill_ from 2.15
        ops = {"aten.index_put_": ("aten.index_put_", "aten.masked_fill_")}.get(facts["write_op"], (facts["write_op"],))
        assert write["op"].startswith(ops)
        assert _same_file(write["file"], script)
        assert write["line"] == line_of(script, facts["written"])
    if facts["kind"] in ("inplace_modification", "silent_write"):
        versions = finding["versions"]
        assert versions["now"] == write["version_after"]
        assert versions["saved"] == write["version_before"]
        if facts["kind"] == "inplace_modification":
            assert versions["now"] > versions["saved"]
        else:  # silent: the bytes changed, the version did not
            assert versions["now"] == versions["saved"]


@pytest.mark.parametrize("script", FIXED, ids=lambda p: p.stem)
def test_fixed_example_runs_clean(fixed_runs, script):
    run = fixed_runs[script]
    assert run.returncode == 0, f"{run.relative} exited {run.returncode}:\n{run.stderr}"
    assert run.findings == []
    assert run.stdout.strip(), f"{run.relative} printed nothing"
    assert "gradguard" not in run.stderr


def test_every_buggy_example_has_a_fixed_variant():
    fixed = {s.stem.replace("_fixed", "") for s in FIXED}
    buggy = {s.stem.replace("_buggy", "") for s in BUGGY if s.stem.endswith("_buggy")}
    assert buggy == fixed - {"rnn"}
    assert len(buggy) >= 13


def test_no_stale_expected_files():
    expected = {p.name for p in EXPECTED_DIR.glob("*.txt")}
    hygiene = {f"hygiene__{s.stem}.txt" for s in (REPO_ROOT / "examples" / "hygiene").glob("*_buggy.py")}
    assert expected == {_expected_path(s).name for s in BUGGY} | hygiene  # hygiene: tests/slow/test_hygiene_examples.py
