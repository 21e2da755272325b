"""Conformance (Paddle half): the hazards of tests/conformance/hazards.py written in Paddle, the same finding
fields expected as in every framework, and parity with what Paddle itself does without gradguard."""

import ctypes
import os
import sys

import numpy as np
import paddle
import pytest

import gradguard

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conformance"))
from hazards import HAZARDS, check_finding  # noqa: E402

SPEC = {name: spec["paddle"] for name, spec in HAZARDS.items()}


def _line(marker: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if marker in line and "_line(" not in line)


def _x():
    return paddle.to_tensor([0.1, 0.2, 0.3], stop_gradient=False)


# -- the hazards, in Paddle -------------------------------------------------------------------------
def augmented_assign(x):
    y = x * 1
    z = y.sin()  # SAVE-AUG
    y += 1  # WRITE-AUG
    (z * y).sum().backward()


def inplace_activation(x):
    s = paddle.exp(x)  # SAVE-ACT
    paddle.tanh_(s)  # WRITE-ACT
    (s * 2).sum().backward()


paddle.seed(0)
net = paddle.nn.Linear(3, 2)
opt = paddle.optimizer.SGD(learning_rate=0.5, parameters=net.parameters())


def optimizer_update(x):
    loss = paddle.tanh(net(x.reshape([1, 3]))).sum()  # SAVE-OPT
    opt.step()  # WRITE-OPT
    loss.backward()


def direct_memory_write(x):
    y = x * 1
    z = y.sin()  # SAVE-DIRECT
    np.from_dlpack(y.detach())[0] = 5.0  # WRITE-DIRECT (a DLPack alias shares Paddle's memory)
    z.sum().backward()


def _grads(run):
    """Run one hazard unguarded from fresh state; return (exception class name or None, x.grad)."""
    x = _x()
    for p in net.parameters():
        p.clear_gradient()
    net(paddle.ones([1, 3])).sum().backward()  # optimizer_update: the previous step's gradients exist
    try:
        run(x)
    except Exception as error:  # noqa: BLE001 - parity: which error Paddle itself raises
        return type(error).__name__, None
    return None, None if x.grad is None else x.grad.numpy().copy()


@pytest.mark.parametrize("name, run, marker", [
    ("inplace_activation", inplace_activation, "ACT"),
    ("optimizer_update", optimizer_update, "OPT"),
    ("direct_memory_write", direct_memory_write, "DIRECT"),
])
def test_hazard_gives_the_conformant_finding_and_paddle_parity(name, run, marker):
    spec = SPEC[name]
    raised, _grad = _grads(run)
    assert raised == spec["framework_raises"]  # parity: what Paddle does on its own
    _grads(lambda x: None)  # fresh optimizer state
    x = _x()
    with pytest.raises(gradguard.GradientHazardError) as info:
        with gradguard.guard(bisect=name == "direct_memory_write"):
            run(x)
    if spec["framework_raises"] == "RuntimeError":
        assert isinstance(info.value, RuntimeError)  # catchable as Paddle's own error
    check_finding(info.value.finding, spec["finding"], save_line=_line(f"# SAVE-{marker}"),
                  write_line=_line(f"# WRITE-{marker}"), backend="paddle")
    assert paddle.is_grad_enabled()


def test_augmented_assign_is_not_in_place_in_paddle_no_finding_identical_gradients():
    assert SPEC["augmented_assign"]["finding"] is None
    raised, plain = _grads(augmented_assign)
    assert raised is None
    x = _x()
    with gradguard.guard() as g:
        augmented_assign(x)
    assert g.findings == []
    np.testing.assert_array_equal(x.grad.numpy(), plain)


def test_without_bisect_the_direct_write_is_caught_and_bisect_is_suggested():
    x = _x()
    with pytest.raises(gradguard.SilentModificationError) as info:
        with gradguard.guard():
            direct_memory_write(x)
    f = info.value.finding
    assert f.modified_at == [] and "gradguard.guard(bisect=True)" in f.explanation


def test_ctypes_write_is_pinned_to_its_line_by_bisect():
    x = _x()
    tracer = sys.gettrace()
    with pytest.raises(gradguard.SilentModificationError) as info:
        with gradguard.guard(bisect=True):
            y = x * 1
            z = y.sin()
            ctypes.memset(y.data_ptr(), 0, 4)  # WRITE-CTYPES
            w = z * 2
            w.sum().backward()
    (write,) = info.value.finding.modified_at
    assert (write.op, write.location.line, write.bumps_version) == (
        "write outside paddle ops", _line("# WRITE-CTYPES"), False)
    assert sys.gettrace() is tracer  # the line tracer is gone after the guard


def test_engine_keeps_no_saved_tensor_alive_after_backward():
    x = _x()
    with gradguard.guard(bisect=True) as g:
        y = x * 1
        z = y.sin()
        z.sum().backward()
        del y, z
        import gc

        gc.collect()
        assert len(g.session.ledger) == 0  # the ledger holds records weakly: backward freed them
        assert all(ref() is None for ref, *_rest in g.session.engine._bisect.baselines._entries.values())
    assert g.findings == []


def test_subscribers_see_the_typed_event_stream_in_order():
    from gradguard.core import events as _events

    x = _x()
    seen = []
    with pytest.raises(gradguard.InplaceModificationError):
        with gradguard.guard() as g:
            g.session.engine.subscribers.append(lambda event: seen.append(type(event).__name__))
            y = x * 1
            z = y.sin()
            y.add_(paddle.to_tensor(1.0))
            z.sum().backward()
    assert [n for i, n in enumerate(seen) if i == 0 or seen[i - 1] != n] == [
        "TensorSaved", "TensorWritten", "BackwardStarted", "TensorUnpacked", "BackwardEnded"]
    assert all(isinstance(getattr(_events, n), type) for n in seen)
