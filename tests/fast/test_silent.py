"""Silent writes (bytes change, version does not): flagged, with the saver and the writer named."""

import gc
import pathlib
import weakref

import pytest
import torch

import gradguard
from gradguard import SilentModificationError
from gradguard.backends.torch.bisect import bisect

HERE = pathlib.Path(__file__)
SOURCE = HERE.read_text().splitlines()
SHORT = HERE.relative_to(pathlib.Path.cwd()) if HERE.is_relative_to(pathlib.Path.cwd()) else HERE


def line_of(marker: str) -> int:
    hits = [i + 1 for i, text in enumerate(SOURCE) if text.rstrip().endswith("# " + marker)]
    assert len(hits) == 1, marker
    return hits[0]


def where(marker: str) -> str:
    return f"{SHORT}:{line_of(marker)}"


def code(marker: str) -> str:
    return SOURCE[line_of(marker) - 1].strip()


def silent(fn) -> gradguard.Finding:
    with pytest.raises(SilentModificationError) as info:
        with gradguard.guard():
            fn()
    return info.value.finding


# -- .data --------------------------------------------------------------------------------------------

def data_write():
    x = torch.linspace(-1, 1, 4, requires_grad=True)
    h = x.exp()  # data-save
    y = h.sum()
    h.data.mul_(2)  # data-write
    y.backward()


def test_data_write_message_is_exact():
    with pytest.raises(SilentModificationError) as info:
        with gradguard.guard():
            data_write()  # data-call
    expected = f"""\
a tensor saved for backward changed without its version counter moving: gradients would be silently wrong
  tensor      : h (float32[4], output of ExpBackward0)
  saved by    : ExpBackward0.result, saved in the forward call at {where("data-save")}
                 | {code("data-save")}
  called from : {where("data-call")}
                 | {code("data-call")}
  versions    : saved at 0, now 0
  modified by :
    1. aten.mul_.Tensor at {where("data-write")}  (version 0 -> 0)  [no version bump:
       invisible to the framework]
       | {code("data-write")}
  why         : Its bytes changed while its version counter did not, so the framework's own check
                cannot see it. The write at {where("data-write")} went through `.data`, which
                has its own version counter, so autograd does not see it; ExpBackward0.result still
                needed the old values.
  fix         : Do not write through `.data`. Update the real tensor inside `with torch.no_grad():`
                (the version check then sees it), after the backward that needs the old values; or
                write into a `.clone()`."""
    assert str(info.value) == expected
    f = info.value.finding
    assert (f.kind, f.rule, f.saved_at.op) == ("silent_write", "data_write", "ExpBackward0.result")
    assert [w.bumps_version for w in f.modified_at] == [False]


def test_data_write_fixed_with_no_grad_on_the_real_tensor_is_loud_not_silent():
    with pytest.raises(gradguard.InplaceModificationError):
        with gradguard.guard():
            x = torch.linspace(-1, 1, 4, requires_grad=True)
            h = x.exp()
            y = h.sum()
            with torch.no_grad():
                h.mul_(2)
            y.backward()


# -- NumPy views and from_numpy aliases ---------------------------------------------------------------

def numpy_view_write():
    x = torch.linspace(-1, 1, 4, requires_grad=True)
    h = x.sigmoid()  # np-save
    y = (h * 3).sum()  # np-before
    a = h.detach().numpy()
    a *= 2  # np-write
    z = y * 1  # np-after
    z.backward()


def test_numpy_view_write_is_flagged_and_the_writer_is_honestly_unknown():
    f = silent(numpy_view_write)
    assert (f.rule, f.saved_at.op, f.modified_at) == ("silent_kernel_write", "SigmoidBackward0.result", [])
    assert f.saved_at.location.line == line_of("np-save")
    assert "Re-run in bisect mode" in f.explanation


def test_bisect_pins_a_numpy_write_to_the_line_that_made_it():
    (f,) = bisect(numpy_view_write)
    (w,) = f.modified_at
    assert (w.category, w.op, w.location.line) == ("outside", "write outside torch", line_of("np-write"))
    assert f"the bytes changed at {where('np-write')}" in f.explanation


def test_bisect_under_another_tracer_leaves_it_and_names_the_interval_of_user_lines():
    import sys

    calls = []

    def other_tracer(frame, event, arg):  # a debugger or coverage: gradguard must not replace it
        calls.append(event)
        return None

    sys.settrace(other_tracer)
    try:
        (f,) = bisect(numpy_view_write)
        assert sys.gettrace() is other_tracer
    finally:
        sys.settrace(None)
    assert calls
    (w,) = f.modified_at
    assert w.category == "outside"
    # the last op before the write is `h.detach()` on the `a = ...` line; the first one after is `y * 1`
    assert w.op == f"write outside torch between {SHORT}:{line_of('np-before') + 1} and {where('np-after')}"
    assert w.location.line == line_of("np-after")
    assert f"the bytes changed between {SHORT}:{line_of('np-before') + 1} and {where('np-after')}" in f.explanation


def test_from_numpy_alias_write_is_named_as_a_numpy_alias():
    def run():
        x = torch.linspace(-1, 1, 4, requires_grad=True)
        h = x.tanh()
        y = h.sum()
        with torch.no_grad():
            torch.from_numpy(h.detach().numpy()).mul_(2)  # from-numpy
        y.backward()

    f = silent(run)
    (w,) = f.modified_at
    assert (f.rule, w.category, w.op, w.location.line) == ("numpy_write", "numpy", "aten.mul_.Tensor",
                                                            line_of("from-numpy"))
    assert f.saved_at.op == "TanhBackward0.result"


def test_dlpack_alias_write_is_named_as_an_alias():
    def run():
        x = torch.linspace(-1, 1, 4, requires_grad=True)
        h = x.exp()
        y = h.sum()
        alias = torch.from_dlpack(h.detach())
        with torch.no_grad():
            alias.add_(1)  # dlpack-write
        y.backward()

    f = silent(run)
    (w,) = f.modified_at
    assert (f.rule, w.category, w.via, w.location.line) == ("numpy_write", "numpy", "a NumPy/DLPack alias",
                                                            line_of("dlpack-write"))


def test_numpy_copy_is_not_flagged_and_gradients_are_right():
    with gradguard.guard() as g:
        x = torch.linspace(-1, 1, 4, requires_grad=True)
        h = x.exp()
        y = h.sum()
        a = h.detach().numpy().copy()
        a *= 2
        y.backward()
    assert g.findings == []
    assert torch.equal(x.grad, x.detach().exp())


# -- fused optimizers ---------------------------------------------------------------------------------

def _fused_step(**opt_kwargs):
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 3)
    opt = torch.optim.Adam(lin.parameters(), lr=0.1, **opt_kwargs)
    x = torch.randn(2, 3, requires_grad=True)  # the weight is saved only when the input needs grad
    loss = lin(x).pow(2).sum()  # fused-save
    loss.backward(retain_graph=True)
    opt.step()  # fused-step
    loss.backward()


def test_fused_adam_on_cpu_is_flagged_with_the_optimizer_named():
    f = silent(lambda: _fused_step(fused=True))
    assert (f.rule, f.saved_at.op, f.tensor.role) == ("fused_optimizer", "AddmmBackward0.mat2", "parameter")
    (w,) = f.modified_at
    assert (w.op, w.via, w.location.line, w.bumps_version) == ("aten._fused_adam_", "Adam.step()",
                                                               line_of("fused-step"), False)
    assert "fused=False" in f.suggestion


def test_non_fused_adam_makes_the_same_bug_loud():
    with pytest.raises(gradguard.InplaceModificationError):
        with gradguard.guard():
            _fused_step(foreach=False)


def test_fused_adam_stepping_after_the_last_backward_is_clean():
    with gradguard.guard() as g:
        torch.manual_seed(0)
        lin = torch.nn.Linear(3, 3)
        opt = torch.optim.Adam(lin.parameters(), lr=0.1, fused=True)
        for _ in range(3):
            opt.zero_grad()
            lin(torch.randn(2, 3)).pow(2).sum().backward()
            opt.step()
    assert g.findings == []


# -- custom autograd.Function boundaries --------------------------------------------------------------

class NumpyScale(torch.autograd.Function):
    """A 'kernel' that stores its gradient into its input through a raw NumPy view (like Liger's CE)."""

    @staticmethod
    def forward(ctx, x, mode):
        if mode == "clone":
            x = x.clone()
        buf = x.detach().numpy()
        total = float(buf.sum())
        buf[...] = 2.0  # d(2*sum)/dx, written into the input
        if mode == "increment_version":
            torch.autograd.graph.increment_version(x)
        ctx.save_for_backward(x.detach())
        return x.new_tensor(2 * total)

    @staticmethod
    def backward(ctx, grad):
        (g,) = ctx.saved_tensors
        return g * grad, None


def test_function_forward_writing_its_input_is_named_as_the_writer():
    def run():
        x = torch.linspace(-1, 1, 4, requires_grad=True)
        h = x.exp()  # fn-save
        NumpyScale.apply(h, "inplace").backward()  # fn-call

    f = silent(run)
    (w,) = f.modified_at
    assert (f.rule, f.saved_at.op, f.saved_at.location.line) == ("silent_kernel_write", "ExpBackward0.result",
                                                                  line_of("fn-save"))
    assert (w.op, w.category, w.location.line) == ("NumpyScale.forward", "kernel", line_of("fn-call"))
    assert f"The custom autograd.Function NumpyScale.forward, called at {where('fn-call')}" in f.explanation
    assert "increment_version" in f.suggestion and ".clone()" in f.suggestion


@pytest.mark.parametrize("mode", ["clone", "user-clone"])
def test_function_with_a_clone_is_clean_and_correct(mode):
    with gradguard.guard() as g:
        x = torch.linspace(-1, 1, 4, requires_grad=True)
        h = x.exp()
        if mode == "user-clone":
            NumpyScale.apply(h.clone(), "inplace").backward()
        else:
            NumpyScale.apply(h, "clone").backward()
    assert g.findings == []
    assert torch.allclose(x.grad, 2 * x.detach().exp())


def test_function_with_increment_version_is_loud_not_silent():
    with pytest.raises(gradguard.InplaceModificationError):
        with gradguard.guard():
            x = torch.linspace(-1, 1, 4, requires_grad=True)
            NumpyScale.apply(x.exp(), "increment_version").backward()


class ScaleSavedInBackward(torch.autograd.Function):
    """Backward scales its own saved tensor in place (Liger CE's backward does this with a Triton kernel)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(2 * x.detach())
        return (x * x).sum()

    @staticmethod
    def backward(ctx, grad):
        (g,) = ctx.saved_tensors
        g.numpy()[...] *= grad.item()
        return g


def test_backward_writing_its_own_saved_tensor_is_caught_on_the_second_backward():
    with pytest.raises(SilentModificationError) as info:
        with gradguard.guard():
            x = torch.linspace(-1, 1, 4, requires_grad=True)
            loss = 3 * ScaleSavedInBackward.apply(x)
            loss.backward(retain_graph=True)
            loss.backward()  # scaled twice: the plain second gradient would be 3x too large
    f = info.value.finding
    (w,) = f.modified_at
    assert f.saved_at.node == "ScaleSavedInBackwardBackward"
    assert w.op == "ScaleSavedInBackward.backward"


# -- modes, lifecycle ---------------------------------------------------------------------------------

def test_fingerprint_off_relies_on_versions_and_the_write_log_only():
    with gradguard.guard(fingerprint="off") as g:
        numpy_view_write()  # documented: no torch op wrote, so "off" cannot see it
    assert g.findings == []
    with pytest.raises(SilentModificationError):
        with gradguard.guard(fingerprint="off"):
            data_write()  # the write log still sees `.data` writes


def test_sample_mode_catches_whole_tensor_kernel_writes():
    with pytest.raises(SilentModificationError):
        with gradguard.guard(fingerprint="sample"):
            x = torch.randn(256, 256, requires_grad=True)
            h = x.sigmoid()
            loss = NumpyScale.apply(h, "inplace")
            loss.backward()


def test_everything_is_unwrapped_on_exit_even_after_an_error():
    from torch.autograd.function import BackwardCFunction

    apply_before = torch.autograd.Function.__dict__["apply"]
    backward_before = BackwardCFunction.__dict__["apply"]
    with pytest.raises(SilentModificationError):
        with gradguard.guard():
            assert torch.autograd.Function.__dict__["apply"] is not apply_before
            data_write()
    assert torch.autograd.Function.__dict__["apply"] is apply_before
    assert BackwardCFunction.__dict__["apply"] is backward_before
    with pytest.raises(ZeroDivisionError):
        with gradguard.guard():
            with gradguard.guard():
                1 / 0
    assert torch.autograd.Function.__dict__["apply"] is apply_before


def test_the_guard_keeps_no_tensor_alive():
    with gradguard.guard():
        x = torch.randn(64, requires_grad=True)
        h = x.exp()
        y = NumpyScale.apply(h.clone(), "inplace")
        ref = weakref.ref(h)
        y.backward()
        del h, y
    gc.collect()
    assert ref() is None


# -- BatchNorm running stats (issue 14, class 4) -------------------------------------------------------

def test_running_stats_saved_in_eval_mode_and_updated_before_backward():
    bn = torch.nn.BatchNorm1d(3)
    x = torch.randn(4, 3, requires_grad=True)

    def eval_then_train():
        bn.eval()
        y = bn(x)  # eval-save
        bn.train()
        bn(torch.randn(4, 3))  # train-update
        y.sum().backward()

    finding = silent(eval_then_train)
    assert finding.saved_at.location.line == line_of("eval-save")
    assert finding.saved_at.argument in ("running_mean", "running_var"), finding.saved_at
    assert finding.rule == "eval_running_stats_updated"
    assert "comes from a forward in eval mode" in finding.explanation
    assert "usual writer is a forward of bn in training mode" in finding.explanation


def test_running_stats_saved_in_training_mode_stay_exempt():
    bn = torch.nn.BatchNorm1d(3)
    x = torch.randn(4, 3, requires_grad=True)
    with gradguard.guard():
        y = bn(x)
        bn(torch.randn(4, 3))  # another training forward updates the running stats: harmless for y's backward
        y.sum().backward()
    assert x.grad is not None
