"""gradguard's errors keep PyTorch's own message text first (the diagnosis follows), so code and tests written
against PyTorch's messages (`pytest.raises(match=...)`, `"..." in str(e)`) behave the same under the guard."""

from __future__ import annotations

import pytest
import torch

import gradguard


def _sigmoid_then_mul_():
    x = torch.randn(3, requires_grad=True)
    y = x.sigmoid()
    y.mul_(2)
    y.sum().backward()


def _backward_twice():
    x = torch.randn(3, requires_grad=True)
    loss = x.exp().sum()
    loss.backward()
    loss.backward()


def _leaf_inplace():
    w = torch.randn(3, requires_grad=True)
    w.add_(1)


CASES = [
    (_sigmoid_then_mul_, "modified by an inplace operation"),
    (_sigmoid_then_mul_, r"one of the variables needed for gradient computation has been modified by an inplace "
                         r"operation: \[torch.FloatTensor \[3\]\]"),
    (_sigmoid_then_mul_, "is at version 1; expected version 0 instead"),
    (_backward_twice, "Trying to backward through the graph a second time"),
    (_leaf_inplace, "a leaf Variable that requires grad is being used in an in-place operation"),
]


@pytest.mark.parametrize("program, pattern", CASES, ids=lambda v: getattr(v, "__name__", None))
def test_pytorch_match_patterns_still_match_under_the_guard(program, pattern):
    with pytest.raises(RuntimeError, match=pattern):  # PyTorch's own behaviour, checked first
        program()
    with pytest.raises(RuntimeError, match=pattern) as caught:
        with gradguard.guard(fingerprint="sample", track_writes=False):
            program()
    assert isinstance(caught.value, gradguard.GradientHazardError)
    assert "\n\ngradguard: " in str(caught.value)  # the diagnosis follows PyTorch's sentence


def test_silent_write_has_no_pytorch_sentence():
    """PyTorch raises nothing for a write it cannot see: no invented PyTorch message."""
    x = torch.randn(4, requires_grad=True)
    with pytest.raises(gradguard.SilentModificationError) as caught:
        with gradguard.guard():
            y = x.exp()
            y.data.mul_(2)
            y.sum().backward()
    assert "modified by an inplace operation" not in str(caught.value).split("\n")[0]
