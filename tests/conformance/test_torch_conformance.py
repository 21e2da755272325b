"""Conformance (torch half): the hazards of tests/conformance/hazards.py written in torch, the same finding fields
expected as in every framework, and parity with what torch itself does without gradguard.

Only the torch venv (.venv) runs these; in .venv-paddle and .venv-mindspore, which have no torch, the conftest
deselects them by this module's ``FRAMEWORK``."""

import ctypes
import gc
import sys

import numpy as np
import pytest

import gradguard
from hazards import HAZARDS, check_finding

try:
    import torch
except ModuleNotFoundError:  # .venv-paddle / .venv-mindspore: every test here is deselected (conftest, FRAMEWORK)
    torch = None

FRAMEWORK = "torch"
SPEC = {name: spec["torch"] for name, spec in HAZARDS.items()}


def _line(marker: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if marker in line and "_line(" not in line)


def _x():
    return torch.tensor([0.1, 0.2, 0.3], requires_grad=True)


# -- the hazards, in torch --------------------------------------------------------------------------
def augmented_assign(x):
    y = x * 1
    z = y.sin()  # SAVE-AUG
    y += 1  # WRITE-AUG
    (z * y).sum().backward()


def inplace_activation(x):
    s = torch.exp(x)  # SAVE-ACT
    torch.tanh_(s)  # WRITE-ACT
    (s * 2).sum().backward()


def _net_and_optimizer():
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 2)
    return net, torch.optim.SGD(net.parameters(), lr=0.5)


net, opt = _net_and_optimizer() if torch is not None else (None, None)


def optimizer_update(x):
    loss = torch.tanh(net(x.reshape(1, 3))).sum()  # SAVE-OPT
    opt.step()  # WRITE-OPT
    loss.backward()


def direct_memory_write(x):
    y = x * 1
    z = y.sin()  # SAVE-DIRECT
    y.detach().numpy()[0] = 5.0  # WRITE-DIRECT (on CPU .numpy() shares the tensor's memory)
    z.sum().backward()


def _grads(run):
    """Run one hazard unguarded from fresh state; return (exception class name or None, x.grad)."""
    x = _x()
    net.zero_grad()
    net(torch.ones(1, 3)).sum().backward()  # optimizer_update: the previous step's gradients exist
    try:
        run(x)
    except Exception as error:  # noqa: BLE001 - parity: which error torch itself raises
        return type(error).__name__, None
    return None, None if x.grad is None else x.grad.numpy().copy()


@pytest.mark.parametrize("name, run, marker", [
    ("augmented_assign", augmented_assign, "AUG"),
    ("inplace_activation", inplace_activation, "ACT"),
    ("optimizer_update", optimizer_update, "OPT"),
    ("direct_memory_write", direct_memory_write, "DIRECT"),
])
def test_hazard_gives_the_conformant_finding_and_torch_parity(name, run, marker):
    spec = SPEC[name]
    raised, _grad = _grads(run)
    assert raised == spec["framework_raises"]  # parity: what torch does on its own
    _grads(lambda x: None)  # fresh optimizer state
    x = _x()
    error = {"inplace_modification": gradguard.InplaceModificationError,
             "silent_write": gradguard.SilentModificationError}[spec["finding"]["kind"]]
    with pytest.raises(error) as info:
        with gradguard.guard(bisect=name == "direct_memory_write"):
            run(x)
    if spec["framework_raises"] == "RuntimeError":
        assert isinstance(info.value, RuntimeError)  # catchable as torch's own error
    check_finding(info.value.finding, spec["finding"], save_line=_line(f"# SAVE-{marker}"),
                  write_line=_line(f"# WRITE-{marker}"), backend="torch")
    assert torch.is_grad_enabled()


def test_the_direct_write_is_silently_wrong_without_gradguard():
    # d/dx sum(sin(x * 1)) = cos(x); torch's backward reads the y that NumPy overwrote (y[0] = 5.0)
    raised, wrong = _grads(direct_memory_write)
    assert raised is None
    x = np.array([0.1, 0.2, 0.3], dtype=np.float32)
    np.testing.assert_allclose(wrong, np.cos([5.0, *x[1:]]), rtol=1e-6)
    assert not np.allclose(wrong, np.cos(x))


def test_without_bisect_the_direct_write_is_caught_and_bisect_is_suggested():
    x = _x()
    with pytest.raises(gradguard.SilentModificationError) as info:
        with gradguard.guard():
            direct_memory_write(x)
    f = info.value.finding
    assert f.modified_at == [] and "bisect mode" in f.explanation


def test_ctypes_write_is_placed_between_its_neighbouring_ops_by_bisect():
    # torch's bisect is a dispatch mode, not Paddle's line tracer (core/engine.py NOTE [Bisect without a per-op
    # hook]): a write no torch op made is named by the interval between the last op before it and the first op
    # after it, and placed at the line of the op after it
    x = _x()
    tracer = sys.gettrace()
    with pytest.raises(gradguard.SilentModificationError) as info:
        with gradguard.guard(bisect=True):
            y = x * 1
            z = y.sin()  # BEFORE-CTYPES
            ctypes.memset(y.data_ptr(), 0, 4)  # WRITE-CTYPES
            w = z * 2  # AFTER-CTYPES
            w.sum().backward()
    (write,) = info.value.finding.modified_at
    assert (write.location.line, write.bumps_version) == (_line("# AFTER-CTYPES"), False)
    shown = write.location.short.rsplit(":", 1)[0]  # this file, as findings show paths
    assert shown.endswith("test_torch_conformance.py")
    assert write.op == f"write outside torch between {shown}:{_line('# BEFORE-CTYPES')} and {write.location.short}"
    assert sys.gettrace() is tracer  # bisect leaves no tracer behind


def test_engine_keeps_no_saved_tensor_alive_after_backward():
    x = _x()
    with gradguard.guard(bisect=True) as g:
        y = x * 1
        z = y.sin()
        z.sum().backward()
        del y, z
        gc.collect()
        assert len(g.session.ledger) == 0  # the ledger holds records weakly: backward freed them
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
            y.add_(torch.tensor(1.0))
            z.sum().backward()
    # torch raises at unpack, inside its own backward (core/engine.py NOTE [Raising: at unpack or after
    # backward]): its probe emits no BackwardEnded, unlike Paddle's and MindSpore's wrappers around backward
    assert [n for i, n in enumerate(seen) if i == 0 or seen[i - 1] != n] == [
        "TensorSaved", "TensorWritten", "BackwardStarted", "TensorUnpacked"]
    assert all(isinstance(getattr(_events, n), type) for n in seen)
