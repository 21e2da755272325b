"""The Paddle guard: each hole Paddle leaves (issue #5) and each error it raises, with gradguard's diagnosis."""

import os

import numpy as np
import paddle
import pytest

import gradguard
from gradguard import InplaceModificationError, SilentModificationError

HERE = os.path.basename(__file__)


def _line(marker: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if marker in line and "_line(" not in line)


class MySin(paddle.autograd.PyLayer):
    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)  # SAVE-PYLAYER
        return paddle.sin(a)

    @staticmethod
    def backward(ctx, g):
        (a,) = ctx.saved_tensor()
        return g * paddle.cos(a)


def _x():
    return paddle.to_tensor([1.0, 2.0, 3.0], stop_gradient=False)


def test_builtin_version_check_is_redone_with_names_and_lines():
    x = _x()
    with pytest.raises(InplaceModificationError) as info:
        with gradguard.guard():
            y = x.exp()  # SAVE-EXP: exp saves its output for backward
            z = y * 2
            y.add_(paddle.to_tensor(1.0))  # WRITE-ADD
            z.sum().backward()
    f = info.value.finding
    assert f.backend == "paddle" and f.facts.mode == "eager (dygraph)"
    assert f.versions == {"saved": 0, "now": 1}
    assert f.saved_at.location.line == _line("# SAVE-EXP")
    assert [(w.op, w.location.line, w.bumps_version) for w in f.modified_at] == [
        ("paddle.Tensor.add_", _line("# WRITE-ADD"), True)]
    assert f.rule == "generic_inplace"
    assert f.tensor.name == "y"  # the variable that holds its memory, as the torch backend names it
    assert paddle.is_grad_enabled()


def test_set_value_is_a_silent_write_paddle_misses():
    x = _x()
    with pytest.raises(SilentModificationError) as info:
        with gradguard.guard():
            y = x * 1
            z = y.sin()
            y.set_value(paddle.ones([3]))  # WRITE-SETVALUE
            z.sum().backward()
    f = info.value.finding
    assert f.kind == "silent_write" and f.rule == "silent_set_value"
    assert f.versions == {"saved": 0, "now": 0}
    w = f.modified_at[0]
    assert (w.op, w.location.line, w.bumps_version) == ("paddle.Tensor.set_value", _line("# WRITE-SETVALUE"), False)
    assert f.saved_at.node == "sin"
    assert "set_value and copy_ do not bump the version counter" in f.explanation


def test_set_value_without_guard_is_silently_wrong():
    # the hole itself: plain Paddle gives cos(1) everywhere, no error
    x = _x()
    y = x * 1
    z = y.sin()
    y.set_value(paddle.ones([3]))
    z.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.cos(np.ones(3)), rtol=1e-6)


def test_copy_is_a_silent_write():
    x = _x()
    with pytest.raises(SilentModificationError) as info:
        with gradguard.guard():
            y = x * 1
            z = y * y
            y.copy_(paddle.zeros([3]), False)  # WRITE-COPY
            z.sum().backward()
    w = info.value.finding.modified_at[0]
    assert (w.op, w.location.line, w.bumps_version) == ("paddle.Tensor.copy_", _line("# WRITE-COPY"), False)


def test_pylayer_saved_tensor_is_version_checked():
    x = _x()
    with pytest.raises(InplaceModificationError) as info:
        with gradguard.guard():
            y = x * 1
            z = MySin.apply(y)
            y.add_(paddle.to_tensor(1.0))
            z.sum().backward()
    f = info.value.finding
    assert f.saved_at.node == "MySin.forward (PyLayer ctx.save_for_backward)"
    assert f.saved_at.location.line == _line("# SAVE-PYLAYER")
    assert any("does not version-check tensors saved by PyLayer" in n for n in f.notes)


def test_pylayer_hole_without_guard_is_silent():
    x = _x()
    y = x * 1
    z = MySin.apply(y)
    y.add_(paddle.to_tensor(1.0))
    z.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.cos(np.array([2.0, 3.0, 4.0])), rtol=1e-6)


@pytest.mark.parametrize("write, op, category", [
    (lambda y: paddle.nn.functional.relu_(y), "paddle.nn.functional.relu_", "activation"),
    (lambda y: paddle.tanh_(y), "paddle.tanh_", "activation"),
    (lambda y: paddle.assign(paddle.zeros([3]), y), "paddle.assign(..., output)", "copy"),
    (lambda y: y.__setitem__(0, 10.0), "paddle.Tensor.__setitem__", "index_assign"),
])
def test_writes_missed_by_method_patching_are_named(write, op, category):
    x = _x()
    with pytest.raises(InplaceModificationError) as info:
        with gradguard.guard():
            y = x * 1
            z = y * y
            write(y)
            z.sum().backward()
    w = info.value.finding.modified_at[0]
    assert (w.op, w.category, w.bumps_version) == (op, category, True)


def test_leaf_inplace_error_is_explained_and_stays_a_value_error():
    x = _x()
    with pytest.raises(ValueError) as info:
        with gradguard.guard():
            x.sin_()  # LEAF-WRITE
    err = info.value
    assert isinstance(err, InplaceModificationError)
    f = err.finding
    assert f.kind == "leaf_inplace" and f.backend == "paddle"
    assert f.tensor.name == "x" and f.tensor.role == "leaf"
    assert f.modified_at[0].location.line == _line("# LEAF-WRITE")
    assert f.suggestion.startswith("For a parameter update or initialisation, write under `with paddle.no_grad():`.")
    assert "Leaf Var (" in f.facts.paddle_message


def test_leaf_setitem_names_layer_parameter():
    net = paddle.nn.Linear(3, 2)
    with pytest.raises(InplaceModificationError) as info:
        with gradguard.guard():
            net.weight[0] = 1.0
    f = info.value.finding
    assert (f.tensor.name, f.tensor.role) == ("net.weight", "parameter")
    assert "Leaf Tensor (" in f.facts.paddle_message


def test_paddle_version_error_outside_hooks_is_explained():
    x = _x()
    y = x.exp()
    z = y * 2
    y.add_(paddle.to_tensor(1.0))  # saved and written before the guard: Paddle's own check raises
    with pytest.raises(InplaceModificationError) as info:
        with gradguard.guard():
            z.sum().backward()  # BACKWARD
    f = info.value.finding
    assert f.versions == {"saved": 0, "now": 1}
    assert f.rule == "unseen_write"
    assert ("backward at", f"{HERE}:{_line('# BACKWARD')}: z.sum().backward()  # BACKWARD") in [
        (k, v.replace(os.path.dirname(__file__) + os.sep, "")) for k, v in f.facts.display] or \
        f.facts.display[0][1].endswith("z.sum().backward()  # BACKWARD")
    assert "(PermissionDenied)" in f.facts.paddle_message


def test_correct_inplace_use_is_not_flagged_and_gradients_identical():
    x = _x()
    y = x * 2.0
    y.add_(paddle.to_tensor(1.0))
    y.exp_()
    (y * 3).sum().backward()
    plain = x.grad.numpy().copy()
    x.clear_gradient()
    with gradguard.guard() as g:
        y = x * 2.0
        y.add_(paddle.to_tensor(1.0))
        y.exp_()
        (y * 3).sum().backward()
    assert g.findings == []
    np.testing.assert_array_equal(x.grad.numpy(), plain)
    np.testing.assert_allclose(plain, 6 * np.exp(2 * np.array([1.0, 2.0, 3.0]) + 1), rtol=1e-5)


def test_guard_restores_paddle_after_exit():
    before = (paddle.Tensor.add_, paddle.Tensor.backward, paddle.grad, paddle.assign, paddle.tanh_)
    with gradguard.guard(backend="paddle"):
        assert paddle.Tensor.add_ is not before[0]
    assert (paddle.Tensor.add_, paddle.Tensor.backward, paddle.grad, paddle.assign, paddle.tanh_) == before
    # hooks removed: Paddle's own check is back
    x = _x()
    y = x.exp()
    z = y * 2
    y.add_(paddle.to_tensor(1.0))
    with pytest.raises(RuntimeError, match=r"\(PermissionDenied\) Tensor '' used in gradient computation"):
        z.sum().backward()


def test_nested_guards_join_and_auto_picks_paddle():
    x = _x()
    with gradguard.guard() as outer:
        assert outer.session.backend == "paddle"
        with gradguard.guard():
            y = x * 1
            z = y.sin()
        y.add_(paddle.to_tensor(1.0))
        with pytest.raises(InplaceModificationError):
            z.sum().backward()
    assert len(outer.findings) == 1


def test_a_nested_guard_lends_the_write_log_to_a_sentinel_outer_one_and_takes_it_back():
    before = (paddle.Tensor.add_, paddle.assign, paddle.tanh_, paddle.optimizer.SGD.step)
    x = _x()
    with gradguard.guard(backend="paddle", fingerprint="sample", track_writes=False) as outer:
        assert paddle.Tensor.add_ is before[0]  # the sentinel logs no writes
        with pytest.raises(InplaceModificationError) as info:
            with gradguard.guard(backend="paddle"):  # forensic: its writes are logged by the outer session
                y = x * 1
                z = y.sin()
                y.add_(paddle.to_tensor(1.0))  # WRITE-LENT
                z.sum().backward()
        assert [w.location.line for w in info.value.finding.modified_at] == [_line("# WRITE-LENT")]
        assert "write tracking was off" not in " ".join(info.value.finding.notes)
        # the inner guard gave the write log back: the outer sentinel runs as before
        assert (paddle.Tensor.add_, paddle.assign, paddle.tanh_, paddle.optimizer.SGD.step) == before
        assert outer.session.engine.track_writes is False
    assert (paddle.Tensor.add_, paddle.assign, paddle.tanh_, paddle.optimizer.SGD.step) == before
