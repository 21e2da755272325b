"""``check_op`` for MindSpore: the one audit engine (``checks.audit``) with MindSpore's answers to its questions.

# NOTE [MindSpore in the audit engine]
# Cells with a custom ``bprop``, plain Cells and functions of tensors get the same checks as torch ops
# (float64 finite differences with random non-unit cotangents, the reference, cotangent linearity,
# precision, regimes, mutation, composition), run in PyNative mode, plus the MindSpore-only checks of
# ``check_bprop`` (the bprop contract, weight gradients through a bprop, GRAPH_MODE). How the engine's
# questions are answered:
#   * autograd: ``linearize`` runs ``ms.vjp`` on a closure of the differentiated inputs (the other
#     arguments are closed over) and keeps the pullback in ``Linearization.state``. MindSpore tensors
#     have no torch-style ``requires_grad``: every floating-point input is differentiated unless
#     ``wrt=`` says otherwise (or some inputs are marked: ``Tensor.requires_grad_()``, Parameters).
#     A second call of the same pullback makes MindSpore recompute the forward (it warns; we silence
#     that warning), so ``mutation.backward_not_repeatable`` sees a backward that changes state kept
#     across calls, not one that changes what a single forward saved.
#   * versions: ``Tensor._version`` is MindSpore's own version counter (``copy_`` bumps it and autograd
#     checks it); ``ops.assign`` and ``__setitem__`` write without bumping it, which is exactly what
#     ``mutation.silent_input_write`` and the composition audit look for.
#   * composition: there is no ``Tensor.backward``; the producer and the op are two ``ms.vjp`` calls
#     chained by hand (``call_producer`` / ``run_graph`` / ``grad_of``), the op fed the producer's own
#     output tensor, so a write into it corrupts what the producer saved, as it would in a model.
#   * layout: MindSpore 2.x tensors are strided; a slice of a wider buffer reaches the op non-contiguous,
#     which is the ``noncontiguous`` regime. There is no channels_last memory format.
# What MindSpore cannot answer honestly is skipped with the reason (``unsupported``).
"""

from __future__ import annotations

import re
import warnings
from typing import Any, Callable, Sequence

import numpy as np
import mindspore as ms
from mindspore import nn, ops

from ..._errors import InvalidArgument
from ...checks.adapter_base import Linearization, VjpAdapter
from ...core.internal import log_fallback
from .check_bprop import FRAMEWORK_CHECKS

__all__ = ["check_op", "MindSporeCheckAdapter", "MODES"]

MODES = ("pynative", "graph")


class MindSporeCheckAdapter(VjpAdapter):
    """The MindSpore (PyNative) side of ``check_op``; ``modes`` says whether ``mode.graph`` runs."""

    name = "mindspore"
    tensor_type = ms.Tensor
    no_grad_hint = "ops.stop_gradient"
    framework_checks = FRAMEWORK_CHECKS
    unsupported = {
        "channels_last": "not run on MindSpore: MindSpore tensors carry no channels_last memory format",
        "aliasing": "not checked on MindSpore: a MindSpore tensor does not say whether autograd tracks it as a "
                    "view of an input (reshape and slicing share memory), so an alias cannot be told from a view",
    }

    def __init__(self, modes: Sequence[str] = MODES):
        self.modes = tuple(modes)
        self._chain: dict[str, Any] = {}  # composition: the producer's vjp, then the op's (NOTE above)

    @property
    def label(self) -> str:
        return f"mindspore {ms.__version__} ({ms.get_context('device_target')})"

    def dtype_name(self, t) -> str:
        return str(t.dtype).lower()

    def requires_grad(self, t) -> bool:
        """Only inputs marked with ``Tensor.requires_grad_()`` (MindSpore has no torch-style flag by default)."""
        return bool(getattr(t, "_requires_grad", False))

    def to_numpy(self, t) -> np.ndarray:
        """float64 (int64 for integer tensors) numpy copy (``asnumpy`` shares the tensor's memory)."""
        dtype = {"float": ms.float64, "complex": None}.get(self.kind(t), ms.int64)
        return np.array((t if dtype is None else t.astype(dtype)).asnumpy(), copy=True)

    @staticmethod
    def tensor_from(arr: np.ndarray, dtype_name: str) -> ms.Tensor:
        """``arr`` (a private copy: ``ms.Tensor(numpy)`` may share its memory) as a tensor of ``dtype_name``."""
        dtype = getattr(ms, dtype_name if dtype_name != "bool" else "bool_")
        return ms.Tensor(arr, ms.float64 if arr.dtype == np.float64 else None).astype(dtype)

    def to_float64(self, t):
        return t.astype(ms.float64)

    def copy(self, t):
        return t.copy()

    def noncontiguous_copy(self, t):
        """Same values, every dimension strided: the even slots of a buffer twice as wide. The odd slots hold
        NaN (0 for integers), so a kernel that ignores the strides reads them and its result shows it."""
        values = self.to_numpy(t)
        filler = np.full_like(values, np.nan if self.kind(t) == "float" else 0)
        return self.from_numpy(np.stack([values, filler], axis=-1), t)[..., 0]

    def is_contiguous(self, t) -> bool:
        return bool(t.is_contiguous())

    def _closure(self, fn: Callable, fed: Sequence[Any], kwargs: dict, positions: Sequence[int], seen: dict):
        """``fn`` of the arguments at ``positions`` (the others closed over); ``seen`` keeps its first outputs."""

        def closure(*xs):
            call = list(fed)
            for i, x in zip(positions, xs):
                call[i] = x
            pairs = self.outputs(fn(*call, **kwargs))
            diff = [(n, o) for n, o in pairs if self.kind(o) in ("float", "complex")]
            if "all" not in seen:  # a second pullback re-runs the forward (NOTE above): keep the first
                seen["all"], seen["diff"] = pairs, diff
            if not diff:  # nothing to differentiate: the engine says so (InvalidArgument), not vjp
                return ms.Tensor(0.0, ms.float64)
            return tuple(o for _, o in diff)

        return closure

    def _vjp(self, f: Callable, xs: Sequence[Any]):
        y, pullback = ms.vjp(f, *xs)
        return y, _quiet(pullback)

    zeros_like = staticmethod(ops.zeros_like)

    def pull(self, lin: Linearization, cots: list) -> list:
        pullback, diff = lin.state
        by_name, outputs = dict(zip(lin.out_names, cots)), dict(lin.all_outputs)
        # zeros for the outputs the engine dropped
        grads = pullback(tuple(by_name[n] if n in by_name else ops.zeros_like(outputs[n]) for n, _ in diff))
        return list(grads) if isinstance(grads, (tuple, list)) else [grads]

    autograd_off_phase = "forward outside ms.vjp"  # forward64 runs fn plainly: MindSpore records only in ms.vjp

    def version(self, t) -> int:
        return int(getattr(t, "_version", 0))

    def host_values(self, t) -> np.ndarray:
        return (t.astype(ms.float32) if self.dtype_name(t) == "bfloat16" else t).asnumpy()  # numpy has no bfloat16

    # ---- composition (NOTE [MindSpore in the audit engine]: two vjps chained by hand) ---------------
    def producers(self) -> dict[str, Callable]:
        return {"exp": ops.exp, "sigmoid": ops.sigmoid, "softmax": lambda a: ops.softmax(a, axis=-1), "relu": ops.relu}

    def _chained_cotangents(self, outs: list[tuple[str, Any]], chosen: list, cots: list) -> list:
        found = [next((m for m, c in enumerate(chosen) if c is o), None) for _, o in outs]  # the first, by identity
        return [cots[j] if j is not None else ops.zeros_like(o) for j, (_, o) in zip(found, outs)]

    literal_call = "ms.Tensor({values}, dtype=ms.{dtype})"
    literal_dtypes = {"bool": "bool_"}

    def signature_defaults(self, fn: Callable) -> dict[str, Any]:
        return super().signature_defaults(fn.construct if isinstance(fn, nn.Cell) else fn)

    def parameter_names(self, fn: Callable, n: int) -> list[str]:
        """Names from ``construct`` for a Cell (calling a Cell shows only ``*args``)."""
        return super().parameter_names(fn.construct if isinstance(fn, nn.Cell) else fn, n)

    module_type = nn.Cell

    phrasebook = {
        "mutation.silent_input_write": {
            "why": "MindSpore's autograd cannot see this write (ops.assign, __setitem__ and custom kernels write "
                   "without bumping Tensor._version): any earlier op that saved this tensor for its backward (exp, "
                   "sigmoid, softmax, relu... save their outputs) now computes wrong gradients silently.",
            "fix": "write into a new tensor in the forward instead of into the input; if the in-place write is "
                   "intended, use Tensor.copy_ (it bumps the version, so MindSpore raises instead of computing "
                   "wrong gradients).",
        },
        "mutation.input_write": {
            "why": "a declared in-place write: MindSpore raises if a tensor saved for backward was overwritten, so "
                   "this is safe, but callers must not reuse the input's old values.",
        },
        "mutation.backward_not_repeatable": {
            "why": "MindSpore re-runs the forward when a vjp pullback is called again, so the two gradients differ "
                   "because the forward or the bprop changes state between calls: an input written by the forward, "
                   "or a Parameter, attribute or saved buffer updated by the bprop.",
            "fix": "keep the forward and the bprop free of side effects: no writes into inputs, Parameters or "
                   "attributes.",
        },
    }
    message_phrases = (("mutation.backward_not_repeatable", "(retain_graph=True)",
                        "(a second call of the ms.vjp pullback)"),)
    composition_vjp = "y, producer_vjp = ms.vjp(ops.{}, a)"

    def reword(self, report) -> None:
        # NOTE [MindSpore wording]
        # ``mutation`` and ``composition`` explain their findings in PyTorch terms (version counters bumped by
        # torch ops, ``retain_graph``, ``increment_version``, ``.clone()``). The facts hold on MindSpore
        # (``Tensor._version``; ``ops.assign`` and ``__setitem__`` write without bumping it) but the advice does
        # not, so the texts are restated after the engine ran: fixed texts by the adapter's ``phrasebook``, the ones
        # built from the finding by ``composition_vjp`` (and MindSpore's C++ call stack is cut from quoted errors
        # here). Only the wording changes, never a verdict.
        super().reword(report)
        report.notes = [_without_cpp_stack(n) for n in report.notes]
        for f in report.findings:
            f.message = _without_cpp_stack(f.message)


def _quiet(pullback: Callable) -> Callable:
    """``pullback`` without MindSpore's warning that a second call re-runs the forward (NOTE above)."""

    def call(*cotangents):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="vjp_fn has been called multiple times")
            return pullback(*cotangents)

    return call


def _as_tensor(x: Any) -> Any:
    """Inputs as the old MindSpore check_op took them: numpy arrays and Python floats become float64 tensors."""
    if isinstance(x, float) or (isinstance(x, np.ndarray) and x.dtype.kind == "f"):
        return MindSporeCheckAdapter.tensor_from(np.array(x, dtype=np.float64), "float64")
    return ms.Tensor(np.array(x, copy=True)) if isinstance(x, np.ndarray) else x


_CPP_STACK = re.compile(r"\s*-{10,}\s*- C\+\+ Call Stack.*", re.DOTALL)


def _without_cpp_stack(text: str) -> str:
    """MindSpore appends its C++ call stack ("- C++ Call Stack: (For framework developers)") to every error."""
    return _CPP_STACK.sub("", text).strip() if isinstance(text, str) else text


def check_op(op: Any, *inputs: Any, reference: Any = None, **options: Any):
    """Audit a MindSpore op's gradients on ``inputs``: the same engine, options and report as the torch ``check_op``.

    ``op`` is an ``nn.Cell`` (typically with a custom ``bprop``) or a function of tensors; ``inputs`` are
    MindSpore tensors (numpy arrays and Python floats are taken as float64 tensors) or pass-through values;
    ``reference`` a trusted Cell or function of the same inputs. One MindSpore-only option: ``modes``
    (default ``("pynative", "graph")``): the audit runs in PyNative mode; with ``"graph"`` the op's gradient
    must also compile under GRAPH_MODE and equal PyNative's (``mode.graph``). The caller's context mode is
    restored. Returns an ``OpReport`` (``.passed``, ``.failures``, ``.failed_checks()``).
    """
    from ...checks.audit import check_options, run_check_op

    modes = options.pop("modes", MODES)
    modes = (modes,) if isinstance(modes, str) else tuple(modes)
    if "pynative" not in modes or any(m not in MODES for m in modes):
        raise InvalidArgument(
            f"check_op: modes must contain 'pynative' (the audit runs there) and may add 'graph'; got {list(modes)}. "
            f"Use modes=('pynative',) or modes=('pynative', 'graph').")
    check_options(options, extra=("modes",))
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        ms.runtime.launch_blocking()  # kernel errors at the right line, and ~10x less sync latency on CPU
    except Exception as error:
        log_fallback("backends.mindspore", "ms.runtime.launch_blocking()", error)
    try:
        return run_check_op(MindSporeCheckAdapter(modes), op, tuple(_as_tensor(x) for x in inputs), reference,
                            options)
    finally:
        ms.set_context(mode=previous)
