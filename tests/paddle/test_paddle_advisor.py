"""gradguard.advise on Paddle steps: proposals verified by re-running, rejections with rule and line, unsafe writes."""

import inspect

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F
import pytest

import gradguard
from gradguard.advisor.report import AdviceReport

BATCH, D, HIDDEN = 256, 64, 512  # activations of [256, 512] float32 = 512 KiB: well above allocator noise


def _line(fn, marker: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, text in enumerate(lines) if marker in text)


def _setup(seed=0, optimizer=paddle.optimizer.Adam):
    paddle.seed(seed)
    model = nn.Sequential(nn.Linear(D, HIDDEN), nn.Linear(HIDDEN, D))
    opt = optimizer(learning_rate=1e-2, parameters=model.parameters())
    x = paddle.randn([BATCH, D])
    return model, opt, x


def safe_relu_step(model, opt, x):
    h = model[0](x)
    a = F.relu(h)  # MARK relu
    out = model[1](a)
    loss = out.pow(2).mean()
    loss.backward()
    opt.step()
    opt.clear_grad()
    return loss


def saved_operand_step(model, opt, x):
    h = model[0](x)
    e = paddle.exp(h)  # exp saves its output e
    r = F.relu(e)  # MARK relu of saved
    s = F.sigmoid(r)  # sigmoid saves its output s
    y = s * 3.0  # MARK mul of saved
    out = model[1](y)
    out.mean().backward()
    opt.step()
    opt.clear_grad()


def user_inplace_step(model, opt, x):
    h = model[0](x)
    s = F.sigmoid(h)  # MARK saver
    s.scale_(2.0)  # MARK write
    model[1](s).mean().backward()
    opt.clear_grad()


def silent_write_step(model, opt, x):
    h = model[0](x)
    e = paddle.exp(h)  # MARK saver
    e.set_value(paddle.zeros_like(e))  # MARK write
    model[1](e).mean().backward()
    opt.clear_grad()


def _params(model):
    return [p.numpy().copy() for p in model.parameters()]


def test_safe_relu_is_proposed_with_measured_bytes_and_identical_gradients():
    model, opt, x = _setup()
    report = gradguard.advise(safe_relu_step, model, opt, x)
    assert isinstance(report, AdviceReport)
    relu = [p for p in report.proposals if p.op == "paddle.nn.functional.relu"]
    assert len(relu) == 1, report.render()
    p = relu[0]
    assert p.location.line == _line(safe_relu_step, "MARK relu")
    assert p.inplace_op == "paddle.nn.functional.relu_"
    assert p.verified and p.gradients_identical
    assert p.measured_peak_saving > 0
    assert p.measured_peak_saving == BATCH * HIDDEN * 4  # the [256, 512] float32 operand, no longer allocated
    assert report.gradients_identical is True
    assert report.measured_total_saving >= p.measured_peak_saving
    assert report.rewritten_peak == report.baseline_peak - report.measured_total_saving
    assert "relu_" in str(report)  # print(report) works
    data = report.to_dict()
    assert data["proposals"][0]["measured_peak_saving"] == p.measured_peak_saving


def test_operand_saved_for_backward_is_rejected_with_rule_and_line():
    model, opt, x = _setup()
    report = gradguard.advise(saved_operand_step, model, opt, x)
    by_line = {r.location.line: r for r in report.rejected_with("saved_for_backward")}
    relu = by_line[_line(saved_operand_step, "MARK relu of saved")]
    assert relu.op == "paddle.nn.functional.relu"
    detail = dict(relu.reasons)["saved_for_backward"]
    assert "paddle.exp" in detail and f":{_line(saved_operand_step, 'exp saves')}" in detail
    mul = by_line[_line(saved_operand_step, "MARK mul of saved")]
    assert "sigmoid" in dict(mul.reasons)["saved_for_backward"]
    proposed = {(p.op, p.location.line) for p in report.proposals + report.safe_without_peak_gain}
    assert ("paddle.nn.functional.relu", _line(saved_operand_step, "MARK relu of saved")) not in proposed
    # exp's own operand (the Linear output) is dead and saved by nobody: it is a verified proposal
    assert ("paddle.exp", _line(saved_operand_step, "exp saves")) in proposed


def test_user_inplace_write_on_saved_tensor_is_listed_as_unsafe():
    model, opt, x = _setup()
    report = gradguard.advise(user_inplace_step, model, opt, x, repeats=1)
    assert len(report.unsafe_inplace) == 1, report.render()
    u = report.unsafe_inplace[0]
    assert u.kind == "raises"  # Paddle's version check would raise at backward
    assert u.op == "paddle.Tensor.scale_"
    assert u.location.line == _line(user_inplace_step, "MARK write")
    assert u.saved_at.line == _line(user_inplace_step, "MARK saver")
    assert not report.proposals
    assert any("raises in plain Paddle" in n for n in report.notes)


def test_silent_set_value_on_saved_tensor_is_listed_as_silent():
    model, opt, x = _setup()
    report = gradguard.advise(silent_write_step, model, opt, x, repeats=1)
    assert [(u.kind, u.op, u.location.line) for u in report.unsafe_inplace] == [
        ("silent", "paddle.Tensor.set_value", _line(silent_write_step, "MARK write"))]
    assert report.unsafe_inplace[0].saved_by == "paddle.exp"


def test_advise_leaves_the_program_results_unchanged():
    model, opt, x = _setup()
    before = _params(model)
    gradguard.advise(safe_relu_step, model, opt, x)
    assert all(np.array_equal(a, b) for a, b in zip(before, _params(model)))
    assert all(p.grad is None for p in model.parameters())
    # Adam's lazily created moments must not survive advise: two steps here equal two steps of a twin
    twin, twin_opt, twin_x = _setup()
    for _ in range(2):
        safe_relu_step(model, opt, x)
        safe_relu_step(twin, twin_opt, twin_x)
    assert all(np.array_equal(a, b) for a, b in zip(_params(model), _params(twin)))


def test_poison_or_rewrite_run_rejects_a_read_the_rules_cannot_see():
    model, opt, x = _setup()

    def hidden_read(model, opt, x):
        h = model[0](x)
        a = F.relu(h)
        b = paddle._C_ops.scale(h, 2.0, 0.0, True)  # reads h through _C_ops: not wrapped, not seen
        loss = (model[1](a) + model[1](b)).mean()
        loss.backward()
        opt.clear_grad()
        return loss

    report = gradguard.advise(hidden_read, model, opt, x)
    assert not [p for p in report.proposals if p.op == "paddle.nn.functional.relu"]
    failed = [p for p in report.unverified if p.op == "paddle.nn.functional.relu"]
    assert len(failed) == 1 and failed[0].gradients_identical is False
    assert "poison run" in failed[0].note  # the returned loss changes once h is NaN


def test_rules_reject_leaf_and_outliving_operands():
    model, opt, x = _setup()
    w = paddle.randn([BATCH, D])
    w.stop_gradient = False

    def step(model, opt, x):
        a = F.relu(x)  # the input: outlives the step
        b = w * 2.0  # a leaf that requires grad
        model[1](model[0](a + b)).mean().backward()
        opt.clear_grad()

    report = gradguard.advise(step, model, opt, x)
    codes = {r.op: r.codes for r in report.rejected}
    assert "outlives_step" in codes["paddle.nn.functional.relu"]
    assert "leaf_requires_grad" in codes["paddle.Tensor.__mul__"]


@pytest.mark.parametrize("option, value, message", [
    ("allocator_check", True, "advise(..., allocator_check=...) is PyTorch-only (a torch.profiler cross-check); on "
     "Paddle the peak is always Paddle's own allocator statistics: drop the argument"),
    ("per_proposal", False, "advise(..., per_proposal=False) is not supported on Paddle: a Paddle proposal is "
     "reported only with its own measured peak drop; drop the argument"),
    ("repeats", 0, "advise(..., repeats=0) on Paddle: peaks are medians of 'repeats' measured runs, so it must be >= 1"),
])
def test_unsupported_options_raise_invalid_argument(option, value, message):
    model, opt, x = _setup()
    with pytest.raises(gradguard.InvalidArgument) as info:
        gradguard.advise(safe_relu_step, model, opt, x, **{option: value})
    assert str(info.value) == message


_CALLS = [0]


def nondeterministic_step(model, opt, x):
    _CALLS[0] += 1  # state the advisor cannot restore: every run differs
    loss = (F.relu(model(x)) * _CALLS[0]).sum()
    loss.backward()
    opt.step()
    opt.clear_grad()
    return loss


def test_a_step_that_differs_between_runs_is_refused_with_the_reason():
    model, opt, x = _setup()
    with pytest.raises(gradguard.InvalidArgument) as info:
        gradguard.advise(nondeterministic_step, model, opt, x, repeats=1)
    message = str(info.value)
    assert message.startswith("advise(...): the step is not reproducible: two runs from the same restored state differ (")
    assert message.endswith("Pass the model and optimizer as arguments (advise(step, model, opt)) or make the step "
                            "deterministic.")


def test_unknown_backend_raises_invalid_argument():
    model, opt, x = _setup()
    with pytest.raises(gradguard.InvalidArgument, match="backend"):
        gradguard.advise(safe_relu_step, model, opt, x, backend="jax")


def test_unreachable_optimizer_raises_invalid_argument():
    model, _, x = _setup()
    _ELSEWHERE.clear()  # the optimizer is created inside the step: its state cannot be snapshotted beforehand
    with pytest.raises(gradguard.InvalidArgument, match="optimizer"):
        gradguard.advise(lambda: _call_elsewhere(model, x), backend="paddle")


_ELSEWHERE = {}


def _call_elsewhere(model, x):
    opt = _ELSEWHERE.setdefault("opt", paddle.optimizer.SGD(parameters=model.parameters()))
    F.relu(model(x)).mean().backward()
    opt.step()
    opt.clear_grad()
