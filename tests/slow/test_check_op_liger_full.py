"""Full check_op audit of liger-kernel's cross entropy under the Triton interpreter (several seconds)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

os.environ.setdefault("TRITON_INTERPRET", "1")
liger = pytest.importorskip("liger_kernel.transformers.functional")

import gradguard  # noqa: E402


def test_full_audit_flags_writes_and_layout_but_not_gradient_values():
    g = torch.Generator().manual_seed(0)
    x, t = torch.randn(8, 8, generator=g), torch.randint(0, 8, (8,), generator=g)
    report = gradguard.check_op(liger.liger_cross_entropy, x, t, reference=F.cross_entropy)
    failed = report.failed_checks()
    assert {"mutation.silent_input_write", "mutation.backward_not_repeatable", "composition.softmax"} <= failed
    # the kernel only takes a row stride: an input with a strided last dimension is read wrongly
    assert "regime.noncontiguous" in failed
    # its gradient values (on a fresh graph) agree with torch's cross entropy in every value regime
    for check in ("gradient.numerical", "gradient.reference", "regime.sentinel_indices", "regime.large_magnitude"):
        assert check not in failed, str(report)
