"""Writes are matched to saved tensors by shared elements, not by overlapping byte spans."""

from __future__ import annotations

import pytest
import torch

import gradguard
from gradguard.backends.torch.fingerprint import share_elements


def test_interleaved_column_blocks_share_no_element():
    base = torch.zeros(4, 8)
    left, right = base[:, :4], base[:, 4:]
    assert not share_elements(left, right)
    assert share_elements(left, base[:, 3:5])
    assert share_elements(base, right)


def test_strided_rows_and_columns():
    base = torch.zeros(6, 6)
    assert not share_elements(base[::2], base[1::2])
    assert share_elements(base[::2], base[:, 0])
    assert not share_elements(base[1::2, 1:], base[::2])


def test_lstmcell_loop_has_no_false_finding_without_fingerprints():
    # nn.LSTMCell writes its gate blocks (unsafe_chunk views, no shared version counter) in place while
    # another block is saved; spans interleave, elements do not.
    torch.manual_seed(0)
    cell = torch.nn.LSTMCell(4, 8)
    x = torch.randn(5, 3, 4)
    with gradguard.guard(fingerprint="off"):
        h = c = torch.zeros(3, 8)
        for t in range(5):
            h, c = cell(x[t], (h, c))
        h.sum().backward()


def test_write_into_the_saved_block_through_an_unversioned_alias_is_still_found():
    base = torch.randn(4, 8, requires_grad=True) * 1.0
    with gradguard.guard(fingerprint="off"):
        block = base[:, :4]
        y = block.exp()  # saves its output, a dense tensor
        z = base[:, 4:].sigmoid()  # saves its output
        z.data.mul_(2)  # .data: own version counter, same memory
        with pytest.raises(gradguard.SilentModificationError) as info:
            (y.sum() + z.sum()).backward()
    assert info.value.finding.saved_at.op == "SigmoidBackward0.result"
