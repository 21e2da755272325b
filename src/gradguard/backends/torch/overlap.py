"""Do two tensors over the same storage share any element?

# NOTE [Why byte spans are not enough]
# The ledger matches writes to saved tensors by byte span, which is exact for dense tensors but not for
# views with gaps: ``gates.unsafe_chunk(4, 1)`` inside ``nn.LSTMCell`` gives four column blocks whose
# spans interleave row by row although no element is shared, and the cell writes each block in place
# (``sigmoid_``/``tanh_``) while another block is saved. Reporting that as a write would be a false
# finding, so when either side has gaps we compare the actual element offsets.
"""

from __future__ import annotations

import functools

import torch

from .fingerprint import _span_elements

__all__ = ["share_elements"]

_EXACT_LIMIT = 1 << 22  # elements; beyond this we answer "maybe" (True) rather than spend the time


def _is_dense(t: torch.Tensor) -> bool:
    return t.is_contiguous() or _span_elements(t) == t.numel()  # an empty tensor is contiguous


def _offsets(offset: int, shape, strides) -> torch.Tensor:
    offsets = torch.tensor([offset], dtype=torch.int64)
    for size, stride in zip(shape, strides):
        offsets = (offsets[:, None] + torch.arange(size, dtype=torch.int64)[None, :] * stride).reshape(-1)
    return offsets


def share_elements(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Exact when both have the same element size and at most a few million elements; else conservative."""
    if _is_dense(a) and _is_dense(b):
        return True  # their byte spans already overlap (the caller checked), and spans are exact here
    if a.element_size() != b.element_size() or max(a.numel(), b.numel()) > _EXACT_LIMIT:
        return True
    # Only the relative geometry matters, and the same pair recurs every step (LSTMCell's gates): cache it.
    return _share_geometry(b.storage_offset() - a.storage_offset(), tuple(a.shape), a.stride(), tuple(b.shape),
                           b.stride())


@functools.lru_cache(maxsize=4096)
def _share_geometry(relative_offset, shape_a, stride_a, shape_b, stride_b) -> bool:
    with torch._C._DisableTorchDispatch(), torch.no_grad():
        a = _offsets(0, shape_a, stride_a)
        b = _offsets(relative_offset, shape_b, stride_b)
        return bool(torch.isin(a, b).any())
