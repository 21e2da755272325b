"""The conformance machine: one contract, every framework (issue 33).

Each framework's real objects (the adapter ``backends.choose()`` returns, the guard probe it makes, ``check_op``'s
adapter) answer the same questions the same way: the version counter moves on an in-place write and not on a read;
a view's span overlaps its base's and not a disjoint tensor's; every fingerprint is the core's
``fingerprint_bytes`` ("full" and "sample") and moves on a write; dtypes and devices are spelt alike; a guard whose
``enter`` fails midway leaves no hook or patch behind. A framework differs only in its :class:`Kit` (how to build a
tensor, write it, view it), so a drift between the frameworks, or between one framework's faces, is a failure here.

Only the cases of the venv's own framework run (tests/conformance/conftest.py deselects the others):
``make test-torch`` / ``test-paddle`` / ``test-mindspore`` run the machine on each (autograd, pure Python on numpy,
has no venv of its own: it runs in the torch venv).

A framework is held only to what its capabilities (``backends.KNOWN``) declare: without "guard" (autograd) the
probe's cases (version counters, spans, a failing enter) are skipped for that reason, and what its adapter and
``check_op``'s adapter answer (fingerprints, dtype names) is still held to the contract.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from gradguard import InvalidArgument
from gradguard.backends import choose, detect_backend
from gradguard.core.engine import SAMPLE_BYTES, fingerprint_bytes

FRAMEWORKS = ("torch", "paddle", "mindspore", "autograd")


# -- one kit per framework: the only framework-specific code here ----------------------------------------
class TorchKit:
    check_adapter = ("gradguard.checks.torch_ops", "TORCH")

    def __init__(self):
        import torch

        self.fw = torch

    def tensor(self, a):
        return self.fw.from_numpy(np.array(a, copy=True))

    def numpy(self, t):
        return t.detach().cpu().numpy()

    def write(self, t):
        t.add_(1)

    def read(self, t):
        return t + 1, t.sum(), t.clone()

    def view(self, t):
        return t[2:6]

    def saving_backward(self):
        x = self.fw.ones(3, requires_grad=True)
        (x.exp() * 2).sum().backward()

    def owners(self):
        torch = self.fw
        return [torch, torch.Tensor, torch.autograd.Function, torch.nn.Module, torch.optim.Optimizer]

    def hooks_left(self) -> list[str]:
        from torch.overrides import _get_current_function_mode_stack
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        from gradguard.backends.torch.user_hooks import saved_tensors_hooks_active

        left = ["saved-tensor hooks"] if saved_tensors_hooks_active() else []
        return left + [repr(m) for m in [*_get_current_dispatch_mode_stack(), *_get_current_function_mode_stack()]]

    def fail_midway(self, monkeypatch, error):
        from gradguard.backends.torch import session as _session, user_hooks as _compat

        # the call gate's install is enter's last step (hooks, user hooks, attribution and the op stream are in);
        # torch 2.4 has no call gate: attribution's install, after the hooks
        if _compat.GATE_CALLS:
            monkeypatch.setattr(_session, "install", _raise(error))
        else:
            monkeypatch.setattr(_session._attribution, "install", _raise(error))


class PaddleKit:
    check_adapter = ("gradguard.backends.paddle.check", "PADDLE")

    def __init__(self):
        import paddle

        self.fw = paddle

    def tensor(self, a):
        return self.fw.to_tensor(np.array(a, copy=True))

    def numpy(self, t):
        return t.numpy()

    def write(self, t):
        t.add_(self.fw.ones_like(t))

    def read(self, t):
        return t + 1, t.sum(), t.clone()

    def view(self, t):
        return t[2:6]

    def saving_backward(self):
        x = self.fw.ones([3])
        x.stop_gradient = False
        (self.fw.exp(x) * 2).sum().backward()

    def owners(self):
        paddle = self.fw
        return [paddle, paddle.Tensor, paddle.autograd, paddle.optimizer.SGD, paddle.optimizer.Adam]

    def hooks_left(self) -> list[str]:
        from gradguard.backends.paddle import session as _session

        return [repr(s) for s in _session._active]  # the session that holds Paddle's (unnestable) hooks

    def fail_midway(self, monkeypatch, error):
        _fail_third_patch(monkeypatch, error)  # Tensor.backward and paddle.grad patched, then a write wrapper fails


class MindSporeKit:
    check_adapter = ("gradguard.backends.mindspore.check", "MindSporeCheckAdapter")

    def __init__(self):
        import mindspore

        self.fw = mindspore
        # the guard watches PyNative execution; a test before this one in the same worker may have left graph mode
        mindspore.set_context(mode=mindspore.PYNATIVE_MODE)

    def tensor(self, a):
        return self.fw.Tensor(np.array(a, copy=True))

    def numpy(self, t):
        return t.asnumpy()

    def write(self, t):
        # MindSpore 2.10 bumps `_version` on copy_ (InplaceCopy) only: add_, mul_, __setitem__ and ops.assign
        # write without a bump (the guard's write log and fingerprints catch those: tests/mindspore)
        t.copy_(t + 1)

    def read(self, t):
        return t + 1, t.sum(), t.copy()

    def view(self, t):
        return t[2:6]

    def saving_backward(self):
        from mindspore import ops

        def loss(x):  # a named function: MindSpore's graph parser reads a lambda's source line, which can fail
            return (ops.exp(x) * 2).sum()

        self.fw.grad(loss)(self.fw.Tensor(np.ones(3, np.float32)))

    def owners(self):
        from mindspore import ops
        from mindspore.graph.api import _JitExecutor

        ms = self.fw
        return [ms.Tensor, ops, ms.nn.Optimizer, _JitExecutor]

    def hooks_left(self) -> list[str]:
        return []  # MindSpore shows neither its saved-tensor hooks nor its dispatch mode: the probe's silence tells

    def fail_midway(self, monkeypatch, error):
        _fail_third_patch(monkeypatch, error)  # ms.jit and Optimizer.__call__ patched, then a write wrapper fails


class AutogradKit:
    """HIPS autograd: check_op only (no "guard" capability), so no hooks, owners or failing enter to describe."""

    check_adapter = ("gradguard.backends.autograd.check", "AUTOGRAD")
    # numpy arrays belong to no framework: backend="auto" cannot tell autograd's inputs from anyone's data
    tensors_name_the_framework = False

    def __init__(self):
        import autograd

        self.fw = autograd

    def tensor(self, a):
        return np.array(a, copy=True)

    def numpy(self, t):
        return np.asarray(t)

    def write(self, t):
        t += 1

    def read(self, t):
        return t + 1, t.sum(), t.copy()

    def view(self, t):
        return t[2:6]


KITS = {"torch": TorchKit, "paddle": PaddleKit, "mindspore": MindSporeKit, "autograd": AutogradKit}


def _raise(error):
    def fail(*args, **kwargs):
        raise error

    return fail


def _fail_third_patch(monkeypatch, error):
    from gradguard.backends.adapter import ProbeBase

    original, calls = ProbeBase._patch, []

    def patch(self, owner, name, wrapper):
        calls.append(name)
        if len(calls) == 3:
            raise error
        original(self, owner, name, wrapper)

    monkeypatch.setattr(ProbeBase, "_patch", patch)


# -- the contract -----------------------------------------------------------------------------------------
@pytest.fixture(params=FRAMEWORKS)
def framework(request):
    return request.param


@pytest.fixture
def kit(framework):
    return KITS[framework]()


@pytest.fixture
def adapter(framework):
    return choose(framework)


def _needs(adapter, capability: str) -> None:
    """Skip a case of a capability the framework does not declare (backends.KNOWN), never for a missing package."""
    if capability not in adapter.capabilities:
        pytest.skip(f"{adapter.name} declares no {capability!r} capability (backends.KNOWN)")


@pytest.fixture(params=["full", "sample"])
def probe(request, adapter):
    """The guard's probe, entered (MindSpore reads a version change only once its dispatch mode runs the op); None
    for a framework without the "guard" capability (its "sample" case is skipped: that mode is the guard's)."""
    if "guard" not in adapter.capabilities:
        if request.param == "sample":
            _needs(adapter, "guard")
        yield None
        return
    session = adapter.new_guard_session(fingerprint=request.param, track_writes=True)
    session.enter()
    yield session
    session.exit()


def _faces(kit, adapter, probe):
    check = getattr(importlib.import_module(kit.check_adapter[0]), kit.check_adapter[1])
    faces = {"adapter": adapter, "probe": probe, "check_op adapter": check() if isinstance(check, type) else check}
    return {face: obj for face, obj in faces.items() if obj is not None}


def test_choose_gives_the_framework_and_its_capabilities(framework, kit, adapter):
    assert adapter.name == framework and adapter.is_tensor(kit.tensor(np.zeros(2, np.float32)))
    assert "check_op" in adapter.capabilities
    assert all(callable(getattr(adapter, m)) for m in ("new_guard_session", "check_op", "enrich_error"))
    assert ("coverage" in adapter.capabilities) == hasattr(adapter, "install_coverage_probe")
    if getattr(kit, "tensors_name_the_framework", True):
        assert choose("auto", [kit.tensor(np.zeros(2, np.float32))]) is adapter
    else:  # its tensors are numpy arrays, which name no framework: backend=... (or the one framework imported) decides
        assert detect_backend([kit.tensor(np.zeros(2, np.float32))]) == detect_backend([])
        assert choose(framework, [kit.tensor(np.zeros(2, np.float32))]) is adapter
    for capability in ("guard", "advise"):
        if capability in adapter.capabilities:
            assert choose(framework, needs=capability) is adapter
        else:
            with pytest.raises(InvalidArgument, match=f"{capability}.*not {framework}"):
                choose(framework, needs=capability)


def test_guard_on_a_framework_without_it_gives_the_resolvers_error(framework, kit, adapter):
    """A backend without "guard" refuses ``gradguard.guard()`` with the resolver's words for a missing capability,
    however it is reached (``guard(backend=...)`` or ``new_guard_session`` on the adapter ``choose`` returned)."""
    import gradguard

    if "guard" in adapter.capabilities:
        pytest.skip(f"{framework} declares the 'guard' capability: the other cases hold its guard to the contract")
    with pytest.raises(InvalidArgument) as resolver:
        choose(framework, needs="guard")
    with pytest.raises(InvalidArgument) as entered:
        with gradguard.guard(backend=framework):
            pass
    with pytest.raises(InvalidArgument) as session:
        adapter.new_guard_session(fingerprint="full", track_writes=True)
    assert str(entered.value) == str(session.value) == str(resolver.value)
    assert str(resolver.value).startswith(f"guard(..., backend={framework!r}): supported by the ")
    assert str(resolver.value).endswith(f" backends, not {framework}")


def test_version_moves_on_an_in_place_write_and_not_on_a_read(kit, adapter, probe):
    _needs(adapter, "guard")  # version counters are the guard's evidence (without them check_op sees silent writes)
    t = kit.tensor(np.arange(10, dtype=np.float32))
    faces = _faces(kit, adapter, probe)
    before = {face: obj.version(t) for face, obj in faces.items()}
    assert set(before.values()) == {before["probe"]} and isinstance(before["probe"], int), before
    kit.read(t)
    assert {face: obj.version(t) for face, obj in faces.items()} == before
    kit.write(t)
    after = {face: obj.version(t) for face, obj in faces.items()}
    assert set(after.values()) == {after["probe"]} and after["probe"] > before["probe"], (before, after)


def _overlap(a, b) -> bool:
    return a is not None and b is not None and a[0] == b[0] and a[1] < b[2] and b[1] < a[2]


def test_a_view_overlaps_its_base_and_a_disjoint_tensor_does_not(kit, adapter, probe):
    _needs(adapter, "guard")  # spans are the guard's (its ledger keys saved records by memory)
    base = kit.tensor(np.arange(10, dtype=np.float32))
    view, other = kit.view(base), kit.tensor(np.arange(10, dtype=np.float32))
    assert _overlap(probe.span(view), probe.span(base)), (probe.span(view), probe.span(base))
    assert not _overlap(probe.span(other), probe.span(base)), (probe.span(other), probe.span(base))
    assert probe.span(np.zeros(3)) is None  # not the framework's tensor: no span


@pytest.mark.parametrize("numel", [7, 3 * SAMPLE_BYTES + 5])
def test_every_fingerprint_is_the_core_definition_and_moves_on_a_write(kit, adapter, probe, numel):
    mode = probe.fingerprint_mode if probe is not None else "full"
    t = kit.tensor(np.arange(numel, dtype=np.float32))

    def expected(mode):
        return fingerprint_bytes(np.ascontiguousarray(kit.numpy(t)), mode)

    before = expected(mode)
    if probe is not None:
        assert probe.engine.fingerprint(t) == before
    faces = {face: obj for face, obj in _faces(kit, adapter, probe).items() if face != "probe"}
    assert {face: obj.fingerprint(t) for face, obj in faces.items()} == {
        "adapter": expected("full"), "check_op adapter": expected("full")}
    kit.write(t)
    assert {face: obj.fingerprint(t) for face, obj in faces.items()} == dict.fromkeys(faces, expected("full"))
    assert expected(mode) != before
    if probe is not None:
        assert probe.engine.fingerprint(t) == expected(mode)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
def test_dtypes_and_devices_are_spelt_alike(kit, adapter, probe, dtype):
    t = kit.tensor(np.arange(3).astype(dtype))
    names = {face: obj.dtype_name(t) for face, obj in _faces(kit, adapter, probe).items()}
    assert names == dict.fromkeys(names, dtype)
    if probe is None:  # no guard: the probe's device and description do not exist
        return
    assert probe.device_name(t) == "cpu"
    info = probe.describe(t)
    assert (info.shape, info.dtype, info.device) == ((3,), dtype, "cpu")


def test_a_guard_whose_enter_fails_midway_leaves_nothing_behind(framework, kit, adapter):
    import gradguard

    _needs(adapter, "guard")
    owners = kit.owners()
    before = [dict(vars(owner)) for owner in owners]
    error = RuntimeError("gradguard test: a hook install step failed")
    made, heard, seen = [], [], []
    new_guard_session = type(adapter).new_guard_session
    with pytest.MonkeyPatch.context() as monkeypatch:
        kit.fail_midway(monkeypatch, error)
        monkeypatch.setattr(type(adapter), "new_guard_session",
                            lambda self, **kw: made.append(new_guard_session(self, **kw)) or made[-1])
        with pytest.raises(RuntimeError) as info:
            with gradguard.guard(backend=framework):
                pass
    assert info.value is error and len(made) == 1
    # the failing step is back to normal: what is left now was left by the failed enter
    changed = [f"{getattr(owner, '__name__', owner)}.{name}" for owner, was in zip(owners, before)
               for name in set(was) | set(vars(owner)) if vars(owner).get(name) is not was.get(name)]
    assert not changed, f"patches left by the failed enter: {changed}"
    assert not kit.hooks_left()
    # the failed session hears nothing of a backward pass that saves tensors ...
    made[0].engine.subscribers.append(lambda event: heard.append(type(event).__name__))
    kit.saving_backward()
    assert heard == []
    # ... and a new guard on the same thread hears it all
    with gradguard.guard(backend=framework) as fresh:
        fresh.session.engine.subscribers.append(lambda event: seen.append(type(event).__name__))
        kit.saving_backward()
    assert "TensorSaved" in seen, seen
    assert not kit.hooks_left()
