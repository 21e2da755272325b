"""Writer attribution: name what wrote into saved memory when no version counter moved.

The write log (``writes.py``) sees every *torch op* that writes, ``.data`` and ``from_numpy``/DLPack aliases
included, but not writes below the dispatcher: Triton kernels, C++/CUDA extensions writing through ``data_ptr()``,
NumPy. This module catches those at two boundaries, without any cooperation from the writer:

* ``Function.apply`` (forward) and ``BackwardCFunction.apply`` (a custom Function's backward), wrapped while a
  guard is active: the saved tensors sharing storage with the call's tensors (forward: its tensor arguments;
  backward: its own saved tensors) are hashed before the call and compared after it.
* Triton launches (``JITFunction.run`` / ``InterpretedFunction.run``: what ``kernel[grid](...)`` calls, compiled or
  under ``TRITON_INTERPRET=1``), the same way, keyed on the launch's tensor arguments.

The Function wrappers and ``Tensor.register_hook`` also run the hygiene checks of ``function_hygiene.py`` (ctx
attributes, undeclared input writes, writes into shared gradients) in every mode, the sentinel included; the
hashing of saved memory above runs only with the write log on.

# NOTE [Only saved memory is hashed]
# A boundary hashes nothing unless one of the call's tensors shares storage with a tensor currently saved
# for backward (one dict lookup per tensor argument otherwise). It then hashes every saved tensor on that
# storage, because a kernel gets a pointer and may write anywhere in it.
#
# NOTE [Innermost boundary wins]
# A Triton launch inside a custom Function's forward is attributed to the launch (and names the Function
# in ``via``); the Function boundary then skips records that already got a write during the call. Torch
# ops the Triton interpreter itself runs to copy results back (``copy_`` of the storage) are not logged as
# writes: the launch boundary reports them as the kernel's.
#
# NOTE [Patching is global, reference counted, and undone on exit]
# The class attributes are patched when the first session enters and restored when the last one exits,
# also after exceptions. The wrappers consult the innermost active session and pass straight through when
# there is none, so other threads see only one extra Python call.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref

import torch

from ..._errors import GradientHazardError
from ...core.findings import WriteRecord
from ...core.internal import log_fallback
from ...core.patching import SharedPatches
from ...core.frames import LIBRARY_PATHS, caller_context
from . import compat as _compat, function_hygiene as _function_hygiene, second_order as _second_order
from .fingerprint import fingerprint as _fingerprint, same as _same

__all__ = ["install", "uninstall", "in_kernel", "maybe_wrap_triton", "snapshot"]

_lock = threading.RLock()
_sessions: list = []  # active sessions, innermost last (weak references)
_local = threading.local()


def _stack() -> list:
    return _local.__dict__.setdefault("calls", [])


def _attributed(session, snap, op: str, skip: int, run, *args):
    """``run(*args)`` as the boundary ``op`` (the ``via`` of a Triton launch inside); report what it wrote unseen."""
    stack = _stack()
    stack.append(op)
    try:
        return run(*args)
    finally:
        stack.pop()
        if snap:
            changed = snap.changed()
            if changed:
                _report(session, changed, op=op, via=None, skip=skip + 1)


def in_kernel() -> bool:
    """True while a Triton launch boundary is running on this thread (its own torch ops are not writes)."""
    return getattr(_local, "kernel_depth", 0) > 0


def _active():
    sessions = _sessions
    while sessions:
        session = sessions[-1]()
        if session is not None:
            return session
        with _lock:
            if sessions and sessions[-1]() is None:
                sessions.pop()
    return None


def _tensors(values) -> list[torch.Tensor]:
    out = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out.extend(x for x in v if isinstance(x, torch.Tensor))
        elif isinstance(base := getattr(v, "base", None), torch.Tensor):  # triton.TensorWrapper
            out.append(base)
    return out


def _storage_key(t: torch.Tensor) -> int | None:
    if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.is_sparse or t.is_meta:
        return None
    try:
        return t.untyped_storage().data_ptr()
    except Exception as error:  # a tensor without a storage (functional wrappers): no key, not attributed
        log_fallback("torch.attribution", "reading a storage pointer", error)
        return None


class Snapshot:
    """Fingerprints of the saved tensors on the storages of some tensors, to compare after a call."""

    __slots__ = ("session", "entries")

    def __init__(self, session, entries):
        self.session = session
        self.entries = entries  # [(record, version, fingerprint, writes_before)]

    def __bool__(self) -> bool:
        return bool(self.entries)

    def changed(self) -> list:
        """Records whose bytes changed while their version did not, and that no inner boundary explained."""
        mode = self.session.boundary_mode
        # A visible write (its version moved) is the version check's and the write log's; a record with more writes
        # than before was already attributed (by an inner boundary or the write log).
        return [record for record, version, fp, writes_before in self.entries
                if record.tensor._version == version and len(record.writes or ()) <= writes_before
                and not _same(_fingerprint(record.tensor, mode), fp)]


def snapshot(session, tensors) -> Snapshot:
    ledger = session.ledger
    mode = session.boundary_mode
    entries: list = []
    if mode is None:
        return Snapshot(session, entries)
    seen_storage: set[int] = set()
    seen: set[int] = set()
    for t in tensors:
        key = _storage_key(t)
        if not key or key in seen_storage or not ledger.has_storage(key):
            continue
        seen_storage.add(key)
        for record in ledger.overlapping(key, 0, 1 << 62):
            if id(record) in seen or record.version is None:
                continue
            seen.add(id(record))
            entries.append((record, record.tensor._version, _fingerprint(record.tensor, mode),
                            len(record.writes or ())))
    return Snapshot(session, entries)


_GRADGUARD_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
_SKIP_FRAMES = [_GRADGUARD_DIR]  # never the "inside ..." frame of a kernel write (triton's own dir is added)


def _library_frame(skip: int) -> str | None:
    """Innermost library frame that is not gradguard or Triton's launcher: where the library launched it."""
    try:
        frame = sys._getframe(skip + 1)
    except ValueError:
        return None
    skipped = tuple(_SKIP_FRAMES)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not LIBRARY_PATHS.is_library(filename):
            return None
        if not filename.startswith(skipped) and "/torch/autograd/function.py" not in filename.replace(os.sep, "/"):
            parts = filename.replace(os.sep, "/").split("/site-packages/")
            return f"{parts[-1]}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back
    return None


def _report(session, records, *, op: str, via: str | None, skip: int) -> None:
    context = caller_context(skip=skip + 1)
    write = WriteRecord(op=op, location=context.location, via=via, library_frame=_library_frame(skip + 1),
                        category="kernel", bumps_version=False)
    session.record_write(records, write)


_registered: set[str] = set()


def _register_library(obj) -> None:
    """Frames of third-party kernel libraries (liger_kernel, triton ...) are library frames, not user lines."""
    name = getattr(obj, "__module__", None) or ""
    if name in _registered:
        return
    _registered.add(name)
    module = sys.modules.get(name)
    path = getattr(module, "__file__", None)
    if not path:
        return
    parts = os.path.abspath(path).split(os.sep)
    i = next((parts.index(marker) for marker in ("site-packages", "dist-packages") if marker in parts), None)
    if i is not None and i + 1 < len(parts):
        LIBRARY_PATHS.add(os.sep.join(parts[: i + 2]))


def _function_apply(original):
    # NOTE [Function.apply is a classmethod before torch 2.14 and a C classmethod_descriptor since]
    # Both are descriptors: ``original.__get__(None, cls)`` binds either to the subclass being applied, so the
    # wrapper needs no version check (a classmethod_descriptor has no ``__func__`` to unwrap).
    def call(cls, args, kwargs):
        return original.__get__(None, cls)(*args, **kwargs)

    def apply(cls, *args, **kwargs):
        session = _active()
        if session is None:
            return call(cls, args, kwargs)
        inputs = _hygiene("reading a Function's inputs", _function_hygiene.inputs_before_forward, args, kwargs)
        if session.boundary_mode is None:
            result = call(cls, args, kwargs)
        else:
            _register_library(cls)
            snap = snapshot(session, _tensors(args) + _tensors(kwargs.values()))
            result = _attributed(session, snap, f"{cls.__name__}.forward", 2, call, cls, args, kwargs)
        if inputs is not None:
            _hygiene("checking a Function's forward", _function_hygiene.after_forward, session, cls, inputs, result)
        return result

    apply.__wrapped__ = original
    return classmethod(apply)


def _backward_apply(original):
    def apply(self, *args):
        session = _active()
        if session is None:
            return original(self, *args)
        shared = _hygiene("checking a Function's backward", _function_hygiene.before_backward, session, self, args)
        result = (original(self, *args) if session.boundary_mode is None
                  else _attributed_backward(original, session, self, args))
        _hygiene("checking a Function's backward", _function_hygiene.after_backward, session, self, shared)
        return result

    apply.__wrapped__ = original
    return apply


def _hygiene(what: str, check, *args):
    """Run a hygiene check: its findings raise; its own failures are logged and never reach the user."""
    try:
        return check(*args)
    except GradientHazardError:
        raise
    except Exception as error:  # noqa: BLE001 - gradguard's own failure: the program goes on as without it
        log_fallback("torch.function_hygiene", what, error)
        return None


def _attributed_backward(original, session, self, args):
    saved = []
    try:
        # torch 2.4 has no SavedTensor.data: reading ctx.saved_tensors in probe mode hands the records over. Not
        # while the guard steps aside for saved tensors: the read would call the user's own unpack hooks.
        records = ([s.data for s in self._raw_saved_tensors or ()] if _compat.SAVED_TENSOR_DATA
                   else _compat.probe_attribute(self, "saved_tensors") if session._hooks is not None else [])
        for record in records:
            if getattr(record, "tensor", None) is not None:
                saved.append(record.tensor)
    except Exception as error:  # saved tensors already freed: snapshot only the arguments
        log_fallback("torch.attribution", "reading a Function's saved tensors", error)
        saved = []
    snap = snapshot(session, saved + _tensors(args))
    name = getattr(self._forward_cls, "__name__", type(self).__name__)
    return _attributed(session, snap, f"{name}.backward", 3, original, self, *args)


def _register_hook(original):
    def register_hook(self, hook):
        if _active() is None or not callable(hook):
            return original(self, hook)
        return original(self, _function_hygiene.checked_hook(hook, _active))

    register_hook.__wrapped__ = original
    return register_hook


def _triton_run(original):
    def run(self, *args, **kwargs):
        session = _active()
        if session is None or session.boundary_mode is None or kwargs.get("warmup"):
            return original(self, *args, **kwargs)
        snap = snapshot(session, _tensors(args) + _tensors(kwargs.values()))
        if not snap:
            return original(self, *args, **kwargs)
        _register_library(getattr(self, "fn", None))
        _local.kernel_depth = getattr(_local, "kernel_depth", 0) + 1
        try:
            return original(self, *args, **kwargs)
        finally:
            _local.kernel_depth -= 1
            changed = snap.changed()
            if changed:
                stack = _stack()
                via = stack[-1] if stack else None
                if via is None:
                    node = torch._C._current_autograd_node()
                    via = node.name() if node is not None else None
                fn = getattr(self, "fn", None)
                kernel = getattr(fn, "__name__", None) or getattr(self, "__name__", None) or type(self).__name__
                _report(session, changed, op=f"triton:{kernel}", via=via, skip=2)

    run.__wrapped__ = original
    return run


def _entry_points():
    """(owner, attribute, wrap) of what every guard patches (Triton's launchers are added when imported)."""
    from torch.autograd.function import BackwardCFunction

    return [(torch.autograd.Function, "apply", _function_apply),
            (BackwardCFunction, "apply", _backward_apply),
            (torch.Tensor, "register_hook", _register_hook),
            (torch.autograd, "grad", lambda original: _second_order.wrap_grad(original, _active))]


_PATCHES = SharedPatches(_entry_points)


def maybe_wrap_triton() -> bool:
    """Wrap Triton's launchers if Triton is imported (never imports it). True when wrapped."""
    if "triton" not in sys.modules:
        return False
    with _lock:
        if not _sessions:
            return False
        try:
            import triton
            from triton.runtime.jit import JITFunction
        except Exception as error:  # no (working) Triton: nothing to attribute to a kernel launch
            log_fallback("torch.attribution", "importing triton", error)
            return False
        triton_dir = os.path.dirname(os.path.abspath(triton.__file__))
        LIBRARY_PATHS.add(triton_dir)
        if triton_dir + os.sep not in _SKIP_FRAMES:
            _SKIP_FRAMES.append(triton_dir + os.sep)
        _PATCHES.add(JITFunction, "run", _triton_run)
        interpreter = sys.modules.get("triton.runtime.interpreter")
        if interpreter is not None and "run" in getattr(interpreter, "InterpretedFunction", object).__dict__:
            _PATCHES.add(interpreter.InterpretedFunction, "run", _triton_run)
        return True


def install(session) -> None:
    with _lock:
        if not _sessions:
            _PATCHES.acquire()  # one holder for all sessions: weak references may die without an uninstall
        _sessions.append(weakref.ref(session))
    if session.boundary_mode is not None:
        maybe_wrap_triton()


def uninstall(session) -> None:
    with _lock:
        _sessions[:] = [ref for ref in _sessions if ref() is not session and ref() is not None]
        if not _sessions and _PATCHES.held:
            _PATCHES.release()
            with _second_order._lock:
                _second_order.entries.clear()  # a later guard starts from its own create_graph calls


def triton_wrapped() -> bool:
    return "run" in _PATCHES.names()
