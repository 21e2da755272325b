"""The backend adapter: everything framework-specific the core and the public API need, behind one interface.

# NOTE [One folder per framework]
# A backend lives in ``gradguard/backends/<name>/`` and exposes ``ADAPTER`` (a :class:`BackendAdapter`)
# from its ``adapter`` module. The registry (``gradguard.backends``) imports that module only when the
# backend is asked for, so importing gradguard never imports a deep-learning framework. The core
# (``gradguard.core``) works on numpy arrays, findings and source locations only.
#
# Adding a framework, as the Paddle and MindSpore backends do it:
#   * ``adapter.py`` (``ADAPTER``: ``new_guard_session``, ``enrich_error``, ``check_op``, and ``advise`` where the
#     framework has its own advisor) and its line in ``backends.KNOWN`` (module names and typed capabilities)
#     and ``backends.INSTALL``;
#   * ``session.py``: the guard probe (a :class:`ProbeBase`), returned by ``ADAPTER.new_guard_session``, and
#     tensor names (parameter and variable names, from memory ranges);
#   * ``eager.py``: the explanation of the framework's own in-place errors (``ADAPTER.enrich_error``; MindSpore's,
#     one regular expression, lives in its ``adapter.py``);
#   * ``check.py``: ``check_op``'s adapter (a ``checks.adapter_base.AdapterBase``);
#   * a kit in ``tests/conformance/test_framework_contract.py`` and a column in ``tests/conformance/hazards.py``.
# Every entry point (``guard``, ``check_op``, ``advise``, ``gradguard run``) gets the framework from
# ``backends.choose()`` and asks the object it returns; no other module compares framework names
# (tests/fast/test_framework_choice.py lists the one exception left).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, ContextManager, Protocol, Sequence, runtime_checkable
from ..core.internal import log_fallback
from ..core.patching import Patch, apply_patch, restore_patch

__all__ = ["BackendAdapter", "GuardSession", "ProbeBase", "name_by_memory", "layer_tensors", "parameters_and_buffers"]

_COPIES = ("set_value", "copy_", "InplaceCopy", "assign", "Assign", "assign_value")  # write entry points that copy in


@runtime_checkable
class GuardSession(Protocol):
    """What ``gradguard.guard()`` drives: installed between ``enter()`` and ``exit()``."""

    backend: str
    findings: list

    def enter(self) -> None: ...
    def exit(self) -> None: ...


@runtime_checkable
class BackendAdapter(Protocol):
    """Framework-specific operations. Implementations: ``backends/{torch,paddle,mindspore,autograd}/adapter.py``.

    Tensors are the framework's own; arrays are numpy. ``mode()`` says which execution mode results hold for
    (``"eager"`` for torch/paddle dygraph, ``"pynative"`` / ``"graph"`` for MindSpore).
    """

    name: str  # "torch" | "paddle" | "mindspore" | "autograd"
    module_name: str  # the framework's top-level module: "torch" | "paddle" | "mindspore" | "autograd"

    # identity
    def is_tensor(self, obj: Any) -> bool: ...
    def mode(self) -> str: ...
    # saved-tensor checks
    def version(self, t: Any) -> int | None: ...
    def fingerprint(self, t: Any) -> int | None: ...
    def saved_tensors_hooks(self, pack: Callable, unpack: Callable) -> ContextManager: ...
    def memory_range(self, t: Any) -> tuple[int, int, int] | None: ...  # (storage key, start, end) bytes
    # naming
    def name_tensor(self, t: Any) -> tuple[str | None, str | None]: ...  # (qualified name, role)
    def describe(self, t: Any, name: str | None = None): ...  # -> core TensorInfo
    # numerics
    def to_numpy(self, t: Any): ...
    def from_numpy(self, a, *, requires_grad: bool = True) -> Any: ...
    def no_grad(self) -> ContextManager: ...
    def vjp(self, fn: Callable, inputs: Sequence[Any], cotangents: Sequence[Any]) -> list: ...
    # guard
    def new_guard_session(self, *, fingerprint: str, track_writes: bool, bisect: bool = False) -> GuardSession: ...
    def enrich_error(self, error: BaseException, session: GuardSession | None = None): ...


class AdapterBase:
    """Defaults shared by the adapters; a backend overrides what its framework supports."""

    name = "?"
    module_name = "?"
    tensor_type: type  # what ``is_tensor`` accepts (set by each adapter)

    def is_tensor(self, obj: Any) -> bool:
        return isinstance(obj, self.tensor_type)

    def mode(self) -> str:
        return "eager"

    def no_grad(self) -> ContextManager:
        return contextlib.nullcontext()

    def describe(self, t: Any, name: str | None = None):
        from ..core.findings import TensorInfo

        qualified, role = self.name_tensor(t)
        return TensorInfo(shape=tuple(int(s) for s in t.shape), dtype=self.dtype_name(t), name=qualified or name,
                          role=role or "tensor")

    def dtype_name(self, t: Any) -> str:
        return str(t.dtype).split(".")[-1]

    def fingerprint(self, t: Any) -> int | None:
        """The core "full" fingerprint of the tensor's values (the one every guard uses)."""
        import numpy as np

        from ..core.engine import fingerprint_bytes

        try:
            a = np.ascontiguousarray(self.to_numpy(t))
        except Exception as error:
            log_fallback("backends", "fingerprint of a tensor through to_numpy", error)
            return None
        return fingerprint_bytes(a, "full")

    def name_tensor(self, t: Any) -> tuple[str | None, str | None]:
        return None, None

    def enrich_error(self, error: BaseException, session=None):
        return None


class ProbeBase:
    """What every guard probe shares (the engine's questions that read one attribute, the patch bookkeeping).

    A probe (``backends/<framework>/session.py``) turns its framework's hooks into
    :mod:`gradguard.core.events` for :class:`gradguard.core.engine.GuardEngine` and answers the engine's
    :class:`~gradguard.core.engine.Probe` questions; subclasses set ``tensor_type``, ``version_attribute``
    and implement ``memory_range``, ``to_numpy``, ``name_tensor``, ``dtype_name``, ``device_name``, ``context``,
    ``saver_name`` and ``phrase`` (torch's probe answers ``version``, ``span``, ``saver`` and ``name_by_variable``).
    """

    tensor_type: type = object
    version_attribute = "_version"
    engine: Any

    def __init__(self, *, fingerprint: str = "full", track_writes: bool = True, bisect: bool = False) -> None:
        import threading

        from .._errors import error_for
        from .._rerun import in_diagnosing_rerun
        from ..core.engine import GuardEngine

        self.engine = GuardEngine(self, error_for=error_for, fingerprint=fingerprint, track_writes=track_writes,
                                  bisect=bisect, keep_extras=in_diagnosing_rerun)
        self.fingerprint_mode = self.engine.fingerprint_mode
        self.track_writes = self.engine.track_writes
        self._local = threading.local()  # per-thread "inside one of our wrappers" flags
        self._hooks = None  # the framework's saved-tensor hooks context while entered
        self._patches: list[Patch] = []

    @property
    def ledger(self):
        return self.engine.ledger

    @property
    def findings(self) -> list:
        return self.engine.findings

    def _unpack(self, record):
        from ..core.events import TensorUnpacked

        return self.engine.emit(TensorUnpacked(record))

    # -- the engine's questions that are the same everywhere --------------------------------------
    def version(self, t) -> int | None:
        try:
            return int(getattr(t, self.version_attribute))
        except Exception as error:
            log_fallback("backends", "reading the version counter", error)
            return None

    def span(self, t):
        return self.memory_range(t) if isinstance(t, self.tensor_type) else None

    def host_bytes(self, t):
        import numpy as np

        try:
            return np.ascontiguousarray(self.to_numpy(t))
        except Exception as error:
            log_fallback("backends", "copying a tensor to numpy", error)
            return None

    def restore_after_error(self) -> None:
        return None

    def exit(self) -> None:
        """Remove the wrappers and the saved-tensor hooks, then stop the engine (it raises what is pending)."""
        self._unpatch(self._patches)
        self._patches = []
        if self._hooks is not None:
            self._hooks.__exit__(None, None, None)
            self._hooks = None
        self.engine.stop()

    unnamed_role = "tensor"  # the role of a tensor no layer owns, before the engine reads its producer

    def describe(self, t):
        """Shape, dtype, device, and the name the user knows it by: a layer's parameter or buffer, else the user
        variable holding it (``name_tensor`` / ``name_by_variable``)."""
        from ..core.findings import TensorInfo

        name, role = self.name_tensor(t)
        if name is None:
            name = self.name_by_variable(t)
        return TensorInfo(shape=tuple(int(s) for s in t.shape), dtype=self.dtype_name(t), device=self.device_name(t),
                          name=name, role=role or self.unnamed_role)

    def name_by_variable(self, t) -> str | None:
        """The user variable (innermost user frame first, locals then globals) holding a tensor with exactly ``t``'s
        memory and shape: ``y`` for ``y = x * 2``, a Paddle or MindSpore activation that no layer owns, as the torch
        backend names ``out``. Error paths only: reads every user frame's variables."""
        import sys

        from ..core.frames import user_frames

        target = self.memory_range(t)
        if target is None:
            return None
        shape = tuple(int(s) for s in t.shape)
        for frame in user_frames(sys._getframe(1)):
            for scope in (frame.f_locals, frame.f_globals):
                for var, value in list(scope.items()):
                    if var.startswith("_") or not isinstance(value, self.tensor_type):
                        continue
                    try:
                        if self.memory_range(value) == target and tuple(int(s) for s in value.shape) == shape:
                            return var
                    except Exception as error:  # a tensor without memory (lazy, freed): not this one
                        log_fallback("backends", "comparing a variable's memory", error)
        return None

    def saver(self, record, tensor) -> tuple[str | None, str | None]:
        """(the op that saved it, its argument): frameworks without named node arguments name the op only."""
        return self.saver_name(record, tensor), None

    def _logged_write(self, target, run, *, op: str, category: str, via: str | None = None, skip: int = 3):
        """Run one watched write entry point (``run()``) on ``target``; when it targets saved memory, measure the
        version around it and emit a TensorWritten naming the user's line (``skip`` frames up from here)."""
        local = self._local
        if getattr(local, "busy", False) or not self.engine.watches(target):
            return run()
        from ..core.events import TensorWritten
        from ..core.frames import caller_context

        span = self.span(target)  # before the write: some writes move the data pointer
        local.busy = True  # writes our wrappers make inside this one are part of it
        try:
            before = self.version(target)
            out = run()
            after = self.version(target)
        finally:
            local.busy = False
        context = caller_context(skip=skip)
        self.engine.emit(TensorWritten(target, op, category, context.location, context.library_frame, before, after,
                                       via=via, span=span))
        return out

    def _writer(self, original, op: str, category: str, target_of: Callable, via: str | None = None):
        """``original``, a write entry point, wrapped: while something is saved, its write into
        ``target_of(args, kwargs)`` is measured and logged (``_logged_write``)."""
        engine = self.engine

        def write(*args, **kwargs):
            if not len(engine.ledger):
                return original(*args, **kwargs)
            return self._logged_write(target_of(args, kwargs), lambda: original(*args, **kwargs), op=op,
                                      category=category, via=via, skip=3)

        write.__wrapped__ = original
        write.__name__ = getattr(original, "__name__", op.rsplit(".", 1)[-1])
        return write

    def _updater(self, original, prefix: str, label: str, parameters: Callable, flag: str):
        """``original``, an optimizer's update, wrapped as a write boundary (``engine.watch_update`` on
        ``parameters(optimizer)``; ``label``: what the user called, ``{}`` for the optimizer's class), with
        ``self._local.<flag>`` set while it runs. An update inside one of our wrappers is part of that one."""
        engine = self.engine
        local = self._local

        @functools.wraps(original)
        def update(optimizer, *args, **kwargs):
            if getattr(local, "busy", False) or not len(engine.ledger):
                return original(optimizer, *args, **kwargs)
            via = label.format(type(optimizer).__name__)
            setattr(local, flag, True)
            try:
                return engine.watch_update(parameters(optimizer), lambda: original(optimizer, *args, **kwargs),
                                           op=prefix + via, category="optimizer", via=via)
            finally:
                setattr(local, flag, False)

        return update

    @staticmethod
    def _write_category(short: str) -> str:
        """A write entry point's ``WriteRecord.category``, by its name (``__setitem__``, ``copy_``, ``Assign``)."""
        return "index_assign" if short == "__setitem__" else "copy" if short in _COPIES else "other"

    # -- patches that live exactly as long as the guard --------------------------------------------
    def _patch(self, owner, name: str, wrapper) -> None:
        # NOTE [One way to patch] in core/patching.py: inherited attributes, patches stacked on ours
        patch = apply_patch(owner, name, lambda _original: wrapper)
        if patch is not None:
            self._patches.append(patch)

    @staticmethod
    def _unpatch(patches: list) -> None:
        for patch in reversed(patches):
            restore_patch(patch)


def parameters_and_buffers(layer):
    """("parameter" | "buffer", name, tensor) of a torch module's or a Paddle layer's own tensors."""
    for role, items in (("parameter", layer.named_parameters()), ("buffer", layer.named_buffers())):
        for name, value in items:
            yield role, name, value


def layer_tensors(layers: list, children: Callable, named_tensors: Callable = parameters_and_buffers,
                  roots_only: bool = False):
    """(qualified name, role, tensor) of the tensors of ``layers`` (``named_tensors(layer)`` yields (role, name,
    tensor)), outermost layers first, each named from the user's variable holding it (``net.fc.weight``);
    ``roots_only``: the outermost layers only."""
    from ..core.frames import user_variable_names

    inner = {id(c) for m in layers for c in children(m)}
    roots = [m for m in layers if id(m) not in inner]
    if not roots_only:
        roots += [m for m in layers if id(m) in inner]
    variables = user_variable_names({id(m) for m in roots})
    for layer in roots:
        prefix = variables.get(id(layer), type(layer).__name__)
        for role, name, value in named_tensors(layer):
            yield f"{prefix}.{name}", role, value


def name_by_memory(layer_type: type, children: Callable, named_tensors: Callable, same_memory: Callable):
    """(``"net.fc.weight"``, ``"parameter"`` | ``"buffer"``) of the layer tensor for which ``same_memory(value)``
    holds, or (None, None). Error paths only: scans the heap for ``layer_type`` objects (``paddle.nn.Layer``,
    ``mindspore.nn.Cell``) and names the outermost layer by its variable in the user's frames
    (:func:`layer_tensors`)."""
    import gc

    # ``type(m)`` and issubclass, not isinstance: isinstance triggers ``__class__`` properties of lazy proxies
    layers = [m for m in gc.get_objects() if issubclass(type(m), layer_type)]
    for name, role, value in layer_tensors(layers, children, named_tensors):
        try:
            if value is not None and same_memory(value):
                return name, role
        except Exception as error:  # a tensor without memory (lazy, meta): not this one
            log_fallback("backends", "comparing a module tensor's memory", error)
    return None, None
