"""Conformance (MindSpore half): the hazards of tests/conformance/hazards.py written in MindSpore (PyNative), the
same finding fields expected as in every framework, and parity with what MindSpore itself does without gradguard."""

import os
import sys
import warnings

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops

import gradguard
from gradguard.backends.mindspore import GraphModeNotWatched

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conformance"))
from hazards import HAZARDS, check_finding  # noqa: E402

SPEC = {name: spec["mindspore"] for name, spec in HAZARDS.items()}
X = np.array([0.1, 0.2, 0.3], dtype=np.float32)


def _line(marker: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if marker in line and "_line(" not in line)


class _Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.w = ms.Parameter(Tensor(X.copy()), name="w")


net = _Net()
opt = nn.SGD(net.trainable_params(), learning_rate=0.5)


# -- the hazards, in MindSpore (each is the function ms.grad differentiates) -----------------------
def augmented_assign(x):
    y = x * 1
    z = ops.sin(y)  # SAVE-AUG
    y += 1  # WRITE-AUG
    return (z * y).sum()


def inplace_activation(x):
    s = ops.exp(x)  # SAVE-ACT
    s.exp_()  # WRITE-ACT
    return (s * x).sum()


def optimizer_update(x):
    z = ops.sin(net.w * x)  # SAVE-OPT
    opt((ops.ones(3, ms.float32),))  # WRITE-OPT
    return z.sum()


def direct_memory_write(x):
    y = x * 1
    z = ops.sin(y)  # SAVE-DIRECT
    y.asnumpy()[0] = 5.0  # WRITE-DIRECT (on CPU asnumpy() shares the tensor's memory)
    return z.sum()


def _grads(fn):
    """Differentiate one hazard unguarded; return (exception class name or None, gradient)."""
    ops.assign(net.w, Tensor(X.copy()))  # in place: set_data would detach the compiled optimizer from net.w
    try:
        return None, ms.grad(fn)(Tensor(X)).asnumpy()
    except Exception as error:  # noqa: BLE001 - parity: which error MindSpore itself raises
        return type(error).__name__, None


@pytest.mark.parametrize("name, fn, marker", [
    ("optimizer_update", optimizer_update, "OPT"),
    ("direct_memory_write", direct_memory_write, "DIRECT"),
])
def test_hazard_gives_the_conformant_finding_and_mindspore_parity(name, fn, marker):
    spec = SPEC[name]
    raised, _grad = _grads(fn)
    assert raised == spec["framework_raises"]  # parity: MindSpore computes a silently wrong gradient
    ops.assign(net.w, Tensor(X.copy()))  # in place: set_data would detach the compiled optimizer from net.w
    with pytest.raises(gradguard.SilentModificationError) as info:
        with gradguard.guard(backend="mindspore", bisect=name == "direct_memory_write"):
            ms.grad(fn)(Tensor(X))
    check_finding(info.value.finding, spec["finding"], save_line=_line(f"# SAVE-{marker}"),
                  write_line=_line(f"# WRITE-{marker}"), backend="mindspore")


@pytest.mark.parametrize("name, fn", [("augmented_assign", augmented_assign),
                                      ("inplace_activation", inplace_activation)])
def test_hazards_mindspore_semantics_rule_out_give_no_finding_and_identical_gradients(name, fn):
    assert SPEC[name]["finding"] is None
    raised, plain = _grads(fn)
    assert raised is None
    with gradguard.guard(backend="mindspore") as g:
        guarded = ms.grad(fn)(Tensor(X)).asnumpy()
    assert g.findings == []
    np.testing.assert_array_equal(guarded, plain)


def test_bisect_works_with_the_cheap_configuration_too():
    # bisect turns full fingerprints and the write log back on (as on torch)
    with pytest.raises(gradguard.SilentModificationError) as info:
        with gradguard.guard(backend="mindspore", bisect=True, fingerprint="off", track_writes=False):
            ms.grad(direct_memory_write)(Tensor(X))
    (write,) = info.value.finding.modified_at
    assert (write.op, write.location.line) == ("write outside mindspore ops", _line("# WRITE-DIRECT"))


def test_the_optimizer_update_is_silently_wrong_without_gradguard():
    # d/dx sum(sin(w * x)) = cos(w * x) * w with the forward's w = X; MindSpore's backward reads the stepped w
    _raised, wrong = _grads(optimizer_update)
    np.testing.assert_allclose(wrong, np.cos(X * X) * (X - 0.5), rtol=1e-5)
    assert not np.allclose(wrong, np.cos(X * X) * X)


def test_graph_mode_and_jit_say_in_one_line_what_is_not_watched():
    @ms.jit
    def compiled(y):
        return ops.sin(y) * 2

    def f(x):
        return compiled(x * 1).sum()

    plain = ms.grad(f)(Tensor(X)).asnumpy()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with gradguard.guard(backend="mindspore") as g:
            guarded = ms.grad(f)(Tensor(X)).asnumpy()  # JIT-CALL
            ms.grad(f)(Tensor(X))
    lines = [str(w.message) for w in caught if issubclass(w.category, GraphModeNotWatched)]
    assert lines == [f"gradguard.guard: {compiled.__qualname__} is compiled by ms.jit; saved tensors and writes "
                     "inside it are NOT watched (only the PyNative code around it is)"]  # once per function
    assert [w.lineno for w in caught if issubclass(w.category, GraphModeNotWatched)] == [_line("return compiled(")]
    assert g.findings == []
    np.testing.assert_array_equal(guarded, plain)

    ms.set_context(mode=ms.GRAPH_MODE)  # the conftest fixture puts PYNATIVE_MODE back
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with gradguard.guard(backend="mindspore"):
            pass  # GRAPH-ENTER
    assert [(str(w.message), w.lineno) for w in caught if issubclass(w.category, GraphModeNotWatched)] == [
        ("gradguard.guard: MindSpore is in GRAPH_MODE, where saved tensors and in-place writes run inside the "
         "compiled graph and are NOT watched; run the step in PYNATIVE_MODE to guard it", _line("# GRAPH-ENTER") - 1)]


def test_guard_restores_mindspore_after_exit():
    from mindspore.graph.api import _JitExecutor

    before = (_JitExecutor.__call__, "__call__" in nn.Optimizer.__dict__, ops.assign, ms.Tensor.__setitem__)
    with gradguard.guard(backend="mindspore"):
        assert "__call__" in nn.Optimizer.__dict__
    assert (_JitExecutor.__call__, "__call__" in nn.Optimizer.__dict__, ops.assign, ms.Tensor.__setitem__) == before
