"""check_op on liger-kernel's Triton cross entropy, run for real under the Triton interpreter (tiny shapes)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported
liger = pytest.importorskip("liger_kernel.transformers.functional")

import gradguard  # noqa: E402

FAST = ("mutation", "aliasing", "composition")


def _inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(8, 8, generator=g), torch.randint(0, 8, (8,), generator=g)


def test_liger_cross_entropy_in_place_write_is_flagged():
    x, t = _inputs()
    report = gradguard.check_op(liger.liger_cross_entropy, x, t, reference=F.cross_entropy, checks=FAST)
    failed = report.failed_checks()
    assert {"mutation.silent_input_write", "composition.exp", "composition.sigmoid", "composition.softmax",
            "composition.relu"} <= failed
    write = next(f for f in report.failures if f.check == "mutation.silent_input_write")
    assert write.input == "input"
    assert write.message == "the op's forward changed the bytes of input input (float32[8, 8]) without bumping its version (0)"
    # Liger's backward also scales its saved gradient in place: a second backward is wrong
    assert "mutation.backward_not_repeatable" in failed


def test_liger_cross_entropy_on_a_clone_has_no_silent_write():
    x, t = _inputs()
    report = gradguard.check_op(lambda input, target: liger.liger_cross_entropy(input.clone(), target), x, t,
                                reference=F.cross_entropy, checks=FAST)
    failed = report.failed_checks()
    assert "mutation.silent_input_write" not in failed
    assert not any(c.startswith("composition.") for c in failed)
    assert failed == {"mutation.backward_not_repeatable"}


def test_liger_cross_entropy_gradient_values_match_reference():
    x, t = _inputs()
    report = gradguard.check_op(liger.liger_cross_entropy, x, t, reference=F.cross_entropy,
                                checks=("gradient",), probes=2)
    assert report.passed, str(report)
