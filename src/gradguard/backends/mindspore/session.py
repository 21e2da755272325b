"""The MindSpore probe (PyNative): saved-tensor hooks and a write log that feed the core guard engine
(:class:`gradguard.core.engine.GuardEngine`); it says in one line what it cannot watch (graph mode, ``ms.jit``).

# NOTE [What MindSpore 2.10 allows]
#   * ``ms.saved_tensors_hooks`` works in PyNative only (inside ``ms.jit`` it is a TypeError); pack/unpack run
#     inside ``ms.grad`` / ``value_and_grad`` / ``vjp`` calls, including for Cells with a custom ``bprop``.
#     Installing them switches MindSpore's own version check off, so the engine redoes it. Unlike Paddle, an
#     exception raised in unpack propagates cleanly (type kept, autograd still usable): ``raise_at_unpack``.
#   * On CPU ``t[i] = v``, ``ops.assign`` and ``assign_value`` change values WITHOUT bumping ``_version``:
#     silent wrong gradients. The content fingerprint catches them.
#   * ``ms.MsDispatchMode`` sees ``Inplace*`` / ``Assign*`` ops but not ``__setitem__`` / ``assign_value``; the
#     session logs writes from both (dispatch mode + wrappers on the Python entry points).
"""

# NOTE [What the guard cannot watch: GRAPH_MODE and ms.jit]
#   Compiled code runs no Python hooks: saved tensors inside a graph are never packed, and writes inside it are
#   never logged. The guard warns once, in one line, when it is entered in GRAPH_MODE and when a function
#   decorated with ``ms.jit`` is called inside it; what runs in PyNative around them is still watched.
from __future__ import annotations

import functools
import warnings

import mindspore as ms
from mindspore import nn, ops

from ...core.facts import Facts
from ...core.engine import phrase_fix
from ...core.events import TensorSaved
from ...core.findings import Finding, TensorInfo
from ...core.frames import LIBRARY_PATHS, user_location
from ...core.internal import log_fallback
from ...core.source_ast import call_name
from ..adapter import ProbeBase, name_by_memory

__all__ = ["MindSporeGuardSession", "GraphModeNotWatched", "mindspore_fix", "name_tensor", "memory_range",
           "current_mode"]

LIBRARY_PATHS.add(ms.__path__[0])


def current_mode() -> str:
    """``"graph"`` (GRAPH_MODE) or ``"pynative"``."""
    return "graph" if ms.get_context("mode") == ms.GRAPH_MODE else "pynative"


def memory_range(t):
    try:
        ptr = int(t.data_ptr())
        n = int(t.nbytes)
    except Exception as error:
        log_fallback("backends.mindspore", "reading data_ptr/nbytes", error)
        return None
    if not ptr or n <= 0:
        return None
    return 0, ptr, ptr + n


def name_tensor(t) -> tuple[str | None, str | None]:
    """(qualified name, "parameter") of the Cell parameter sharing ``t``'s memory, or (None, None): ``net.w`` rather
    than ``float64[3]``. A heap scan for ``nn.Cell`` objects, only when a finding is built (as the torch and Paddle
    backends do, :func:`gradguard.backends.adapter.name_by_memory`)."""
    target = memory_range(t)
    if target is None:
        return None, None
    return name_by_memory(nn.Cell, lambda cell: cell.cells(),
                          lambda cell: (("parameter", name, p) for name, p in cell.parameters_and_names()),
                          lambda value: memory_range(value) == target)


class GraphModeNotWatched(UserWarning):
    """The guard was active around MindSpore code it cannot see (GRAPH_MODE, ``ms.jit``)."""


GRAPH_MODE_LINE = ("gradguard.guard: MindSpore is in GRAPH_MODE, where saved tensors and in-place writes run "
                   "inside the compiled graph and are NOT watched; run the step in PYNATIVE_MODE to guard it")
JIT_LINE = ("gradguard.guard: {name} is compiled by ms.jit; saved tensors and writes inside it are NOT watched "
            "(only the PyNative code around it is)")


def _not_watched(message: str) -> None:
    """One warning line, attributed to the user's line (not to MindSpore's or gradguard's frames)."""
    site = user_location(2)
    if site is None:
        warnings.warn(message, GraphModeNotWatched, stacklevel=3)
    else:
        warnings.warn_explicit(message, GraphModeNotWatched, site.file, site.line, module="gradguard")


class _WriteMode(ms.MsDispatchMode):
    def __init__(self, session):
        super().__init__()
        self._session = session

    def __ms_dispatch__(self, func, args, kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "name", "")
        if (name.startswith("Inplace") or name.startswith("Assign")) and len(self._session.engine.ledger):
            target = next((a for a in args if isinstance(a, ms.Tensor)), None)
            if target is not None:
                return self._session._logged_write(target, lambda: func(*args, **kwargs), op=f"mindspore.ops.{name}",
                                                   category=ProbeBase._write_category(name), skip=3)
        return func(*args, **kwargs)


class MindSporeGuardSession(ProbeBase):
    """The MindSpore probe: hooks and the write log between ``enter()`` and ``exit()``."""

    backend = "mindspore"
    tensor_type = ms.Tensor
    raise_at_unpack = True  # see NOTE [What MindSpore 2.10 allows]
    framework = "MindSpore"
    # who writes memory without a MindSpore op, and the fix (the engine's wording of a silent write no op made)
    direct_writers = ("code that writes the tensor's memory directly: a NumPy array from `t.asnumpy()` (on CPU it "
                      "shares the tensor's memory), ctypes, or an extension using `data_ptr()`")
    optimizer_fix = ("Compute the gradients first and call the optimizer after `ms.grad` / `value_and_grad` returns "
                     "(`grads = grad_fn(x); optimizer(grads)`), never inside the function being differentiated.")
    direct_write_fix = ("Give NumPy a copy (`t.asnumpy().copy()`), or make the update with MindSpore ops on a new "
                        "tensor (`ops.where`, `ops.tensor_scatter_elements`) after the backward that needs the old "
                        "values.")
    _mode = None  # the write log's dispatch mode while entered

    def enter(self) -> None:
        if current_mode() == "graph":
            _not_watched(GRAPH_MODE_LINE)
        self._hooks = ms.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        try:  # a step that fails midway leaves nothing installed (tests/conformance/test_framework_contract.py)
            self._watch_jit()
            self._watch_optimizers()
            if self.track_writes:
                for owner, name, label in ((ms.Tensor, "__setitem__", "Tensor.__setitem__"),
                                           (ms.Tensor, "assign_value", "Tensor.assign_value"),
                                           (ops, "assign", "ops.assign"), (ops, "assign_add", "ops.assign_add"),
                                           (ops, "assign_sub", "ops.assign_sub")):
                    original = getattr(owner, name, None)
                    if original is not None:
                        # what they write: their first argument (a non-tensor is not logged)
                        self._patch(owner, name, self._writer(original, f"mindspore.{label}",
                                                              self._write_category(name),
                                                              lambda args, kwargs: args[0] if args else None))
                mode = _WriteMode(self)
                mode.__enter__()
                self._mode = mode  # only once entered: exit() must not exit a mode that never entered
            self.engine.start(skip=3)
        except BaseException:
            self.exit()
            raise

    def exit(self) -> None:
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._mode = None
        super().exit()

    def _watch_optimizers(self) -> None:
        """A MindSpore optimizer call is a write boundary: its ``construct`` is compiled (``ms.jit``), so neither
        the dispatch mode nor the wrappers see it update the parameters, and the update does not bump
        ``_version`` (measured on 2.10: a step between forward and backward is silently wrong). While it runs,
        ``_local.optimizer`` is set: its compiled construct is watched here, so no "not watched" line for it."""
        self._patch(ms.nn.Optimizer, "__call__", self._updater(ms.nn.Optimizer.__call__, "mindspore.nn.", "{}(grads)",
                                                               lambda optimizer: list(optimizer.parameters),
                                                               "optimizer"))

    # -- hooks -> events -----------------------------------------------------------------------
    def _pack(self, t):
        return self.engine.emit(TensorSaved(t, user_location(2), None))

    def _watch_jit(self) -> None:
        """Every compiled call (``ms.jit`` functions, decorated before or inside the guard) goes through
        ``_JitExecutor.__call__``: while the guard is active it says once per function that it is not watched."""
        try:
            from mindspore.graph.api import _JitExecutor
        except ImportError:  # another MindSpore layout: say it once, up front
            _not_watched(JIT_LINE.format(name="any ms.jit function"))
            return
        original = _JitExecutor.__call__
        warned: set[str] = set()
        local = self._local

        @functools.wraps(original)
        def call(executor, *args, **kwargs):
            fn = getattr(executor, "fn", None)
            name = getattr(fn, "__qualname__", None) or repr(fn)
            if name not in warned and current_mode() != "graph" and not getattr(local, "optimizer", False):
                warned.add(name)
                _not_watched(JIT_LINE.format(name=name))
            return original(executor, *args, **kwargs)

        self._patch(_JitExecutor, "__call__", call)

    # -- the engine's questions ----------------------------------------------------------------
    memory_range = staticmethod(memory_range)
    to_numpy = staticmethod(lambda t: t.asnumpy())

    name_tensor = staticmethod(name_tensor)
    unnamed_role = "activation"

    @staticmethod
    def dtype_name(t) -> str:
        return str(t.dtype).lower()

    @staticmethod
    def device_name(t) -> str:
        return ms.get_context("device_target").lower()

    def context(self) -> Facts:
        return Facts(mode=current_mode(), device=ms.get_context("device_target"), mindspore_version=ms.__version__,
                     optimizers_bump_versions=False)

    def saver_name(self, record, tensor: TensorInfo) -> str | None:
        # A parameter is an operand on the saving line: name the op that takes it (`multiply` in
        # `ops.sin(net.w * x)`), not the line's outermost call.
        return call_name(record.site.code, operand=tensor.name) if record.site is not None else None

    def phrase(self, finding: Finding, record) -> None:
        if finding.kind == "silent_write":
            finding.notes.append("MindSpore's version counter did not move (on CPU `t[i] = v`, ops.assign, "
                                 "assign_value and writes through `asnumpy()` do not bump it): without gradguard this "
                                 "gradient would be silently wrong.")
        mindspore_fix(finding)


_FIXES = {
    "index_assignment": "Assign into a copy (`y = x.copy(); y[idx] = v`), or build the result out of place "
    "(`ops.where(mask, v, x)` / `ops.tensor_scatter_elements`).",
    "generic_inplace": "Clone before writing (`y = x.copy()` and write into y), or use the out-of-place op "
    "(`ops.add(x, v)` instead of `ops.assign(x, ...)`).",
}


def mindspore_fix(finding: Finding) -> Finding:
    return phrase_fix(finding, _FIXES)
