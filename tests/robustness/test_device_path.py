"""The guard's device path (what it does with GPU tensors), held on CPU: GRADGUARD_DEVICE_PATH sends CPU tensors
down it (NOTE [Sending CPU tensors down the device path]). Counted with torch's profiler, which records every aten
op, the guard's own included: no host sync in forward, at most one per backward pass, and at most 2 ops per saved
tensor at pack and 3 at unpack in sample mode. Silent writes are still caught there, and in sampled mode
(``guard(sample_steps=N)``) within N steps; gradients stay bit-identical."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest
import torch

import gradguard
from gradguard import SilentModificationError
from gradguard.backends.torch import fingerprint as _fingerprint, user_hooks as _sampling

REPO = pathlib.Path(__file__).resolve().parents[2]
SYNCS = {"aten::_local_scalar_dense", "aten::is_nonzero", "aten::equal", "aten::item"}
SENTINEL = {"fingerprint": "sample", "track_writes": False}


@pytest.fixture
def device_path(monkeypatch):
    monkeypatch.setattr(_fingerprint, "DEVICE_PATH", True)


# The aten ops a device fingerprint and its comparison are made of, and those of them that call others (their
# children are the same launch, not another). The guard's ops run inside the model's op that saves or unpacks, so
# they are told apart by name; the model's own uses of these names cancel out against fingerprint="off".
FINGERPRINT_OPS = {"aten::" + name for name in (
    "take", "clone", "as_strided", "ne", "eq", "any", "all", "cat", "stack", "view", "view_as_real", "contiguous",
    "reshape", "copy_", "empty_like", "mul", "sum", "arange", "to", "index_select", "bitwise_or_", "logical_or_")}
COMPOSITE = {"aten::" + name for name in (
    "clone", "cat", "any", "all", "take", "stack", "contiguous", "reshape", "to", "_to_copy", "ne", "eq",
    "index_select", "equal", "item", "arange", "slice", "narrow", "select", "unsqueeze")}  # none saves a tensor


def _profile(fn) -> tuple[dict[str, int], int]:
    """(the fingerprint ops by name, host syncs) made by ``fn()``, from torch's profiler: it records every aten op
    wherever it runs, the guard's own inside the hooks and the engine's final callback included."""
    with torch.autograd.profiler.profile() as prof:
        fn()
    ops: dict[str, int] = {}
    syncs = 0
    for event in prof.function_events:
        parent = event.cpu_parent
        if event.name in SYNCS and (parent is None or parent.name not in SYNCS):
            syncs += 1
        if event.name in FINGERPRINT_OPS and (parent is None or parent.name not in COMPOSITE):
            ops[event.name] = ops.get(event.name, 0) + 1
    return ops, syncs


def _extra(guarded: dict, plain: dict) -> int:
    return sum(guarded.get(k, 0) - plain.get(k, 0) for k in set(guarded) | set(plain))


class _Loop:
    """An LSTMCell loop (many small saved tensors, gapped gate chunks among them) and a wide layer (a saved
    tensor over 64 KiB: the sampled positions)."""

    def __init__(self):
        torch.manual_seed(0)
        self.cell = torch.nn.LSTMCell(16, 32)
        self.wide = torch.nn.Linear(32, 600)
        self.xs = torch.randn(4, 8, 16)
        self.loss = None

    def forward(self):
        h = c = torch.zeros(8, 32)
        for x in self.xs:
            h, c = self.cell(x, (h, c))
        self.loss = self.wide(h).tanh().sum()

    def backward(self):
        self.loss.backward()

    def saved(self) -> int:
        count = [0]

        def pack(t):
            count[0] += 1
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            self.forward()
        self.loss = None
        return count[0]


def _counts(loop: _Loop, **guard_kwargs):
    """(forward ops, forward syncs, backward ops, backward syncs) of one step under the guard, after a warm one."""
    with gradguard.guard(**guard_kwargs):
        loop.forward()
        loop.backward()
        forward, forward_syncs = _profile(loop.forward)
        backward, backward_syncs = _profile(loop.backward)
    return forward, forward_syncs, backward, backward_syncs


def test_sentinel_makes_no_sync_in_forward_and_one_per_backward(device_path):
    loop = _Loop()
    saved = loop.saved()
    # fingerprint="off": the same hooks, records and version checks; what is left is the device fingerprint
    off_f, off_fs, off_b, off_bs = _counts(loop, fingerprint="off", track_writes=False)
    f, fs, b, bs = _counts(loop, **SENTINEL)
    assert (off_fs, off_bs) == (0, 0)
    assert fs == 0, f"host syncs in forward: {fs}"
    assert bs == 1, f"host syncs in backward: {bs}"
    launches = {"aten::clone", "aten::take"}  # the rest are views (metadata, no kernel on a device)
    pack_launches = sum(f.get(k, 0) - off_f.get(k, 0) for k in launches)
    unpack_launches = sum(b.get(k, 0) - off_b.get(k, 0) for k in launches)
    assert pack_launches == unpack_launches == saved, (pack_launches, unpack_launches, saved)
    per_pack = _extra(f, off_f) / saved
    per_unpack = _extra(b, off_b) / saved
    assert 0 < per_pack <= 2 + 1 / saved, (per_pack, f)  # a launch and a view each (one view to spare)
    # the flag itself: a few batched ops per dtype per backward pass, counted against the unpacks
    assert 0 < per_unpack <= 3, (per_unpack, b)
    print(f"{saved} saved tensors: {per_pack:.2f} ops per pack, {per_unpack:.2f} per unpack (flag included)")


def test_no_sync_in_the_cpu_path():
    loop = _Loop()
    _f, fs, _b, bs = _counts(loop, **SENTINEL)
    assert (fs, bs) == (0, 0)


@pytest.mark.parametrize("kwargs", [SENTINEL, {"fingerprint": "full", "track_writes": False}, {}],
                         ids=["sentinel", "full", "forensic"])
def test_gradients_bit_identical(device_path, kwargs):
    plain, guarded = _Loop(), _Loop()
    plain.forward()
    plain.backward()
    with gradguard.guard(**kwargs):
        guarded.forward()
        guarded.backward()
    for (name, p), q in zip(plain.cell.named_parameters(), guarded.cell.parameters()):
        assert torch.equal(p.grad, q.grad), name


def _data_write(**guard_kwargs):
    x = torch.linspace(-1, 1, 4, requires_grad=True)
    w = torch.randn(200, 200, requires_grad=True)  # 156 KiB: sampled, not copied whole
    with gradguard.guard(**guard_kwargs):
        h = x.exp()
        big = (w * 2).sigmoid()
        loss = h.sum() + big.sum()
        h.data.mul_(2)
        loss.backward()


@pytest.mark.parametrize("kwargs", [SENTINEL, {"fingerprint": "full", "track_writes": False}, {}],
                         ids=["sentinel", "full", "forensic"])
def test_silent_write_caught_at_the_end_of_backward(device_path, kwargs):
    with pytest.raises(SilentModificationError) as info:
        _data_write(**kwargs)
    finding = info.value.finding
    assert finding.saved_at.node == "ExpBackward0"
    assert finding.tensor.shape == (4,)
    assert finding.kind == "silent_write"


def test_a_kernel_write_into_a_large_saved_tensor_is_caught(device_path):
    w = torch.randn(300, 300, requires_grad=True)
    with pytest.raises(SilentModificationError) as info:
        with gradguard.guard(**SENTINEL):
            y = (w * 3).tanh()
            loss = y.sum()
            y.data.copy_(torch.randn(300, 300))  # a whole-tensor write, as a fused kernel makes
            loss.backward()
    assert info.value.finding.saved_at.node == "TanhBackward0"


def test_nan_and_negative_zero_are_compared_bit_for_bit(device_path):
    x = torch.tensor([float("nan"), 0.0, 1.0], requires_grad=True)
    with gradguard.guard(**SENTINEL):
        y = (x * 1.0).exp()
        y.sum().backward()  # NaN != NaN as floats: must not read as a change
    assert torch.isnan(x.grad[0])
    y = torch.zeros(3, requires_grad=True)
    with pytest.raises(SilentModificationError):
        with gradguard.guard(**SENTINEL):
            z = y.relu()  # saves its result: 0.0
            z.data[1] = -0.0  # equal as floats, other bytes: a write all the same
            z.sum().backward()


def test_views_and_dtypes_without_false_findings(device_path):
    x = torch.randn(64, 64, requires_grad=True)
    b = torch.randn(64, 64, dtype=torch.bfloat16, requires_grad=True)
    with gradguard.guard(**SENTINEL):
        for _ in range(2):
            loss = (x.t() * 2).exp().sum() + x[:, 5:9].sin().sum() + x.expand(3, 64, 64).cos().sum()
            loss = loss + (b * b).float().sum() + torch.view_as_complex(x.view(64, 32, 2)).abs().sum()
            loss.backward()


def test_sampled_mode_catches_an_every_step_write_within_n_steps():
    w = torch.randn(8, 8, requires_grad=True)
    x = torch.randn(4, 8)
    caught = []
    for step in range(12):
        try:
            with gradguard.guard(sample_steps=4, **SENTINEL):
                h = (x @ w).exp()
                h.data.mul_(1.5)
                h.sum().backward()
        except SilentModificationError:
            caught.append(step)
    assert len(caught) == 3 and all(b - a == 4 for a, b in zip(caught, caught[1:])), caught


def test_sampled_mode_on_the_device_path_inside_one_guard(device_path):
    w = torch.randn(8, 8, requires_grad=True)
    x = torch.randn(4, 8)
    caught = []
    with gradguard.guard(sample_steps=3, **SENTINEL):
        for step in range(9):
            try:
                h = (x @ w).exp()
                h.data.mul_(1.5)
                h.sum().backward()
            except SilentModificationError:
                caught.append(step)
    assert len(caught) == 3 and all(b - a == 3 for a, b in zip(caught, caught[1:])), caught
    assert not _sampling._active and torch.autograd.backward.__module__ == "torch.autograd"  # unwrapped on exit


def test_unsampled_steps_install_no_hooks(monkeypatch):
    monkeypatch.setattr(_sampling, "_ended", 1)  # the next cycles are not sampled
    packed = []
    x = torch.randn(4, 4, requires_grad=True)
    with gradguard.guard(sample_steps=1000, **SENTINEL) as block:
        for _ in range(5):
            (x * x).sum().backward()
        assert block.session.cycles.sampled == 0 and block.session._hooks is None
        with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(1) or t, lambda t: t):
            (x * x).sum().backward()  # the user's hooks still run, wrapped or not
    assert packed


def test_unsampled_steps_install_no_module_hooks(monkeypatch):
    from torch.nn.modules import module as nn_module

    def global_hooks() -> int:
        return len(nn_module._global_forward_pre_hooks) + len(nn_module._global_forward_hooks)

    before = global_hooks()
    monkeypatch.setattr(_sampling, "_ended", 2)  # the cycle after the next one is sampled (n=3)
    layer = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    seen = []
    with gradguard.guard(sample_steps=3, **SENTINEL):
        for _ in range(4):
            seen.append(global_hooks() - before)
            layer(x).sum().backward()
    assert seen == [0, 2, 0, 0], seen  # the sentinel's two module hooks only in the sampled cycle
    assert global_hooks() == before


def test_loud_errors_still_raised_on_unsampled_steps(monkeypatch):
    monkeypatch.setattr(_sampling, "_ended", 1)
    x = torch.randn(4, requires_grad=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):  # PyTorch's own check
        with gradguard.guard(sample_steps=1000, **SENTINEL):
            for _ in range(3):
                y = x.exp()
                y.add_(1)
                y.sum().backward()


@pytest.mark.parametrize("value", [0, -2, 1.5, True, "4"])
def test_sample_steps_rejects_bad_values(value):
    with pytest.raises(gradguard.InvalidArgument, match="sample_steps"):
        gradguard.guard(sample_steps=value)


_SILENT = sorted((REPO / "examples" / "silent").glob("*.py"))


@pytest.mark.parametrize("script", _SILENT, ids=[p.stem for p in _SILENT])
def test_silent_examples_caught_on_the_device_path(script):
    needs = {"liger": "liger_kernel", "triton": "triton"}
    for word, module in needs.items():
        if word in script.stem and importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed")
    env = {**os.environ, "GRADGUARD_DEVICE_PATH": "1", "TRITON_INTERPRET": "1", "PYTHONHASHSEED": "0"}
    plain_env = {k: v for k, v in env.items() if k != "GRADGUARD_DEVICE_PATH"}
    runs = [subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, env=e,
                           timeout=600) for e in (env, plain_env)]
    device, cpu = runs
    marker = "changed without its version counter moving"
    assert device.returncode == cpu.returncode == 0, device.stderr[-2000:]
    assert device.stdout.count(marker) == cpu.stdout.count(marker) >= 1, device.stdout


def test_callback_step_guard_samples_the_sentinel_and_checks_every_step_once_forensic():
    from gradguard.integrations.callback_core import StepGuard

    steps = StepGuard(sample_steps=4)
    w = torch.randn(8, 8, requires_grad=True)
    x = torch.randn(4, 8)
    caught = []
    for step in range(8):
        steps.begin()
        try:
            h = (x @ w).exp()
            h.data.mul_(1.5)
            h.sum().backward()
        except SilentModificationError as error:
            steps.fail(error)
            caught.append((step, steps.current_mode))
            continue
        steps.end()
    # the first caught step switches to forensic (full fingerprints, the write log), which checks every step
    assert len(caught) == 8 - caught[0][0] and caught[0][0] < 4, caught
    with pytest.raises(gradguard.InvalidArgument, match=r"GradguardCallback\(sample_steps=...\)"):
        StepGuard(sample_steps=0)


def test_cli_sample_option(tmp_path):
    script = tmp_path / "every_step.py"
    script.write_text("import torch\nw = torch.randn(8, 8, requires_grad=True)\nx = torch.randn(4, 8)\n"
                      "for step in range(10):\n    h = (x @ w).exp()\n    h.data.mul_(1.5)\n    h.sum().backward()\n")
    run = [sys.executable, "-m", "gradguard", "run", "--no-rerun"]
    caught = subprocess.run([*run, "--sample", "4", str(script)], capture_output=True, text=True, timeout=600)
    assert caught.returncode != 0 and "SilentModificationError" in caught.stderr, caught.stderr[-2000:]
    bad = subprocess.run([*run, "--sample", "0", str(script)], capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "argument --sample: expected an integer >= 1" in bad.stderr, bad.stderr
