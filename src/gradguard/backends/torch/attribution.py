"""Writer attribution: name what wrote into saved memory when no version counter moved.

The write log (``writes.py``) sees every *torch op* that writes, ``.data`` and ``from_numpy``/DLPack aliases
included, but not writes below the dispatcher: Triton kernels, C++/CUDA extensions writing through ``data_ptr()``,
NumPy. This module catches those at two boundaries, without any cooperation from the writer:

* ``Function.apply`` (forward) and ``BackwardCFunction.apply`` (a custom Function's backward), wrapped while a
  guard is active: the saved tensors sharing storage with the call's tensors (forward: its tensor arguments;
  backward: its own saved tensors) are hashed before the call and compared after it.
* Triton launches (``JITFunction.run`` / ``InterpretedFunction.run``: what ``kernel[grid](...)`` calls, compiled or
  under ``TRITON_INTERPRET=1``), the same way, keyed on the launch's tensor arguments.

The Function wrappers and ``Tensor.register_hook`` also run the hygiene checks below (ctx attributes, undeclared
input writes, writes into shared gradients) in every mode, the sentinel included; the hashing of saved memory
above runs only with the write log on.

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

Custom autograd.Function and tensor-hook hygiene: writes at a boundary that PyTorch never checks.

Four writes corrupt gradients with no error from PyTorch:

* ``ctx.x = x`` instead of ``ctx.save_for_backward(x)``: the tensor reaches backward with no version check,
  so an in-place write in between (``h += Swish.apply(h)``) makes the gradient silently wrong. Each tensor
  attribute of ctx is recorded like a saved tensor (version, fingerprint, write log) when forward returns,
  and checked when backward starts.
* ``forward`` writing into an input that requires grad without ``ctx.mark_dirty``: autograd keeps treating
  the input as unchanged (its gradient, and every later reader of it, are wrong).
* ``backward`` writing into its incoming gradient while the engine still holds that gradient for another
  node (AddBackward hands one tensor to both of its inputs): that node gets the modified gradient.
* a tensor hook writing into the gradient it receives (``register_hook(lambda g: g.mul_(s))``), same hazard.

# NOTE [What "shared" means for an incoming gradient]
# The engine moves a node's gradients into the call, so a gradient no other node will read has a fixed use
# count at the call: 1 on torch 2.13 and 2.15, 2 on torch 2.4 (Function backward); 2 in a tensor hook. A
# higher count means another holder: a pending input buffer (the other input of an add, a tensor used
# twice), or a gradient the caller passed to ``backward()``. Only then can an in-place write reach someone
# else, so only then is the gradient checked (its version, and its bytes when the guard fingerprints:
# kernels write without a version bump). The baseline is measured once per process on a two-node graph
# (``baselines()``) instead of being hard-coded per torch version.
#
# NOTE [Hygiene costs one dict read per call]
# For a Function call: the versions of the inputs that require grad, one ``vars(ctx)`` scan, and a
# fingerprint per tensor attribute (the cost of a saved tensor). For a backward or a hook: one use count
# per gradient. Nothing is hashed unless a gradient is shared or ctx holds tensors.

An in-place update that drops the differentiable gradient it was computed from.

MAML's inner step asks for a gradient with a graph (``torch.autograd.grad(loss, params, create_graph=True)``)
so that the meta-loss can differentiate through the update. Written as ``with torch.no_grad(): p -= lr * g``
(or ``p.data.sub_``, ``p.copy_``, an optimizer step), the update lands in the parameter with no graph: the
meta-backward reaches ``p`` as a plain leaf and never goes through ``g``. The meta-gradient silently ignores
the inner step (its second-order term, and its dependence on the support set). No error anywhere.

# NOTE [Seeing a dropped inner update]
# ``torch.autograd.grad`` is wrapped while a guard is active. For a call with create_graph=True, each input
# that is a leaf requiring grad (a parameter) gets an entry: its version then, and a flag set by a pre-hook on
# its gradient's node when any backward runs through that gradient. When a later backward starts (its first
# unpack) while a leaf's version has moved since (it was written in place) and the flag is still unset, a
# callback at the end of that backward looks again: if the backward reached the leaf (its ``.grad`` changed)
# and still never ran through the gradient, the finding is raised there. A gradient used as intended (a
# penalty on it, a Hessian-vector product, functional fast weights ``p - lr * g``) sets the flag; an update
# that leaves the parameter untouched never moves its version. First-order MAML (create_graph=False) makes no
# entry. Entries hold weak references and a flag only: no tensor, node or graph is kept alive.
"""

from __future__ import annotations

import functools
import inspect
import os
import re
import sys
import threading
import weakref
from dataclasses import dataclass

import torch

from ..._errors import GradientHazardError
from ...core.ledger import DeferredUnderLock
from ...core.findings import Finding, SourceLocation, WriteRecord
from ...core.internal import log_fallback
from ...core.patching import SharedPatches
from ...core.frames import LIBRARY_PATHS, caller_context, user_location
from .user_hooks import SAVED_TENSOR_DATA, probe_attribute
from .fingerprint import fingerprint as _fingerprint, same as _same
from .graph import name_by_variable, name_tensor, storage_key, tensor_finding

__all__ = ["install", "uninstall", "in_kernel", "maybe_wrap_triton", "snapshot", "inputs_before_forward",
           "after_forward", "before_backward", "after_backward", "checked_hook", "tensor_version", "baselines", "Entry",
           "entries", "wrap_grad", "note_write", "watch_backward", "finding", "quietly"]

_sessions_lock = threading.RLock()
_sessions: list = []  # active sessions, innermost last (weak references)
_local = threading.local()  # .calls: the boundaries running on this thread, innermost last; .kernel_depth


def _attributed(session, snap, op: str, skip: int, run, *args):
    """``run(*args)`` as the boundary ``op`` (the ``via`` of a Triton launch inside); report what it wrote unseen."""
    stack = _local.__dict__.setdefault("calls", [])
    stack.append(op)
    try:
        return run(*args)
    finally:
        stack.pop()
        changed = _unexplained(session, snap)
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
        with _sessions_lock:
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
        return storage_key(t)
    except Exception as error:  # a tensor without a storage (functional wrappers): no key, not attributed
        log_fallback("torch.attribution", "reading a storage pointer", error)
        return None


def snapshot(session, tensors) -> list:
    """(record, version, fingerprint, writes before) of the saved tensors on the storages of ``tensors``, to compare
    after a call (:func:`_unexplained`)."""
    ledger = session.ledger
    mode = session.boundary_mode
    entries: list = []
    if mode is None:
        return entries
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
    return entries


def _unexplained(session, entries: list) -> list:
    """Records of a :func:`snapshot` whose bytes changed while their version did not, and that no inner boundary
    explained."""
    mode = session.boundary_mode
    # A visible write (its version moved) is the version check's and the write log's; a record with more writes
    # than before was already attributed (by an inner boundary or the write log).
    return [record for record, version, fp, writes_before in entries
            if record.tensor._version == version and len(record.writes or ()) <= writes_before
            and not _same(_fingerprint(record.tensor, mode), fp)]


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
        inputs = _hygiene("reading a Function's inputs", inputs_before_forward, args, kwargs)
        if session.boundary_mode is None:
            result = call(cls, args, kwargs)
        else:
            _register_library(cls)
            snap = snapshot(session, _tensors(args) + _tensors(kwargs.values()))
            result = _attributed(session, snap, f"{cls.__name__}.forward", 2, call, cls, args, kwargs)
        if inputs is not None:
            _hygiene("checking a Function's forward", after_forward, session, cls, inputs, result)
        return result

    apply.__wrapped__ = original
    return classmethod(apply)


def _backward_apply(original):
    def apply(self, *args):
        session = _active()
        if session is None:
            return original(self, *args)
        shared = _hygiene("checking a Function's backward", before_backward, session, self, args)
        if session.boundary_mode is None:
            result = original(self, *args)
        else:
            name = getattr(self._forward_cls, "__name__", type(self).__name__)
            snap = snapshot(session, _saved_by(self, session) + _tensors(args))
            result = _attributed(session, snap, f"{name}.backward", 2, original, self, *args)
        _hygiene("checking a Function's backward", after_backward, session, self, shared)
        return result

    apply.__wrapped__ = original
    return apply


def quietly(component: str, what: str, check, *args):
    """``check(*args)``: a finding it raises propagates; its own failures are logged (as ``component`` doing ``what``)
    and never reach the user, who gets None."""
    try:
        return check(*args)
    except GradientHazardError:
        raise
    except Exception as error:  # noqa: BLE001 - gradguard's own failure: the program goes on as without it
        log_fallback(component, what, error)
        return None


_hygiene = functools.partial(quietly, "torch.function_hygiene")  # a hygiene check: (what, check, *args)


def _saved_by(ctx, session) -> list:
    """The tensors a custom Function's backward node saved (none once freed)."""
    try:
        # torch 2.4 has no SavedTensor.data: reading ctx.saved_tensors in probe mode hands the records over. Not
        # while the guard steps aside for saved tensors: the read would call the user's own unpack hooks.
        records = ([s.data for s in ctx._raw_saved_tensors or ()] if SAVED_TENSOR_DATA
                   else probe_attribute(ctx, "saved_tensors") if session._hooks is not None else [])
        return [record.tensor for record in records if getattr(record, "tensor", None) is not None]
    except Exception as error:  # saved tensors already freed: snapshot only the arguments
        log_fallback("torch.attribution", "reading a Function's saved tensors", error)
        return []


def _register_hook(original):
    def register_hook(self, hook):
        if _active() is None or not callable(hook):
            return original(self, hook)
        return original(self, checked_hook(hook, _active))

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
            changed = _unexplained(session, snap)
            if changed:
                stack = _local.__dict__.setdefault("calls", [])
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
            (torch.autograd, "grad", lambda original: wrap_grad(original, _active))]


_PATCHES = SharedPatches(_entry_points)


def maybe_wrap_triton() -> bool:
    """Wrap Triton's launchers if Triton is imported (never imports it). True when wrapped."""
    if "triton" not in sys.modules:
        return False
    with _sessions_lock:
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
    with _sessions_lock:
        if not _sessions:
            _PATCHES.acquire()  # one holder for all sessions: weak references may die without an uninstall
        _sessions.append(weakref.ref(session))
    if session.boundary_mode is not None:
        maybe_wrap_triton()


def uninstall(session) -> None:
    with _sessions_lock:
        _sessions[:] = [ref for ref in _sessions if ref() is not session and ref() is not None]
        if not _sessions and _PATCHES.held:
            _PATCHES.release()
            with _lock:
                entries.clear()  # a later guard starts from its own create_graph calls


def triton_wrapped() -> bool:
    return "run" in _PATCHES.names()


# -- custom Function and tensor-hook hygiene -------------------------------------------------------------------------
# ctx -> [(attribute name, weak reference to the tensor ctx held, record)]: the ctx is the key, so the
# entries go when the graph is freed; records of attributes the backward replaced go after it ran.
_ctx_records: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_ctx_lock = threading.Lock()
_MAX_ATTRIBUTE_TENSORS = 16  # per ctx: a list of 1000 tensors on ctx is checked in its first 16


_baseline: dict[str, int] = {}


def baselines() -> dict[str, int]:
    """Use counts of an unshared incoming gradient in a Function backward and in a tensor hook, measured once per
    process, before any guard hook is installed (see NOTE above)."""
    if _baseline:
        return _baseline
    measured: dict[str, int] = {}

    class _Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            measured["backward"] = grad._use_count()
            return grad * 2

    def hook(grad):
        measured["hook"] = grad._use_count()

    try:
        with torch.enable_grad(), torch.autograd.graph.disable_saved_tensors_hooks("gradguard calibration"):
            x = torch.ones(2, requires_grad=True)
            y = x * 1
            y.register_hook(hook)
            out = _Probe.apply(y) * 3
            torch.autograd.grad(out.sum(), x)
    except Exception as error:  # no baseline: the shared-gradient check stays off (never a false alarm)
        log_fallback("torch.function_hygiene", "measuring the use count of an unshared gradient", error)
        measured = {}
    _baseline.update({"backward": measured.get("backward", 1 << 30), "hook": measured.get("hook", 1 << 30)})
    return _baseline


def inputs_before_forward(args, kwargs) -> list | None:
    """(label, tensor, version) of the inputs that require grad; None when no gradient can flow."""
    if not torch.is_grad_enabled():
        return None
    return [(label, value, tensor_version(value)) for values in (enumerate(args), kwargs.items())
            for label, value in values if isinstance(value, torch.Tensor) and value.requires_grad]


def tensor_version(t: torch.Tensor) -> int | None:
    try:
        return t._version
    except RuntimeError:  # inference tensors have no version counter
        return None


def after_forward(session, cls, inputs: list, result) -> None:
    outputs = result if isinstance(result, (tuple, list)) else (result,)
    nodes = (out.grad_fn for out in outputs if isinstance(out, torch.Tensor))
    ctx = next((node for node in nodes if node is not None and getattr(node, "_forward_cls", None) is cls), None)
    if ctx is None:
        return
    for label, t, version in inputs:
        # A dirty input (``ctx.mark_dirty``) is returned with its history rebased onto this ctx. An input saved
        # for backward before the call makes the write loud at backward: that finding is the better one.
        if (version is not None and tensor_version(t) != version and t.grad_fn is not ctx
                and not session.saved_before(t, version)):
            session.engine.raise_finding(_input_write_finding(cls, label, t, version))
    _watch_ctx_attributes(session, cls, ctx)


_INTERNAL_CTX = frozenset({"to_save", "saved_for_forward", "non_differentiable", "dirty_tensors",
                           "materialize_grads", "needs_input_grad"})


def _watch_ctx_attributes(session, cls, ctx) -> None:
    try:
        attributes = vars(ctx)
    except TypeError:
        return
    entries = []
    for name, value in list(attributes.items()):
        if name in _INTERNAL_CTX:
            continue
        if isinstance(value, torch.Tensor):
            tensors = [(f"ctx.{name}", value)]
        elif isinstance(value, (list, tuple)) and value and len(value) <= 64:
            tensors = [(f"ctx.{name}[{i}]", v) for i, v in enumerate(value) if isinstance(v, torch.Tensor)]
        else:
            continue
        for label, t in tensors:
            if len(entries) >= _MAX_ATTRIBUTE_TENSORS:
                break
            record = session.watch_ctx_tensor(t, saver=(f"{cls.__name__}Backward", label))
            if record is not None:
                entries.append((name, weakref.ref(t), record))
    if entries:
        with _ctx_lock:
            _ctx_records[ctx] = entries


def _still_held(ctx, name: str, ref) -> bool:
    value, original = getattr(ctx, name, None), ref()
    return original is not None and (value is original
                                     or isinstance(value, (list, tuple)) and any(v is original for v in value))


def before_backward(session, ctx, grads) -> list | None:
    """Check ctx's tensor attributes; returns what ``after_backward`` needs to check the shared gradients."""
    entries = _ctx_records.get(ctx)
    if entries:
        for name, ref, record in entries:
            if _still_held(ctx, name, ref):
                session.engine.check_kept(record)
    limit = baselines()["backward"]
    shared = [(i, g, g._version, _gradient_fingerprint(session, g)) for i, g in enumerate(grads)
              if isinstance(g, torch.Tensor) and g.layout == torch.strided and g._use_count() > limit]
    return shared or None


def after_backward(session, ctx, shared: list | None) -> None:
    entries = _ctx_records.get(ctx)
    if entries:  # attributes the backward dropped (``ctx.x = None``) must not be kept alive by gradguard
        kept = [e for e in entries if _still_held(ctx, e[0], e[1])]
        if len(kept) != len(entries):
            with _ctx_lock:
                _ctx_records[ctx] = kept
    if not shared:
        return
    cls = getattr(ctx, "_forward_cls", None)
    name = getattr(cls, "__name__", type(ctx).__name__)
    for i, g, version, fp in shared:
        if _changed(session, g, version, fp):
            argument = _parameter_name(cls, "backward", i)
            writer = _source_write(getattr(cls, "backward", None), argument)
            session.engine.raise_finding(_grad_write_finding(g, version, f"{name}.backward", writer,
                                                             argument or f"gradient {i}"))


def _gradient_fingerprint(session, g):
    mode = session.fingerprint_mode
    return None if mode == "off" or type(g) is not torch.Tensor else _fingerprint(g.detach(), mode)


def _changed(session, g, version, fp) -> bool:
    return g._version != version or fp is not None and not _same(_fingerprint(g.detach(), session.fingerprint_mode), fp)


def checked_hook(hook, active):
    """``hook`` as registered inside a guard: the same call, plus the shared-gradient check."""

    def gradguard_checked_hook(grad):
        session = active()
        if (session is None or not isinstance(grad, torch.Tensor) or grad.layout != torch.strided
                or grad._use_count() <= baselines()["hook"]):  # not shared: no one else can see a write
            return hook(grad)
        version, fp = grad._version, _gradient_fingerprint(session, grad)
        out = hook(grad)
        if _changed(session, grad, version, fp):
            name = getattr(hook, "__name__", type(hook).__name__)
            try:
                argument = next(iter(inspect.signature(hook).parameters), None)
            except (TypeError, ValueError):
                argument = None
            session.engine.raise_finding(_grad_write_finding(grad, version, f"tensor hook {name}",
                                                             _source_write(hook, argument), argument or "grad",
                                                             hook=True))
        return out

    gradguard_checked_hook.__wrapped__ = hook
    return gradguard_checked_hook


def _parameter_name(cls, method: str, index) -> str | None:
    """The name of argument ``index`` of ``cls.forward``/``cls.backward`` as the user wrote it."""
    if isinstance(index, str):
        return index
    try:
        names = list(inspect.signature(getattr(cls, method)).parameters)
    except (TypeError, ValueError, AttributeError):
        return None
    base = torch.autograd.function._SingleLevelFunction.setup_context
    takes_ctx = method == "backward" or getattr(cls, "setup_context", base) is base
    names = names[1:] if takes_ctx else names
    return names[index] if 0 <= index < len(names) else None


def _source_write(fn, name: str | None) -> SourceLocation | None:
    """The first line of ``fn`` that writes ``name`` in place (``name.mul_(``, ``name *=``, ``name[i] =``)."""
    if fn is None or not name:
        return None
    fn = inspect.unwrap(getattr(fn, "__func__", fn))
    try:
        lines, start = inspect.getsourcelines(fn)
        path = inspect.getsourcefile(fn)
    except (OSError, TypeError):
        return None
    pattern = re.compile(rf"(?<![\w.]){re.escape(name)}"
                         r"(\.\w+_\(|\s*(\+|-|\*|/|//|%|\*\*|&|\|)=(?!=)|\[[^\]]*\]\s*=(?!=))")
    for offset, line in enumerate(lines):
        if pattern.search(line.split("#", 1)[0]):
            return SourceLocation(path, start + offset, fn.__name__)
    return None


def _input_write_finding(cls, label, t: torch.Tensor, version: int) -> Finding:
    argument = _parameter_name(cls, "forward", label) or f"argument {label}"
    call = user_location(3)
    writer = _source_write(cls.forward, argument)
    write = WriteRecord(op=f"{cls.__name__}.forward", location=writer or call, via=f"{cls.__name__}.apply",
                        version_before=version, version_after=t._version, category="function_input")
    where = f" at {call.short}" if call is not None else ""
    display = [("call", f"{cls.__name__}.apply{where}"),
               ("input", f"`{argument}`: version {version} before forward, {t._version} after, not marked dirty")]
    return tensor_finding("undeclared_input_write", t, name_by_variable(t), "leaf" if t.is_leaf else "activation",
                          [write], display, function=cls.__name__, argument=argument,
                          call=call.to_dict() if call else None)


def _grad_write_finding(g: torch.Tensor, version: int, writer_name: str, writer: SourceLocation | None,
                        argument: str, hook: bool = False) -> Finding:
    write = WriteRecord(op=writer_name, location=writer, via=None, version_before=version,
                        version_after=g._version, bumps_version=g._version != version,
                        category="hook_grad" if hook else "backward_grad")
    backward = user_location(3)
    display = [("gradient", f"`{argument}`, also handed to another node that had not run yet")]
    if backward is not None:
        display.append(("backward", f"called at {backward.short}"))
    return tensor_finding("shared_grad_write", g, argument, "gradient", [write], display, writer=writer_name,
                          argument=argument, hook=hook, backward_at=backward.to_dict() if backward else None)


# -- a dropped inner update (NOTE [Seeing a dropped inner update]) -----------------------------------------------------
_MAX_ENTRIES = 4096
_lock = threading.Lock()
entries: dict[int, "Entry"] = {}  # leaf's storage address -> the latest create_graph gradient taken for it


@dataclass
class Entry:
    leaf: "weakref.ref[torch.Tensor]"
    version: int
    used: list  # [bool]: a backward ran through the gradient
    grad_at: SourceLocation | None
    version_now: int | None = None
    written_at: SourceLocation | None = None  # the first in-place write after the gradient (write log only)


def _mark(used: list):
    def gradguard_gradient_used(grad_outputs):
        used[0] = True

    return gradguard_gradient_used


def _argument(args, kwargs, position: int, name: str, default=None):
    if name in kwargs:
        return kwargs[name]
    return args[position] if len(args) > position else default


def _materialized(args, kwargs):
    """(args, kwargs, inputs) with ``inputs`` made a tuple: ``model.parameters()`` is a generator the call consumes."""
    inputs = _argument(args, kwargs, 1, "inputs")
    if isinstance(inputs, torch.Tensor):
        return args, kwargs, (inputs,)
    inputs = tuple(inputs or ())
    if "inputs" in kwargs:
        kwargs = {**kwargs, "inputs": inputs}
    elif len(args) > 1:
        args = (args[0], inputs, *args[2:])
    return args, kwargs, inputs


def _note(inputs, result) -> None:
    site = None
    for x, g in zip(inputs, result):
        if not (isinstance(x, torch.Tensor) and x.is_leaf and x.requires_grad and isinstance(g, torch.Tensor)
                and g.grad_fn is not None):
            continue
        if site is None:
            site = user_location(1)
        used = [False]
        g.grad_fn.register_prehook(_mark(used))
        key = storage_key(x)
        with _lock:
            _deferred.drain()
            if len(entries) >= _MAX_ENTRIES:
                entries.pop(next(iter(entries)))
            entries[key] = Entry(weakref.ref(x, functools.partial(_forget, key)), x._version, used, site)


_deferred = DeferredUnderLock(_lock)  # NOTE [A callback must never wait for a lock] (core/ledger.py)


def _forget(key: int, _ref) -> None:
    _deferred.run(_drop_dead, key)


def _drop_dead(key: int) -> None:
    entry = entries.get(key)
    if entry is not None and entry.leaf() is None:
        del entries[key]


def wrap_grad(original, active):
    """``torch.autograd.grad`` as called inside a guard: the same call, plus the entries above."""

    @functools.wraps(original)
    def grad(*args, **kwargs):
        if not _argument(args, kwargs, 4, "create_graph", False) or active() is None:
            return original(*args, **kwargs)
        args, kwargs, inputs = _materialized(args, kwargs)
        result = original(*args, **kwargs)
        try:
            _note(inputs, result)
        except Exception as error:  # bookkeeping only: the user's gradients are returned as computed
            log_fallback("torch.second_order", "recording a create_graph gradient", error)
        return result

    return grad


def note_write(target: torch.Tensor) -> None:
    """Write log: an in-place write into a parameter with an entry; keep the user's line of the first one."""
    entry = entries.get(storage_key(target))
    if entry is not None and entry.written_at is None and not entry.used[0]:
        entry.written_at = user_location(1)


def watch_backward(raise_finding, backward: SourceLocation | None) -> None:
    """At the start of a backward pass (its first unpack): for each parameter written in place after its
    create_graph gradient was taken, with no backward through that gradient yet, check at the end of this
    backward whether it reached the parameter (its ``.grad`` changed) and still not the gradient."""
    stale = []
    for entry in list(entries.values()):
        leaf = entry.leaf()
        if leaf is None or entry.used[0] or leaf._version == entry.version:
            continue
        grad = leaf.grad
        stale.append((entry, None if grad is None else (id(grad), grad._version)))
    if not stale:
        return

    def gradguard_inner_update_check():
        for entry, before in stale:
            leaf = entry.leaf()
            if leaf is None or entry.used[0]:
                continue
            grad = leaf.grad
            if grad is None or (id(grad), grad._version) == before:
                continue  # this backward did not reach the parameter
            entry.version_now = leaf._version
            with _lock:
                _deferred.drain()
                for other, _ in stale:  # one finding per dropped update (the first parameter names it)
                    other_leaf = other.leaf()
                    if other_leaf is not None and entries.get(storage_key(other_leaf)) is other:
                        del entries[storage_key(other_leaf)]
            raise_finding(finding(entry, leaf, backward))

    torch.autograd.Variable._execution_engine.queue_callback(gradguard_inner_update_check)


def finding(entry: Entry, t: torch.Tensor, backward: SourceLocation | None) -> Finding:
    name = name_tensor(t)[0] or name_by_variable(t)
    write = WriteRecord(op="in-place update", location=entry.written_at, via=None, version_before=entry.version,
                        version_after=entry.version_now, category="parameter_update")
    display = []
    if entry.grad_at is not None:
        display.append(("gradient", f"torch.autograd.grad(..., create_graph=True) at {entry.grad_at.short}"))
    where = f" at {entry.written_at.short}" if entry.written_at is not None else " afterwards"
    display.append(("update", f"`{name or 'the parameter'}` written in place{where} (version "
                              f"{entry.version} -> {entry.version_now}), outside autograd"))
    if backward is not None:
        display.append(("backward", f"at {backward.short}, never through that gradient"))
    return tensor_finding("dropped_inner_update", t, name, "leaf",
                          [write] if entry.written_at is not None else [],  # the sentinel sees no write
                          display, None, gradient_at=entry.grad_at.to_dict() if entry.grad_at else None,
                          backward_at=backward.to_dict() if backward else None)
