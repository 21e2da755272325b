"""Exact fingerprints of a tensor's bytes.

# NOTE [Fingerprint choice]
# CPU: xxh3-64 over the raw bytes (no copy for dense tensors): 15-40 GB/s, order-sensitive, so swapped
#   words and single flipped bits are caught.
# Other devices: a position-weighted int64 wrap-around sum computed on the device, so packing needs no
#   host sync; weighting by position makes it order-sensitive (a plain sum misses swapped words).
# Tensors with gaps (e.g. a column slice) are copied contiguous first: hashing the whole span would also
#   hash the gaps, which other tensors may legitimately write.
# Other devices, "sample" mode (the sentinel): no digest at all. The fingerprint is a copy of the sampled
#   values themselves (NOTE [No host sync per saved tensor] in session.py), taken in one launch.
#
# NOTE [Never allocate more than the storage the view covers]
# A broadcast operand (``x.expand(...)``, stride 0) repeats the same elements: a 4 MiB tensor expanded to
# 1 GiB would be packed into a 1 GiB copy (+1 GB peak, 10-15x slower step). The repeated dimensions are
# dropped first (size 1 in every stride-0 dimension: the same set of elements, so the same fingerprint
# meaning). A view that still has more elements than the memory it spans (overlapping windows, ``unfold``,
# ``as_strided``) has its span hashed instead of a copy. A copy is thus never larger than the view's span.
"""

from __future__ import annotations

import ctypes
import functools
import os

import numpy
import torch
import xxhash

from ...core.engine import SAMPLE_BYTES, fingerprint_bytes, sample_spans  # one "sample" definition

__all__ = ["fingerprint", "same", "SAMPLE_BYTES", "device_digest", "device_sample", "bits", "DEVICE_PATH",
           "share_elements", "byte_range"]

# NOTE [Sending CPU tensors down the device path]
# GRADGUARD_DEVICE_PATH=1 in the environment (or ``fingerprint.DEVICE_PATH = True``) fingerprints CPU tensors
# the way a GPU's are: the same torch ops, so the same dispatcher and launch overhead, the same deferred compare
# at the end of backward and the same single host read of its flag. For tests and benchmarks on machines
# without a GPU; the host sync itself costs nothing on a CPU, so CPU timings of this path are a lower bound.
DEVICE_PATH = os.environ.get("GRADGUARD_DEVICE_PATH", "") not in ("", "0")


def _permuted_dense(t: torch.Tensor) -> bool:
    """True when ``t`` covers one gap-free, non-overlapping block of memory in some dimension order."""
    expected = 1
    for size, stride in sorted((p for p in zip(t.shape, t.stride()) if p[0] != 1), key=lambda p: p[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def _keep(cache: dict, limit: int, key, value):
    """Store ``value`` under ``key`` in a cache that is emptied when it reaches ``limit`` entries; return it."""
    if len(cache) >= limit:
        cache.clear()
    cache[key] = value
    return value


def _span_elements(t: torch.Tensor) -> int:
    return 1 + sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride()) if size > 0)


def byte_range(t: torch.Tensor) -> tuple[int, int, int]:
    """(storage key, first byte, end byte) of the memory ``t`` spans; an empty tensor spans nothing. The key is the
    storage's base address, ``data_ptr()`` less the offset, without building a storage object (0.9 -> 0.4 us); an
    empty tensor's data_ptr may be null, so its storage is asked."""
    itemsize = t.element_size()
    start = t.storage_offset() * itemsize
    n = t.numel()
    if n == 0:
        return t.untyped_storage().data_ptr(), start, start
    if t.is_contiguous():
        span = n
    else:
        span = 1
        for size, stride in zip(t.shape, t.stride()):  # a loop: ~0.25 us less than sum() over a generator
            span += (size - 1) * stride
    return t.data_ptr() - start, start, start + span * itemsize


def _distinct(t: torch.Tensor) -> torch.Tensor:
    """``t`` without its repeated (stride-0) dimensions; ``t`` itself when it has none. Needs numel > 0."""
    strides = t.stride()
    if all(stride != 0 or size == 1 for size, stride in zip(t.shape, strides)):
        return t
    shape = [1 if stride == 0 else size for size, stride in zip(t.shape, strides)]
    with torch._C._DisableTorchDispatch(), torch.no_grad():
        return t.as_strided(shape, strides, t.storage_offset())


def _span(t: torch.Tensor) -> torch.Tensor:
    """The flat run of elements from ``t``'s lowest to its highest address (non-negative strides)."""
    start = t.storage_offset() + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()) if stride < 0)
    with torch._C._DisableTorchDispatch(), torch.no_grad():
        return t.as_strided((_span_elements(t),), (1,), start)


def _dense_bytes(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of exactly the tensor's memory (a copy only when the tensor has gaps or overlaps)."""
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    if t.numel() == 0:
        return t.new_empty(0, dtype=torch.uint8)
    if not t.is_contiguous():
        t = _distinct(t)
    if not t.is_contiguous():
        if _permuted_dense(t):
            # dense but permuted (a transpose, channels_last): hash its memory block as is, no copy
            t = t.as_strided((t.numel(),), (1,), t.storage_offset())
        elif t.numel() > _span_elements(t):
            t = _span(t)  # overlapping windows: the memory span is smaller than a copy
        else:
            # gaps (a column slice) or overlaps (expand): hash the values; the gaps may belong to others
            t = t.contiguous()
    return t.reshape(-1).view(torch.uint8)


def _sample(raw: torch.Tensor) -> torch.Tensor:
    n = raw.numel()
    return raw if n <= SAMPLE_BYTES else torch.cat([raw[start:end] for start, end in sample_spans(n)])  # both ends


_WEIGHTS: dict[tuple[str, int], torch.Tensor] = {}


def device_digest(raw: torch.Tensor) -> torch.Tensor:
    """[position-weighted sum, plain sum] of the 8-byte words, plus the weighted tail bytes (all int64,
    wrapping). Odd weights make any change of a single word change the weighted sum; the position weights
    make swapped words visible. Stays on the device: no host sync at pack."""
    if raw.storage_offset() % 8:
        raw = raw.clone()  # int64 words need 8-byte alignment
    n8 = raw.numel() // 8
    words = raw[: n8 * 8].view(torch.int64)
    tail = raw[n8 * 8 :].to(torch.int64) * torch.arange(1, raw.numel() - n8 * 8 + 1, device=raw.device,
                                                         dtype=torch.int64)
    key = (str(raw.device), n8)
    weights = _WEIGHTS.get(key)
    if weights is None:
        weights = _keep(_WEIGHTS, 65, key, torch.arange(1, n8 + 1, device=raw.device, dtype=torch.int64)
                        * -7046029254386353131 | 1)
    return torch.stack([(words * weights).sum(), words.sum(), tail.sum()])


_EMPTY = xxhash.xxh3_64_intdigest(b"")
_STRIDED = torch.strided


def _is_block(t: torch.Tensor) -> bool:
    """True when ``t``'s elements fill one gap-free block of memory (contiguous, transposed, channels_last)."""
    # A span equal to numel is necessary (cheap reject for gapped views such as LSTMCell's gate chunks);
    # _permuted_dense rules out overlaps.
    return t.is_contiguous() or min(t.stride()) >= 0 and _span_elements(t) == t.numel() and _permuted_dense(t)


_BYTE_ARRAYS: dict[int, type] = {}  # nbytes -> ctypes array type: a model saves a few sizes, many times


def _bytes_at(ptr: int, nbytes: int):
    array = _BYTE_ARRAYS.get(nbytes)
    if array is None:  # ``c_char * n`` builds (or looks up) the type each time: ~0.1 us more per hash
        array = _keep(_BYTE_ARRAYS, 4096, nbytes, ctypes.c_char * nbytes)
    return array.from_address(ptr)


def _hash_memory(ptr: int, nbytes: int, mode: str) -> int:
    """xxh3-64 of ``nbytes`` at ``ptr`` ("full"), or of core's fixed sample including both ends ("sample"):
    the same definition Paddle and MindSpore use (``core.fingerprint_bytes``), hashed in place."""
    if mode != "sample" or nbytes <= SAMPLE_BYTES:  # the common case, without fingerprint_bytes' memoryview
        return xxhash.xxh3_64_intdigest(_bytes_at(ptr, nbytes))
    return fingerprint_bytes(_bytes_at(ptr, nbytes), mode)


_dispatch_stack_len = torch._C._len_torch_dispatch_stack
_NUMPY_UNREADABLE = (torch.bfloat16, torch.complex32)  # no numpy dtype (nor float8): torch's copy
_NUMPY_READABLE: dict = {}  # dtype -> whether numpy can read it (asked once per dtype)


def _packed_values(t: torch.Tensor):
    """The values of a gapped CPU view, packed C-contiguous (a copy the size of the view, never of its span).

    # NOTE [Packing a gapped view through NumPy]
    # LSTMCell's gate chunks are (16, 128) views with row stride 512: 800 of them per step in the zoo's loop.
    # ``np.ascontiguousarray(t.numpy())`` packs one in ~1.2 us against ~7 us for ``t.contiguous()`` (a
    # dispatched torch op and an allocation through the caching layer); the bytes, and so the hash, are equal.
    """
    readable = _NUMPY_READABLE.get(t.dtype)
    if readable is None:  # float8 (1-byte floats) has no numpy dtype either
        readable = _NUMPY_READABLE[t.dtype] = t.dtype not in _NUMPY_UNREADABLE and not (
            t.dtype.is_floating_point and t.element_size() == 1)
    if readable:
        try:
            if not t.requires_grad and not _dispatch_stack_len():  # the sentinel's case: no mode to keep out
                return numpy.ascontiguousarray(t.numpy())
            # No op may reach a dispatch mode (``numpy()`` detaches internally): the write log would pay for it,
            # and bisect's mode, which fingerprints from inside its check, would re-enter itself.
            with torch._C._DisableTorchDispatch():
                return numpy.ascontiguousarray((t.detach() if t.requires_grad else t).numpy())
        except (TypeError, RuntimeError):  # a dtype or tensor subclass numpy cannot read: torch's copy
            pass
    with torch._C._DisableTorchDispatch():  # its bytes as uint8: numpy has no bfloat16
        return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()


_BLOCK, _BROADCAST, _OVERLAP, _GAPPED = "block", "broadcast", "overlap", "gapped"
_LAYOUTS: dict[tuple, str] = {}  # (shape, strides) -> how to hash it; a model has few layouts, seen many times


def _layout(t: torch.Tensor) -> str:
    """How a non-contiguous CPU tensor's bytes are hashed (cached per shape and strides: the checks below are
    pure Python, ~2 us together, and the same layouts come back every step)."""
    key = (t.shape, t.stride())
    kind = _LAYOUTS.get(key)
    if kind is None:
        if _is_block(t):
            kind = _BLOCK
        elif any(stride == 0 and size != 1 for size, stride in zip(t.shape, t.stride())):
            kind = _BROADCAST
        elif t.numel() > _span_elements(t):
            kind = _OVERLAP
        else:
            kind = _GAPPED
        _keep(_LAYOUTS, 4096, key, kind)
    return kind


def _fingerprint_cpu(t: torch.Tensor, mode: str) -> int:
    kind = _layout(t)
    if kind is _BLOCK:
        return _hash_memory(t.data_ptr(), t.numel() * t.element_size(), mode)  # data_ptr: the lowest address
    if kind is _BROADCAST:  # broadcast operands: the distinct elements only, then as any other view
        return _fingerprint_cpu(_distinct(t), mode)
    if kind is _OVERLAP:  # overlapping windows: hash the span, never a larger copy
        span = _span(t)
        return _hash_memory(span.data_ptr(), span.numel() * span.element_size(), mode)
    # gaps (e.g. LSTMCell's gate chunks): hash a packed copy of the values, at most the span's size
    return fingerprint_bytes(_packed_values(t), mode)


def fingerprint(t: torch.Tensor, mode: str = "full"):
    """A value that changes whenever any byte of ``t`` changes ("full"), or of a fixed sample ("sample").

    Returns an int on CPU and a small tensor on other devices (compare with :func:`same`, or defer the
    comparison: session.py). ``mode="sample"`` on a device returns the sampled values (1-D).
    """
    if not DEVICE_PATH and t.is_cpu and t.layout is _STRIDED and not (t.is_quantized or t.is_conj() or t.is_neg()):
        n = t.numel()
        if n == 0:
            return _EMPTY
        if t.is_contiguous():
            return _hash_memory(t.data_ptr(), n * t.element_size(), mode)
        return _fingerprint_cpu(t, mode)
    if mode == "sample" and (DEVICE_PATH or not t.is_cpu):
        sample = device_sample(t)
        if sample is not None:
            return sample
    with torch._C._DisableTorchDispatch(), torch.no_grad():
        raw = _dense_bytes(t.detach())
        if mode == "sample":
            raw = _sample(raw)
        if raw.device.type == "cpu" and not DEVICE_PATH:
            return xxhash.xxh3_64_intdigest(memoryview(raw.numpy()))
        return device_digest(raw)


# -- the device sample: one launch at pack, one at unpack ------------------------------------------------
_SAMPLE_INDEX: dict[tuple, torch.Tensor] = {}  # (numel, element size, device) -> logical positions sampled


def _sample_index(n: int, itemsize: int, device) -> torch.Tensor:
    """The logical element positions the device sample reads: every element up to 64 KiB, else the elements
    covering core's 16 evenly spaced 4 KiB spans (NOTE [One "sample" fingerprint]), both ends included."""
    key = (n, itemsize, device)
    index = _SAMPLE_INDEX.get(key)
    if index is None:
        spans = sample_spans(n * itemsize)
        with torch._C._DisableTorchDispatch():
            index = _keep(_SAMPLE_INDEX, 1024, key, torch.cat([
                torch.arange(start // itemsize, -(-end // itemsize), dtype=torch.int64) for start, end in spans
            ]).to(device))
    return index


def device_sample(t: torch.Tensor):
    """The sampled values of a device tensor, in one launch (a ``clone``, an ``as_strided_copy`` or a ``take``): up
    to 64 KiB, every element (a gap-free block in logical or memory order; a gapped view's values, never its gaps);
    beyond, 16 evenly spaced windows of at least 4 KiB, the first at the first element and the last ending at the
    last one (the positions of core's sample, NOTE [One "sample" fingerprint]). Its shape is the tensor's or 1-D
    or (16, window): taken the same way at pack and at unpack, so the pair compares element for element. None
    when torch cannot (quantized): the caller falls back to the digest."""
    n = t.numel()
    if n == 0 or t.is_quantized:
        return None
    try:
        if _dispatch_stack_len():  # a dispatch mode (the write log) must not see the guard's own reads
            with torch._C._DisableTorchDispatch():
                return _device_sample(t, n)
        return _device_sample(t, n)
    except (RuntimeError, TypeError, NotImplementedError):  # a dtype or layout take cannot read: digest instead
        return None


# NOTE [One launch per device sample, and no view]
# Each torch op called from Python is a dispatch of several microseconds on the host, launch or not, and the device
# path pays it twice per saved tensor (pack and unpack). So the way a layout is sampled is worked out once per
# (shape, strides, element size) and kept (``_PLANS``), and each way is one op: a gap-free tensor up to 64 KiB is
# cloned in its own shape (contiguous, or permuted: ``clone`` in contiguous order reads the same elements); a
# gapped one is cloned contiguous in its own shape; a block beyond 64 KiB is copied window by window in one
# ``as_strided_copy`` of shape (16, window). Nothing flattens a sample (``view(-1)`` was a second dispatch): the
# comparison at the end of backward joins samples alike but in their first dimension (session.py).
_CLONE, _CLONE_PACKED, _FLAT, _WINDOWS, _TAKE = range(5)
_PLANS: dict[tuple, tuple] = {}  # (shape, strides, element size) -> (plan, its numbers)
_CONTIGUOUS = torch.contiguous_format
_as_strided_copy = torch.as_strided_copy  # as_strided and clone in one call from Python


def _plan(t: torch.Tensor, n: int, itemsize: int) -> tuple:
    block = _is_block(t)  # a block has no negative stride: its lowest element is its first
    if n * itemsize <= SAMPLE_BYTES:
        if not block:  # a gapped or broadcast view: its values packed (take is one launch too, ~5x slower on a CPU)
            return (_CLONE_PACKED,)
        if not t.dim():  # a 0-dim tensor: 1-D, so that samples can be joined
            return (_FLAT,)
        return (_CLONE,) if t.is_contiguous() else (_CLONE_PACKED,)  # the block's elements, in logical order
    if not block:
        return (_TAKE,)
    # 16 evenly spaced windows of the block of >= 4 KiB each, the last one ending at its last element: (element
    # step, window length)
    chunk = -(-(SAMPLE_BYTES // 16) // itemsize)
    step = (n - chunk) // 15
    return (_WINDOWS, step, n - 15 * step)


def _device_sample(t: torch.Tensor, n: int) -> torch.Tensor:
    if t.is_conj() or t.is_neg():
        return torch.take(t, _sample_index(n, t.element_size(), t.device))
    key = (t.shape, t.stride(), t.element_size())
    plan = _PLANS.get(key)
    if plan is None:
        plan = _keep(_PLANS, 4096, key, _plan(t, n, key[2]))
    kind = plan[0]
    if kind is _CLONE:  # the common case
        return t.clone()
    if kind is _CLONE_PACKED:
        return t.clone(memory_format=_CONTIGUOUS)
    if kind is _WINDOWS:
        return _as_strided_copy(t, (16, plan[2]), (plan[1], 1), t.storage_offset())
    if kind is _FLAT:
        return _as_strided_copy(t, (n,), (1,), t.storage_offset())
    return torch.take(t, _sample_index(n, key[2], t.device))


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(x: torch.Tensor) -> torch.Tensor:
    """``x`` viewed as integers of its element size: compared bit for bit (NaN equals itself, -0.0 is not 0.0)."""
    if x.is_complex():
        x = torch.view_as_real(x)
    return x.view(_BITS[x.element_size()]) if x.is_floating_point() else x  # integers and bool as they are


def same(a, b) -> bool:
    if isinstance(a, int) or isinstance(b, int):
        return a == b
    with torch._C._DisableTorchDispatch():
        return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(bits(a), bits(b)))


# -- do two tensors over the same storage share any element? ------------------------------------------------
# NOTE [Why byte spans are not enough]
# The ledger matches writes to saved tensors by byte span, which is exact for dense tensors but not for
# views with gaps: ``gates.unsafe_chunk(4, 1)`` inside ``nn.LSTMCell`` gives four column blocks whose
# spans interleave row by row although no element is shared, and the cell writes each block in place
# (``sigmoid_``/``tanh_``) while another block is saved. Reporting that as a write would be a false
# finding, so when either side has gaps we compare the actual element offsets.
_EXACT_LIMIT = 1 << 22  # elements; beyond this we answer "maybe" (True) rather than spend the time


def _offsets(offset: int, shape, strides) -> torch.Tensor:
    offsets = torch.tensor([offset], dtype=torch.int64)
    for size, stride in zip(shape, strides):
        offsets = (offsets[:, None] + torch.arange(size, dtype=torch.int64)[None, :] * stride).reshape(-1)
    return offsets


def share_elements(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Exact when both have the same element size and at most a few million elements; else conservative."""
    if all(t.is_contiguous() or _span_elements(t) == t.numel() for t in (a, b)):  # an empty tensor is contiguous
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
