"""Custom autograd.Function and tensor-hook hygiene at run time (issue 14, classes 1 and 2).

Each hazard: PyTorch alone is silent and the gradient is wrong (asserted), the guard raises in every mode
with the Function, the argument and the writing line named, and the correct variant is clean with
bit-identical gradients.
"""

import pathlib

import pytest
import torch
from torch.autograd import Function

import gradguard
from gradguard import SilentModificationError

HERE = pathlib.Path(__file__)
SOURCE = HERE.read_text().splitlines()

MODES = [dict(), dict(fingerprint="sample"), dict(fingerprint="off"), dict(fingerprint="sample", track_writes=False)]
MODE_IDS = ["full", "sample", "off", "sentinel"]


def line_of(marker: str) -> int:
    hits = [i + 1 for i, text in enumerate(SOURCE) if text.rstrip().endswith("# " + marker)]
    assert len(hits) == 1, marker
    return hits[0]


def caught(fn, **mode) -> gradguard.Finding:
    with pytest.raises(SilentModificationError) as info:
        with gradguard.guard(**mode):
            fn()
    return info.value.finding


def clean(fn, **mode):
    """fn's result with the guard on, after checking it has no finding and matches the plain run bit for bit."""
    torch.manual_seed(0)
    plain = fn()
    torch.manual_seed(0)
    with gradguard.guard(**mode) as g:
        guarded = fn()
    assert g.findings == []
    assert all(torch.equal(a, b) for a, b in zip(plain, guarded))
    return guarded


# -- ctx attributes (a tensor kept on ctx instead of save_for_backward) -----------------------------------

class SwishOnCtx(Function):
    """Memory-efficient Swish keeping its input as ``ctx.i`` (PyTorch docs: use save_for_backward instead)."""

    @staticmethod
    def forward(ctx, i):
        ctx.i = i
        return i * torch.sigmoid(i)

    @staticmethod
    def backward(ctx, grad):
        s = torch.sigmoid(ctx.i)
        return grad * (s * (1 + ctx.i * (1 - s)))


def swish_residual(swish=SwishOnCtx, out_of_place=False):
    x = torch.linspace(-2, 2, 5, requires_grad=True)
    h = x * 1
    if out_of_place:
        h = h + swish.apply(h)
    else:
        h += swish.apply(h)  # ctx-write
    h.sum().backward()
    return (x.grad,)


def true_swish_residual_grad():
    x = torch.linspace(-2, 2, 5, requires_grad=True)
    (x + x * torch.sigmoid(x)).sum().backward()
    return x.grad


def test_plain_pytorch_is_silent_and_wrong_for_a_ctx_attribute():
    (grad,) = swish_residual()
    assert not torch.allclose(grad, true_swish_residual_grad())


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_ctx_attribute_written_before_backward_is_caught_in_every_mode(mode):
    f = caught(swish_residual, **mode)
    assert f.kind == "unchecked_write"
    assert (f.saved_at.node, f.saved_at.argument) == ("SwishOnCtxBackward", "ctx.i")
    assert f.saved_at.location.line == line_of("ctx-write")
    assert "not through save_for_backward" in f.explanation
    assert any("ctx.save_for_backward(i)" in note for note in f.notes)
    if mode.get("track_writes", True):
        (w,) = f.modified_at
        assert (w.location.line, f.rule) == (line_of("ctx-write"), "augmented_assignment")
        assert "h = h + swish.apply(h)" in f.suggestion
    else:
        assert f.rule == "unseen_write"


def test_the_fixes_are_clean_and_right():
    (grad,) = clean(lambda: swish_residual(out_of_place=True))
    assert torch.allclose(grad, true_swish_residual_grad())


class SwishSaved(Function):
    @staticmethod
    def forward(ctx, i):
        ctx.save_for_backward(i)
        return i * torch.sigmoid(i)

    @staticmethod
    def backward(ctx, grad):
        (i,) = ctx.saved_tensors
        s = torch.sigmoid(i)
        return grad * (s * (1 + i * (1 - s)))


def test_save_for_backward_makes_the_same_write_loud():
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        swish_residual(SwishSaved)
    with pytest.raises(gradguard.InplaceModificationError):
        with gradguard.guard():
            swish_residual(SwishSaved)


class KeepsNonTensorsAndDropsInBackward(Function):
    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale, ctx.shape, ctx.x = scale, x.shape, x
        return x * scale

    @staticmethod
    def backward(ctx, grad):
        out = grad * ctx.scale
        ctx.x = None  # free early, as memory-conscious Functions do
        return out, None


def test_ctx_attributes_unchanged_or_dropped_are_clean_and_not_kept_alive():
    import weakref

    def run():
        x = torch.randn(6, requires_grad=True)
        h = x * 2
        y = KeepsNonTensorsAndDropsInBackward.apply(h, 3.0)
        ref = weakref.ref(h)
        y.sum().backward(retain_graph=True)
        del h
        alive = ref() is not None
        return x.grad, torch.tensor(alive)

    grad, alive = clean(run)
    assert not bool(alive)  # ctx dropped it in backward; gradguard keeps no reference either


# -- forward writing into an input without ctx.mark_dirty ---------------------------------------------

class ScaleInPlace(Function):
    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        x.mul_(scale)  # input-write
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.scale, None


class ScaleDirty(Function):
    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        ctx.mark_dirty(x)
        return x.mul_(scale)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.scale, None


def scale_then_reuse(fn=ScaleInPlace):
    x = torch.linspace(-1, 1, 4, requires_grad=True)
    h = x * 1
    y = fn.apply(h, 3.0)  # input-call
    (y + h).sum().backward()
    return (x.grad,)


def test_plain_pytorch_is_silent_and_wrong_for_an_undeclared_input_write():
    (grad,) = scale_then_reuse()
    assert torch.equal(grad, torch.full((4,), 4.0))  # true: d(3h + 3h)/dx = 6


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_forward_writing_its_input_without_mark_dirty_is_caught_at_the_call(mode):
    f = caught(scale_then_reuse, **mode)
    assert f.kind == "undeclared_input_write"
    assert (f.facts.function, f.facts.argument, f.facts.call["line"]) == (
        "ScaleInPlace", "x", line_of("input-call"))
    (w,) = f.modified_at
    assert (w.op, w.location.line, w.location.code) == ("ScaleInPlace.forward", line_of("input-write"),
                                                         "x.mul_(scale)  # input-write")
    assert f.rule == "forward_writes_input"
    assert "ctx.mark_dirty(x)" in f.suggestion


def test_mark_dirty_is_clean_and_right():
    (grad,) = clean(lambda: scale_then_reuse(ScaleDirty))
    assert torch.equal(grad, torch.full((4,), 6.0))


def test_input_that_does_not_require_grad_may_be_updated():
    class RunningMean(Function):
        @staticmethod
        def forward(ctx, x, running):
            running.mul_(0.9).add_(0.1 * x.detach().mean())  # a buffer, like SyncBatchNorm's stats
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return grad * 2, None

    def run():
        x = torch.randn(4, requires_grad=True)
        running = torch.zeros(())
        RunningMean.apply(x * 1, running).sum().backward()
        return x.grad, running

    clean(run)


# -- backward writing into a gradient another node still needs -----------------------------------------

class GradReversalInPlace(Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output.neg_()  # grad-write


class GradReversal(Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output.neg()


def two_heads(fn=GradReversalInPlace):
    x = torch.linspace(-1, 1, 4, requires_grad=True)
    w1 = torch.linspace(0.5, 2, 4, requires_grad=True)
    w2 = torch.linspace(1, 3, 4, requires_grad=True)
    features = x * 1
    task = features * w1  # made first: its backward runs after the reversal's
    domain = fn.apply(features * w2)  # the reversal gets the add's gradient, shared with `task`
    ((task + domain) * 1.5).sum().backward()
    return x.grad, w1.grad, w2.grad


def test_plain_pytorch_is_silent_and_wrong_for_a_shared_gradient_write():
    _, w1_grad, _ = two_heads()
    assert torch.equal(w1_grad, -1.5 * torch.linspace(-1, 1, 4))  # true: +1.5 x


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_backward_writing_a_shared_gradient_is_caught(mode):
    f = caught(two_heads, **mode)
    assert f.kind == "shared_grad_write"
    assert (f.tensor.name, f.tensor.role) == ("grad_output", "gradient")
    (w,) = f.modified_at
    assert (w.op, w.location.line) == ("GradReversalInPlace.backward", line_of("grad-write"))
    assert f.rule == "backward_writes_shared_grad"
    assert "grad_output.neg()" in f.suggestion or "out of place" in f.suggestion


def test_out_of_place_reversal_is_clean_and_right():
    _, w1_grad, _ = clean(lambda: two_heads(GradReversal))
    assert torch.equal(w1_grad, 1.5 * torch.linspace(-1, 1, 4))


def test_writing_an_unshared_gradient_is_allowed():
    def run():
        x = torch.linspace(-1, 1, 4, requires_grad=True)
        (GradReversalInPlace.apply(x * 1) * 3).sum().backward()
        return (x.grad,)

    (grad,) = clean(run)
    assert torch.equal(grad, torch.full((4,), -3.0))


# -- tensor hooks writing their argument ---------------------------------------------------------------

def hooked_residual(in_place=True):
    x = torch.linspace(-1, 1, 4, requires_grad=True)
    w = torch.linspace(0.5, 2, 4, requires_grad=True)
    a = x * w  # made first: its branch runs last
    b = x.exp()
    if in_place:
        b.register_hook(lambda grad: grad.mul_(0.5))  # hook-write
    else:
        b.register_hook(lambda grad: grad * 0.5)
    ((a + b) * 1.5).sum().backward()  # the add hands one gradient to both branches
    return x.grad, w.grad


def test_plain_pytorch_is_silent_and_wrong_for_a_hook_writing_its_argument():
    _, w_grad = hooked_residual()
    assert torch.allclose(w_grad, 0.75 * torch.linspace(-1, 1, 4))  # true: 1.5 x, the hook is on b only


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_hook_writing_a_shared_gradient_is_caught(mode):
    f = caught(hooked_residual, **mode)
    assert f.kind == "shared_grad_write"
    (w,) = f.modified_at
    assert (w.op, w.location.line, w.category) == ("tensor hook <lambda>", line_of("hook-write"), "hook_grad")
    assert f.rule == "hook_writes_shared_grad"
    assert "return a new tensor" in f.suggestion


def test_hook_returning_a_new_gradient_is_clean_and_right():
    _, w_grad = clean(lambda: hooked_residual(in_place=False))
    assert torch.allclose(w_grad, 1.5 * torch.linspace(-1, 1, 4))


def test_hooks_registered_in_a_guard_still_run_after_it_and_can_be_removed():
    calls = []
    x = torch.ones(2, requires_grad=True)
    with gradguard.guard():
        y = x * 2
        handle = y.register_hook(lambda g: calls.append(1))
    y.sum().backward(retain_graph=True)
    handle.remove()
    y.sum().backward()
    assert calls == [1]


def test_an_input_saved_before_the_call_is_left_to_the_loud_check():
    def run():
        x = torch.linspace(-1, 1, 4, requires_grad=True)
        h = x.exp()  # ExpBackward saves its result: backward's version check sees the write
        (ScaleInPlace.apply(h, 3.0) + h).sum().backward()

    for mode in MODES:
        with pytest.raises(gradguard.InplaceModificationError):
            with gradguard.guard(**mode):
                run()
