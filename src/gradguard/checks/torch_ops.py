"""Everything ``check_op`` needs from PyTorch, behind a handful of small functions.

# NOTE [Backend adapter]
# The audit itself (``audit``, ``runs``, ``regimes``) does its
# arithmetic in float64 numpy and talks to the framework only through an object with the methods below
# (see NOTE [One audit engine] in ``adapter_base``; Paddle's and MindSpore's adapters live in their
# backend folders). Keep framework calls out of the other modules.
#
# NOTE [opcheck]
# ``torch.library.opcheck`` is folded into ``check_op``'s report for ops made with ``torch.library`` (below).
# For a ``torch.library.custom_op`` (or any ``torch.ops`` overload) the schema says which inputs the op
# mutates and that outputs are new tensors; a fake (meta) kernel says the output shapes. ``check_op``'s
# mutation audit sees bytes, not declarations: a write into an input the schema calls read-only bumps
# the version (so it looks "declared"), yet torch.compile and functionalization trust the schema and
# compute wrong results. ``opcheck``'s schema, autograd-registration and fake-tensor tests catch that;
# each failing test becomes one ``opcheck.<test>`` finding. The dynamic AOT test is left out (it
# compiles, seconds per op); gradients are check_op's own business.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Sequence

import numpy as np
import torch
import xxhash

from .adapter_base import AdapterBase
from .report import CheckResult, Failure

__all__ = ["TorchBackend", "TORCH", "SMALL_INPUT_NUMEL", "is_library_op", "audit_opcheck", "OPCHECK_TESTS"]

SMALL_INPUT_NUMEL = 1 << 16


def _np_tensor(arr) -> torch.Tensor:
    """A tensor holding a private copy of ``arr`` (0-d stays 0-d).

    # NOTE [Fresh copies]
    # ``torch.from_numpy`` shares memory, and ``.to(float64)`` of a float64 tensor is a no-op, so an op
    # whose backward writes into ``grad_output`` (``g.mul_(2)``) or whose forward writes into its input
    # would otherwise corrupt the audit's own cotangents and probe points. Every tensor handed to the op
    # is a fresh copy; every comparison uses numpy copies taken before the call.
    """
    arr = np.array(arr, copy=True, order="C")
    return torch.from_numpy(arr).reshape(arr.shape)


class TorchBackend(AdapterBase):
    """The PyTorch side of ``check_op``."""

    name = "torch"
    tensor_type = torch.Tensor
    opcheck = True
    no_grad_hint = "torch.no_grad()"

    def kind(self, t: torch.Tensor) -> str:
        """float | complex | int | bool."""
        if t.dtype.is_complex:
            return "complex"
        if t.dtype.is_floating_point:
            return "float"
        if t.dtype == torch.bool:
            return "bool"
        return "int"

    def requires_grad(self, t: torch.Tensor) -> bool:
        return bool(t.requires_grad)

    def to_numpy(self, t: torch.Tensor) -> np.ndarray:
        """float64 (or int64 for integer tensors) numpy copy."""
        t = t.detach()
        out = t.to(device="cpu", dtype=torch.float64 if t.dtype.is_floating_point else torch.int64)
        return out.numpy().copy() if out is t else out.numpy()  # a conversion made a private copy already

    def from_numpy(self, arr: np.ndarray, like: torch.Tensor, dtype_name: str | None = None) -> torch.Tensor:
        dtype = getattr(torch, dtype_name) if dtype_name else like.dtype
        return _np_tensor(arr).to(dtype=dtype, device=like.device)

    def round_to(self, arr: np.ndarray, dtype_name: str) -> np.ndarray:
        """``arr`` rounded to ``dtype_name`` and back to float64: the exact values a run in that dtype sees."""
        if dtype_name == "float64":  # nothing to round: the same copy without a trip through torch
            return np.array(arr, dtype=np.float64, copy=True)
        if dtype_name == "float32":  # numpy's cast rounds to nearest even as torch's does: no trip through torch
            with np.errstate(over="ignore"):  # beyond float32's range is inf, as torch makes it, without a warning
                return np.asarray(arr, dtype=np.float64).astype(np.float32).astype(np.float64)
        t = _np_tensor(np.asarray(arr, dtype=np.float64)).to(getattr(torch, dtype_name))
        return t.to(torch.float64).numpy().copy()

    def detached(self, t):
        return t.detach()

    def to_float64(self, t: torch.Tensor) -> torch.Tensor:
        return t.detach().to(torch.float64)

    def clone(self, t: torch.Tensor) -> torch.Tensor:
        """A private copy with the same strides (non-contiguous stays non-contiguous), detached."""
        t = t.detach()
        if t.is_contiguous():  # the common case first: clone keeps a dense tensor's strides
            return t.clone()
        if t.numel() > 1 and min(t.stride(), default=1) > 0:
            out = torch.empty_strided(tuple(t.shape), t.stride(), dtype=t.dtype, device=t.device)
            return out.copy_(t)
        return t.clone(memory_format=torch.preserve_format)

    def leaf(self, t: torch.Tensor) -> torch.Tensor:
        return t.requires_grad_(True)

    autograd_off_phase = "forward under torch.no_grad()"
    autograd_off = staticmethod(torch.no_grad)
    grad_mode = staticmethod(torch.enable_grad)
    zeros_like = staticmethod(torch.zeros_like)
    grad = staticmethod(torch.autograd.grad)

    def version(self, t: torch.Tensor) -> int:
        return int(t._version)

    def fingerprint(self, t: torch.Tensor) -> int:
        """xxh3-64 of the tensor's bytes in logical order (non-dense tensors are copied first)."""
        with torch.no_grad():
            raw = t.detach().contiguous().reshape(-1).view(torch.uint8).cpu()
            return xxhash.xxh3_64_intdigest(memoryview(raw.numpy()))

    def memory_span(self, t: torch.Tensor) -> tuple[int, int] | None:
        """[start, end) byte addresses ``t`` can touch, or None for an empty tensor."""
        if t.numel() == 0:
            return None
        start = t.data_ptr()
        extent = sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride())) + 1
        return start, start + extent * t.element_size()

    def autograd_view_of(self, out: torch.Tensor, inp: torch.Tensor) -> bool:
        """True when autograd knows ``out`` is a view of ``inp`` (a declared alias, not a hidden one)."""
        if not out._is_view():
            return False
        base = out._base
        return base is inp or (inp._is_view() and base is inp._base) or base is getattr(inp, "_base", None)

    def noncontiguous_copy(self, t: torch.Tensor) -> torch.Tensor:
        """Same values, every dimension strided (a slice of a wider buffer)."""
        wide = torch.empty(tuple(t.shape) + (2,), dtype=t.dtype, device=t.device)
        view = wide[..., 0]
        view.copy_(t.detach())
        return view

    def channels_last_copy(self, t: torch.Tensor) -> torch.Tensor:
        return t.detach().contiguous(memory_format=torch.channels_last)

    def is_contiguous(self, t: torch.Tensor) -> bool:
        return t.is_contiguous()

    def producers(self) -> dict[str, Callable]:
        """Ops whose backward reads their saved *output*: an op that writes into its input corrupts them."""
        return {
            "exp": torch.exp,
            "sigmoid": torch.sigmoid,
            "softmax": lambda a: torch.softmax(a, dim=-1),
            "relu": torch.relu,
        }

    literal_call = "torch.tensor({values}, dtype=torch.{dtype})"

    @contextlib.contextmanager
    def audit_threads(self, args: Sequence[Any]):
        """One intra-op thread while auditing small inputs.

        # NOTE [Threads]
        # The audit runs hundreds of tiny forward/backward calls. With several OpenMP threads on a busy
        # machine each tiny op can wait milliseconds at thread barriers (measured: 7 s vs 0.3 s for a
        # 6x5 cross entropy audit on a loaded 2-core box), and tiny ops gain nothing from threads.
        """
        numel = sum(a.numel() for a in args if isinstance(a, torch.Tensor))
        before = torch.get_num_threads()
        if numel <= SMALL_INPUT_NUMEL and before > 1:
            torch.set_num_threads(1)
        try:
            yield
        finally:
            if torch.get_num_threads() != before:
                torch.set_num_threads(before)

    apply_owner = torch.autograd.Function
    module_type = torch.nn.Module
    name_attrs = ("_qualname", "__qualname__", "__name__")  # torch.library.custom_op's CustomOpDef: "ns::name"


TORCH = TorchBackend()


OPCHECK_TESTS = ("test_schema", "test_autograd_registration", "test_faketensor")

_WHY = {
    "test_schema": "the op's behaviour contradicts its schema (an input written that the schema declares "
    "read-only, or an output that aliases an input): torch.compile, functionalization and autograd trust the "
    "schema and silently compute wrong results.",
    "test_autograd_registration": "the autograd formula is not registered through torch.library.register_autograd; "
    "other registrations can make gradients depend on the dispatch path.",
    "test_faketensor": "the fake (meta) kernel is missing or disagrees with the real one on shapes/dtypes: "
    "torch.compile and export trace wrong metadata.",
}
_FIX = {
    "test_schema": "declare every mutated input in mutates_args=(...) (or stop writing it), and return new tensors.",
    "test_autograd_registration": "register the backward with op.register_autograd(backward, setup_context=...).",
    "test_faketensor": "register a fake kernel with @op.register_fake that returns tensors of the real outputs' shapes and dtypes.",
}


def is_library_op(fn: Any) -> bool:
    from torch._library.custom_ops import CustomOpDef

    return isinstance(fn, (CustomOpDef, torch._ops.OpOverload, torch._ops.OpOverloadPacket))


def audit_opcheck(op) -> tuple[list[Failure], list[CheckResult], list[str]]:
    """``torch.library.opcheck`` on the op under audit (a ``runs.Subject``): NOTE [opcheck]."""
    fed, _ = op.B.prepare(op.args, op.wrt)
    try:
        results = torch.library.opcheck(op.fn, tuple(fed), dict(op.kwargs), test_utils=OPCHECK_TESTS,
                                        raise_exception=False)
    except Exception as exc:  # opcheck itself could not run (e.g. an op torch.library cannot introspect)
        return [], [CheckResult("opcheck", "given", "skip", f"torch.library.opcheck could not run: {type(exc).__name__}")], [
            f"torch.library.opcheck could not run on this op ({type(exc).__name__}: {str(exc)[:160]}); schema and fake-tensor checks skipped"]
    findings, checks = [], []
    for test in OPCHECK_TESTS:
        outcome = results.get(test, "SUCCESS")
        name = f"opcheck.{test.removeprefix('test_')}"
        if outcome == "SUCCESS":
            checks.append(CheckResult(name, "given", "pass"))
            continue
        first = str(outcome).strip().splitlines()[0] if str(outcome).strip() else type(outcome).__name__
        findings.append(Failure(check=name, regime="given", message=f"torch.library.opcheck {test} failed: {first[:300]}",
                                why=_WHY[test], fix=_FIX[test]))
        checks.append(CheckResult(name, "given", "fail"))
    return findings, checks, []
