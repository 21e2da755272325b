"""The MindSpore guard (PyNative): silent writes MindSpore cannot see, and its own version error explained."""


import numpy as np
import mindspore as ms
import pytest
from mindspore import Tensor, ops

import gradguard
from gradguard import InplaceModificationError, SilentModificationError

X = np.array([1.0, 2.0, 3.0])


def _line(marker):
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if marker in line and "_line(" not in line)


def _setitem(x):
    y = x * 1
    z = ops.sin(y)  # SAVE-SIN
    y[0] = 10.0  # WRITE-SETITEM
    return z.sum()


def _assign(x):
    y = x * 1
    z = y * y
    ops.assign(y, ops.ones(3, ms.float64))  # WRITE-ASSIGN
    return z.sum()


def _copy(x):
    y = x * 1
    z = ops.sin(y)
    y.copy_(Tensor(np.ones(3), ms.float64))
    return z.sum()


def test_setitem_without_guard_is_silently_wrong():
    g = ms.grad(_setitem)(Tensor(X, ms.float64))
    assert not np.allclose(g.asnumpy(), np.cos(X))  # the hole: no error, wrong gradient


def test_setitem_is_a_silent_write():
    with pytest.raises(SilentModificationError) as info:
        with gradguard.guard(backend="mindspore"):
            ms.grad(_setitem)(Tensor(X, ms.float64))
    f = info.value.finding
    assert f.backend == "mindspore" and f.facts.mode == "pynative" and f.facts.device == "CPU"
    assert f.saved_at.location.line == _line("# SAVE-SIN") and f.saved_at.node == "sin"
    w = f.modified_at[0]
    assert (w.op, w.location.line, w.bumps_version, w.category) == (
        "mindspore.Tensor.__setitem__", _line("# WRITE-SETITEM"), False, "index_assign")
    assert f.rule == "index_assignment"
    assert (f.tensor.name, f.tensor.role) == ("y", "activation")  # the variable that holds its memory


def test_ops_assign_is_a_silent_write():
    with pytest.raises(SilentModificationError) as info:
        with gradguard.guard():
            ms.grad(_assign)(Tensor(X, ms.float64))
    w = info.value.finding.modified_at[0]
    assert (w.op, w.location.line, w.bumps_version) == ("mindspore.ops.assign", _line("# WRITE-ASSIGN"), False)


def test_copy_bumps_version_and_is_named():
    with pytest.raises(InplaceModificationError) as info:
        with gradguard.guard():
            ms.grad(_copy)(Tensor(X, ms.float64))
    f = info.value.finding
    assert f.versions == {"saved": 0, "now": 1}
    assert f.modified_at and f.modified_at[0].op == "mindspore.ops.InplaceCopy"


def test_mindspore_own_version_error_is_explained_outside_hooks():
    with pytest.raises(InplaceModificationError) as info:
        with gradguard.guard(backend="mindspore") as g:
            g.session.exit()  # hooks off: MindSpore's own check raises, the guard explains it
            ms.grad(_copy)(Tensor(X, ms.float64))
    f = info.value.finding
    assert f.saved_at.op == "Sin.input[0]" and f.versions == {"saved": 0, "now": 1}
    assert f.facts.mode == "pynative"


def test_clean_code_identical_gradients():
    def f(x):
        return (ops.sin(x) * x).sum()

    plain = ms.grad(f)(Tensor(X, ms.float64)).asnumpy()
    with gradguard.guard() as g:
        guarded = ms.grad(f)(Tensor(X, ms.float64)).asnumpy()
    assert g.findings == []
    np.testing.assert_array_equal(plain, guarded)


class _Scaled(ms.nn.Cell):
    def __init__(self):
        super().__init__()
        self.w = ms.Parameter(Tensor(X, ms.float64), name="w")


scaled = _Scaled()


def _assign_parameter(x):
    z = ops.sin(scaled.w * x)  # SAVE-PARAM
    ops.assign(scaled.w, Tensor(np.ones(3), ms.float64))  # WRITE-PARAM
    return z.sum()


def test_parameter_written_by_assign_is_named_with_the_op_that_saved_it():
    with pytest.raises(SilentModificationError) as info:
        with gradguard.guard(backend="mindspore"):
            ms.grad(_assign_parameter)(Tensor(X, ms.float64))
    f = info.value.finding
    assert (f.tensor.name, f.tensor.role) == ("scaled.w", "parameter")
    assert f.tensor.label == "parameter scaled.w (float64[3])"
    assert (f.saved_at.node, f.saved_at.location.line) == ("multiply", _line("# SAVE-PARAM"))
    assert [(w.op, w.location.line) for w in f.modified_at] == [("mindspore.ops.assign", _line("# WRITE-PARAM"))]
