"""Real Triton kernels (interpreter on CPU, TRITON_INTERPRET=1 set in conftest): Liger-Kernel 0.8.5's cross
entropy and a kernel of our own, both storing a gradient into their input without a version bump."""

import inspect
import os
import pathlib
import sys

import pytest
import torch

assert os.environ.get("TRITON_INTERPRET") == "1"
triton = pytest.importorskip("triton")
liger_functional = pytest.importorskip("liger_kernel.transformers.functional")

import gradguard  # noqa: E402
from gradguard import InplaceModificationError, SilentModificationError  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _triton_kernels import SquareSum  # noqa: E402

liger_cross_entropy = liger_functional.liger_cross_entropy
HERE = pathlib.Path(__file__)
SOURCE = HERE.read_text().splitlines()
SHORT = HERE.relative_to(pathlib.Path.cwd()) if HERE.is_relative_to(pathlib.Path.cwd()) else HERE


def line_of(marker: str) -> int:
    (hit,) = [i + 1 for i, text in enumerate(SOURCE) if text.rstrip().endswith("# " + marker)]
    return hit


def liger_launch_line() -> int:
    from liger_kernel.ops import cross_entropy

    lines, start = inspect.getsourcelines(cross_entropy.cross_entropy_forward)
    (offset,) = [i for i, text in enumerate(lines) if "liger_cross_entropy_kernel[" in text]
    return start + offset


def inputs(rows=8, cols=8):
    torch.manual_seed(0)
    return torch.randn(rows, cols, requires_grad=True), torch.randint(0, cols, (rows,))


def liger_after_softmax():
    a, target = inputs()
    p = torch.softmax(a, dim=-1)  # liger-save
    loss = liger_cross_entropy(p, target)  # liger-call
    loss.backward()


def test_liger_cross_entropy_after_softmax_message_is_exact():
    with pytest.raises(SilentModificationError) as info:
        with gradguard.guard():
            liger_after_softmax()  # liger-helper
    where = f"{SHORT}:{line_of('liger-call')}"  # run from the repository root, as CI does (wrapping)
    expected = f"""\
a tensor saved for backward changed without its version counter moving: gradients would be silently wrong
  tensor      : p (float32[8, 8], output of SoftmaxBackward0)
  saved by    : SoftmaxBackward0.result, saved in the forward call at
                {SHORT}:{line_of('liger-save')}
                 | {SOURCE[line_of('liger-save') - 1].strip()}
  called from : {SHORT}:{line_of('liger-helper')}
                 | {SOURCE[line_of('liger-helper') - 1].strip()}
  versions    : saved at 0, now 0
  modified by :
    1. triton:liger_cross_entropy_kernel via LigerCrossEntropyFunction.forward at
       {where}  (version 0 -> 0)  [no version bump: invisible to the
       framework]
       | {SOURCE[line_of('liger-call') - 1].strip()}
       inside liger_kernel/ops/cross_entropy.py:{liger_launch_line()} in cross_entropy_forward
  why         : Its bytes changed while its version counter did not, so the framework's own check
                cannot see it. The Triton kernel `liger_cross_entropy_kernel` (launched by
                LigerCrossEntropyFunction.forward), called at {where},
                wrote into memory that SoftmaxBackward0.result saved for backward.
  fix         : Kernel authors: write results into a fresh buffer (`torch.empty_like(x)`), or
                declare the write with `torch.autograd.graph.increment_version(x)` right after the
                kernel (or `ctx.mark_dirty(x)` and return x) so autograd can check it. Users: pass a
                copy (`op(x.clone())`) to the kernel."""
    assert str(info.value) == expected


@pytest.mark.parametrize("producer, saver", [
    (lambda a: torch.exp(a), "ExpBackward0.result"),
    (lambda a: torch.sigmoid(a), "SigmoidBackward0.result"),
    (lambda a: torch.relu(a), "ReluBackward0.result"),
    (lambda a: torch.softmax(a, -1), "SoftmaxBackward0.result"),
], ids=["exp", "sigmoid", "relu", "softmax"])
def test_liger_after_any_producer_that_saves_its_output(producer, saver):
    a, target = inputs()
    with pytest.raises(SilentModificationError) as info:
        with gradguard.guard():
            liger_cross_entropy(producer(a), target).backward()
    f = info.value.finding
    (w,) = f.modified_at
    assert (f.saved_at.op, w.op, w.via, w.category) == (
        saver, "triton:liger_cross_entropy_kernel", "LigerCrossEntropyFunction.forward", "kernel")


def test_liger_with_a_clone_is_clean_and_gradients_match_torch():
    a, target = inputs()
    with gradguard.guard() as g:
        liger_cross_entropy(torch.softmax(a, -1).clone(), target).backward()
    assert g.findings == []
    a2 = a.detach().clone().requires_grad_(True)
    torch.nn.functional.cross_entropy(torch.softmax(a2, -1), target).backward()
    assert torch.allclose(a.grad, a2.grad, atol=1e-6)


def test_liger_backward_twice_with_retain_graph_is_flagged():
    a, target = inputs()
    with pytest.raises(SilentModificationError) as info:
        with gradguard.guard():
            loss = 2 * liger_cross_entropy(a * 1.0, target)
            loss.backward(retain_graph=True)
            loss.backward(retain_graph=True)  # plain: this gradient silently doubles
    f = info.value.finding
    (w,) = f.modified_at
    assert f.saved_at.node == "LigerCrossEntropyFunctionBackward"
    assert (w.op, w.via) == ("triton:element_mul_kernel", "LigerCrossEntropyFunction.backward")


def test_liger_is_silent_without_the_guard_and_the_guard_changes_no_gradient():
    """The bug is real (plain PyTorch is silent and wrong) and the clean variant is bit-identical guarded."""
    a, target = inputs()
    liger_cross_entropy(torch.softmax(a, -1), target).backward()  # no error from PyTorch
    wrong = a.grad.clone()
    a2 = a.detach().clone().requires_grad_(True)
    torch.nn.functional.cross_entropy(torch.softmax(a2, -1), target).backward()
    assert not torch.allclose(wrong, a2.grad, atol=1e-4)
    a3 = a.detach().clone().requires_grad_(True)
    liger_cross_entropy(torch.softmax(a3, -1).clone(), target).backward()
    a4 = a.detach().clone().requires_grad_(True)
    with gradguard.guard():
        liger_cross_entropy(torch.softmax(a4, -1).clone(), target).backward()
    assert torch.equal(a3.grad, a4.grad)


def test_own_triton_kernel_storing_into_its_input_is_named():
    a, _ = inputs()
    with pytest.raises(SilentModificationError) as info:
        with gradguard.guard():
            SquareSum.apply(torch.sigmoid(a), "inplace").backward()
    f = info.value.finding
    (w,) = f.modified_at
    assert (f.saved_at.op, w.op, w.via) == ("SigmoidBackward0.result", "triton:square_sum_grad_into_input",
                                            "SquareSum.forward")
    assert w.location.code.startswith("square_sum_grad_into_input[grid](")


def test_own_triton_kernel_corrected_variants():
    a, _ = inputs()
    with gradguard.guard() as g:
        SquareSum.apply(torch.exp(a), "out_of_place").backward()
    assert g.findings == []
    assert torch.allclose(a.grad, 2 * torch.exp(2 * a.detach()))
    with pytest.raises(InplaceModificationError):  # declared write: loud, as in plain PyTorch
        with gradguard.guard():
            SquareSum.apply(torch.exp(a), "increment_version").backward()


def test_triton_launcher_is_unwrapped_on_exit():
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    before = (JITFunction.__dict__["run"], InterpretedFunction.__dict__["run"])
    with pytest.raises(SilentModificationError):
        with gradguard.guard():
            assert InterpretedFunction.__dict__["run"] is not before[1]
            liger_after_softmax()
    assert (JITFunction.__dict__["run"], InterpretedFunction.__dict__["run"]) == before


def test_liger_on_logits_nobody_saved_is_clean_and_bit_identical():
    """The usual LM head: Liger overwrites the logits, but no node saved them, so nothing is wrong."""
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 16)
    x = torch.randn(8, 8, requires_grad=True)
    target = torch.randint(0, 16, (8,))
    liger_cross_entropy(head(x), target).backward()
    plain = [x.grad.clone()] + [p.grad.clone() for p in head.parameters()]
    x.grad = None
    head.zero_grad()
    with gradguard.guard() as g:
        liger_cross_entropy(head(x), target).backward()
    assert g.findings == []
    guarded = [x.grad] + [p.grad for p in head.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(plain, guarded))
