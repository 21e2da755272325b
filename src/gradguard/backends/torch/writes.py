"""The torch op stream: ONE TorchDispatchMode whose subscribers see every op (the write log, bisect, the
in-place advisor), and the write log, which reports writes into memory saved for backward.

# NOTE [One op stream, subscribers in a chain]
# Each subscriber's ``op(func, args, kwargs, call)`` runs around the rest of the chain (``call``); the last link
# runs the op itself (:func:`run_op`, with the version-bump repair below, once for all subscribers). A guard
# session subscribes its write log and, in bisect mode, the bisector (outermost: it checks before and after the
# write log's work); the advisor subscribes its step recorder. One mode on the stack, however many consumers.

# NOTE [Version bumps under a Python dispatch mode]
# Two facts measured on torch 2.13 shape this mode:
#   1. For ordinary in-place ops the version bump happens in the ADInplaceOrView kernel *after*
#      ``__torch_dispatch__`` returns, so inside the mode every target still shows its old version.
#   2. While any Python TorchDispatchMode is active, ``_foreach_*_`` ops (the default optimizers' path)
#      do NOT bump the version counter, although they do without a mode. A tool that hid the optimizer's
#      writes from autograd would create the very bug it diagnoses, so we restore the bump ourselves.
#      ``_fused_*`` ops (fused Adam/SGD) never bump on CPU, with or without a mode: we keep that as is
#      (parity with plain PyTorch) and report them as silent writes instead.

The call gate, the write log's gate at the Python-call level: the op stream (a Python dispatch mode) runs only
inside calls that may write memory saved for backward.

# NOTE [Ops at the price of calls]
# A Python TorchDispatchMode costs ~3.6 us per aten op before it does anything (torch's mode plumbing), and a
# forensic guard used to keep one on for the whole block: every op of the forward, of the backward and of the
# optimizer paid it. A TorchFunctionMode costs ~1 us per Python-level torch call, and a step makes far fewer
# calls than ops (an LSTMCell loop: 374 calls, 2976 ops; backward's ops are not Python calls at all). So the
# gate is a TorchFunctionMode, and it enters the op stream only around a call that
#   * is an in-place call (``add_``, ``x[i] = v``, ``x += y``, ``out=``, ``inplace=True``, an op overload whose
#     schema writes an argument, or a known writer such as ``F.batch_norm``'s running statistics), and
#   * may matter: one of its tensor arguments shares storage with a saved tensor, or something else listens to
#     writes (grad mode on, where a module's write into its caller's variable is watched; second-order
#     updates; a read the write log waits for). Under the session's ``wants_ops``.
# Inside such a call the op stream names the aten overloads exactly as before (``aten.mul_.Tensor``: reports
# and answer keys depend on it).
#
# Every other call runs without the op stream. Where saved tensors are alive, the gate reads the version of
# each tensor argument before and after the call: a version that moved in a call not classed as in-place (a C++
# function that writes an argument) is still logged, under the Python name, and that function is gated from
# then on. What the gate cannot see: writes by C++ autograd nodes during backward (Python code in backward,
# custom Function backwards and hooks, is gated: the engine runs with the gate pushed, see
# ``_engine_entry``), and writes into tensors that are not arguments of the Python call. Versions and
# fingerprints still catch those; the finding then names the saver but not the writer's line.
#
# Under ``torch.compile`` tracing the gate passes every call straight through (Dynamo inlines it as a no-op);
# compiled regions are watched by their saved tensors' versions and fingerprints.

Bisect mode (:class:`Bisector`): pin a silent write that no boundary explained to one op, or to an interval of
user lines. Re-run the code with ``TorchGuardSession(bisect=True)`` or ``bisect.bisect``. Subscribed to the op
stream (outside the write log), around every op it re-checks the fingerprint of every tensor saved for backward:

* bytes changed *during* an op the write log did not see write there: the op wrote without declaring it (an
  extension op whose schema lacks ``Tensor(a!)``, a fused kernel): pinned to that op and its user line;
* bytes changed *between* two ops: no torch op did it (NumPy view, ctypes, DLPack, a C++/CUDA extension). A line
  tracer on the user's code re-checks at every line, pinning the write to its line, also inside the user's
  functions (``self.buf_obs[:] = ...`` in ``env.step``). Where another tracer (a debugger, coverage) owns
  ``sys.settrace``, gradguard leaves it alone and names the interval between two ops instead.

One full hash of every live saved tensor per op: a diagnosis re-run, not a training mode.
"""

from __future__ import annotations

import functools
import sys
import sysconfig
import threading
import weakref

import torch
from torch.overrides import TorchFunctionMode

from ...core.engine import SavedBaselines
from ...core.findings import WriteRecord
from ...core.frames import LIBRARY_PATHS, location_of, user_location
from ...core.internal import log_fallback
from ...core.patching import SharedPatches
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["OpStream", "WriteLog", "dynamo_safe", "run_op", "written_arguments", "CallGate", "lifted", "may_write",
           "install", "python_op_name", "uninstall", "Bisector"]


def _by_identity(compute):
    """A per-op cache keyed by ``id(func)``: an OpOverload's ``__hash__`` is Python code (~0.2 us), paid twice per
    op by ``functools.lru_cache``. The op is kept in the entry, so its id cannot be reused while cached."""
    entries: dict[int, tuple] = {}

    @functools.wraps(compute)
    def cached(func):
        entry = entries.get(id(func))
        if entry is None or entry[0] is not func:
            entry = entries[id(func)] = (func, compute(func))
        return entry[1]

    return cached


@_by_identity
def written_arguments(func) -> tuple[tuple[int, str, bool], ...]:
    """(position, name, kwarg_only) of every argument the op's schema marks as written (``Tensor(a!)``)."""
    try:
        arguments = func._schema.arguments
    except AttributeError:
        return ()
    return tuple((i, a.name, a.kwarg_only) for i, a in enumerate(arguments)
                 if a.alias_info is not None and a.alias_info.is_write)


def _targets(spec, args, kwargs) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for position, name, kwarg_only in spec:
        value = kwargs.get(name) if (kwarg_only or position >= len(args)) else args[position]
        if isinstance(value, torch.Tensor):
            out.append(value)
        elif isinstance(value, (list, tuple)):
            out.extend(v for v in value if isinstance(v, torch.Tensor))
    return out


_DYNAMO_SAFE: dict[type, type] = {}


def dynamo_safe(mode_class: type) -> type:
    """``mode_class`` itself, or, once the process has imported Dynamo (it uses torch.compile, or an optimizer
    imported it), a subclass whose ``__torch_dispatch__`` runs with Dynamo off: without that Dynamo would try to
    compile this mode's bookkeeping and recompile for every op it sees.

    # NOTE [Dynamo off in the op stream, for 0.3 us instead of 2.5 us]
    # torch's own wrapper (``torch._disable_dynamo``) costs ~2.5 us per op: two wrapper frames, a stance lookup
    # and four ``set_eval_frame`` calls, on every aten op a forensic guard sees (5,400 per step of the zoo's
    # LSTMCell loop). What it does for a dispatch mode comes down to: run the frame with no eval-frame callback,
    # then restore the caller's. We do exactly that, and mark our own frame ``skip_code`` so that Dynamo does
    # not intercept it before the callback is off. Where either piece is missing, torch's wrapper is used.
    """
    if "torch._dynamo" not in sys.modules:
        return mode_class
    safe = _DYNAMO_SAFE.get(mode_class)
    if safe is None:
        quiet = _dynamo_off(mode_class.__dict__["__torch_dispatch__"])
        attributes = {"__torch_dispatch__": quiet, "__module__": mode_class.__module__}
        if quiet is None:  # torch's wrapper, through __init_subclass__
            attributes.update(__torch_dispatch__=mode_class.__dict__["__torch_dispatch__"],
                              _should_skip_dynamo=classmethod(lambda cls: True))
        safe = _DYNAMO_SAFE[mode_class] = type(mode_class.__name__, (mode_class,), attributes)
    return safe


def _dynamo_off(dispatch):
    """``dispatch`` run with Dynamo's eval-frame callback off (NOTE above), or None where torch lacks the pieces."""
    try:
        from torch._dynamo.eval_frame import skip_code

        set_eval_frame = torch._C._dynamo.eval_frame.set_eval_frame
    except (ImportError, AttributeError) as error:
        log_fallback("torch.writes", "turning Dynamo off in the op stream cheaply (torch's wrapper is used)", error)
        return None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        prior = set_eval_frame(None)
        try:
            return dispatch(self, func, types, args, kwargs)
        finally:
            set_eval_frame(prior)

    try:
        skip_code(__torch_dispatch__.__code__)
    except Exception as error:  # the frame would be Dynamo's to intercept: use torch's wrapper
        log_fallback("torch.writes", "marking the op stream's frame for Dynamo to skip", error)
        return None
    return __torch_dispatch__


@_by_identity
def _repairs_bump(func) -> bool:
    if not (func.name().startswith("aten::_foreach_") and written_arguments(func)):
        return False
    try:
        return not torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "ADInplaceOrView")
    except Exception as error:  # unknown op: assume it bumps after return (the safe side for attribution)
        log_fallback("torch.writes", f"asking the dispatcher about {func}", error)
        return False


def run_op(func, args, kwargs):
    """Run the op; restore the version bump a Python dispatch mode suppresses on ``_foreach_*_`` ops (NOTE
    [Version bumps under a Python dispatch mode], point 2)."""
    if not _repairs_bump(func):
        return func(*args, **kwargs)
    targets = _targets(written_arguments(func), args, kwargs)
    before = [t._version for t in targets]
    out = func(*args, **kwargs)
    for t, v in zip(targets, before):
        if t._version == v:
            torch.autograd.graph.increment_version(t)
    return out


class OpStream(TorchDispatchMode):
    """The one dispatch mode: every op goes through the subscribers' ``op(func, args, kwargs, call)``, the first
    subscriber outermost (NOTE [One op stream, subscribers in a chain])."""

    def __init__(self, subscribers):
        super().__init__()
        self.subscribers = list(subscribers)
        call = run_op
        for subscriber in reversed(self.subscribers[1:]):
            call = functools.partial(subscriber.op, call=call)
        self._first, self._rest = self.subscribers[0].op, call  # one subscriber: no partial per op

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps every subclass's __torch_dispatch__ in torch._disable_dynamo, which imports Dynamo on the
        # first op (1-3 s per process) and adds ~2.5 us to every op. Processes that never import Dynamo do not
        # need it; those that do get the wrapper back through dynamo_safe().
        return False

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # NOTE [Compiled regions under the write log]
        # A dispatch mode that does not ignore compile internals makes Dynamo skip every frame ("non-infra torch
        # dispatch mode present"): torch.compile(fullgraph=True) raised inside a forensic guard, and compiled
        # functions fell back to eager. With True, Dynamo compiles as without gradguard and this mode sees the
        # ops the compiled code runs (fused kernels hide their insides: writes there are not named).
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self._first(func, args, kwargs or {}, self._rest)


class WriteLog:
    """The op-stream subscriber that calls ``on_write(func, targets)`` before every op that writes tensors in
    place (``on_write`` may return a callable run after the op). While ``on_read`` is set, it is called with every
    op's arguments first (reads a check waits for)."""

    def __init__(self, on_write):
        self._on_write = on_write
        self.on_read = None

    def op(self, func, args, kwargs, call):
        if self.on_read is not None:
            self.on_read(func, args)
        spec = written_arguments(func)
        if not spec:
            return call(func, args, kwargs)
        targets = _targets(spec, args, kwargs)
        finish = self._on_write(func, targets) if targets else None
        out = call(func, args, kwargs)
        if finish is not None:
            finish()
        return out


# -- bisect mode -----------------------------------------------------------------------------------------------------
# Python's own modules run inside library calls (textwrap while gradguard renders, linecache): not user lines.
_NOT_USER = tuple({p for p in (sysconfig.get_paths().get("stdlib"), sysconfig.get_paths().get("platstdlib")) if p}
                  ) + ("<frozen ",)


def _user_file(filename: str) -> bool:
    return not filename.startswith(_NOT_USER) and not LIBRARY_PATHS.is_library(filename)


class Bisector:
    """Checks saved tensors' fingerprints before and after every op (see the module docstring): an op-stream
    subscriber, plus a line tracer on the user's code between ``start()`` and ``stop()``, and the engine's bisect
    hook at unpack (``check``, ``rebase``: the interval since the last op)."""

    def __init__(self, session):
        self._session = weakref.ref(session)
        self._baselines = SavedBaselines(session.engine)
        self._last = None  # user line of the previous op
        self._line = None  # the user line running now (line tracer)
        self._tracing = False
        self._in_op = 0  # inside a dispatched op (a Python kernel's lines): the op's own check attributes the write

    def start(self) -> None:
        # NOTE [Lines as bisect points]
        # A check at every line event of user code: when bytes changed since the previous check, the line that
        # ran in between wrote them. Library frames are not traced (their writes surface at the user's line that
        # called them). The tracer is only installed when none is (a debugger or coverage keeps theirs).
        if sys.gettrace() is None:
            sys.settrace(self._trace_call)
            self._tracing = True

    def stop(self) -> None:
        if self._tracing:
            self._tracing = False
            if sys.gettrace() == self._trace_call:
                sys.settrace(None)

    def _trace_call(self, frame, event, arg):
        if event != "call" or self._in_op or not _user_file(frame.f_code.co_filename):
            return None
        return self._trace_line

    def _trace_line(self, frame, event, arg):
        if self._in_op:  # inside an op or a check: gradguard's own work, or a Python kernel the op check covers
            return self._trace_line
        if event in ("line", "return"):
            if self._line is not None:
                self._checked(None, self._line, pinned=True)
            if event == "line":
                self._line = location_of(frame)
            else:  # back in the caller, still on the line that called
                caller = frame.f_back
                self._line = location_of(caller) if caller is not None and _user_file(caller.f_code.co_filename) else None
        return self._trace_line

    def check(self, location) -> None:
        self._checked(None, location or user_location(3))

    def rebase(self, records) -> None:
        return None  # the check compares write counts itself

    def _checked(self, op, location, pinned: bool = False) -> None:
        """Compare every live saved tensor with its baseline; attribute the changes; move the baselines."""
        session = self._session()
        if session is None:
            return
        self._in_op += 1
        try:
            for record in self._baselines.unexplained_changes():
                if location is None:
                    location = user_location(1)
                session.record_write([record], self._write(op, location, pinned))
        finally:
            self._in_op -= 1

    def _write(self, op, location, pinned: bool) -> WriteRecord:
        if op is not None:
            return WriteRecord(op=op, location=location, via="an op that does not declare the write",
                               category="kernel", bumps_version=False)
        if pinned:
            return WriteRecord(op="write outside torch", location=location, category="outside", bumps_version=False)
        here = location.short if location is not None else "an unknown line"
        if self._last is None:
            interval = f"before {here}"
        elif location is not None and self._last.short == location.short:
            interval = f"within {here}"
        else:
            interval = f"between {self._last.short} and {here}"
        return WriteRecord(op=f"write outside torch {interval}", location=location, category="outside",
                           bumps_version=False)

    def op(self, func, args, kwargs, call):
        location = user_location(2)
        self._checked(None, location)
        self._in_op += 1
        try:
            out = call(func, args, kwargs)
        finally:
            self._in_op -= 1
        self._checked(func.name().replace("::", "."), location)
        self._last = location
        return out


# -- the call gate (NOTE [Ops at the price of calls]) --------------------------------------------------------------
_INPLACE_DUNDERS = frozenset({
    "__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__", "__ipow__",
    "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__", "__imatmul__", "__set__",
})
# Python-level calls that write an argument without an in-place name (running statistics, max_norm renorm).
_KNOWN_WRITERS = frozenset({"batch_norm", "instance_norm", "native_batch_norm", "_native_batch_norm_legit",
                            "embedding", "group_norm", "rrelu"})
_ALWAYS, _NEVER = 1, 0

# id(func) -> (func, _ALWAYS | _NEVER | -2 - position of an ``inplace`` parameter); the func is kept in the entry
# so that its id cannot be reused while cached. Property accessors are keyed by descriptor (see _kind).
_CLASSES: dict[int, tuple] = {}


def _classify(func) -> int:
    if isinstance(func, torch._ops.OpOverload):
        return _ALWAYS if written_arguments(func) else _NEVER
    if isinstance(func, torch._ops.OpOverloadPacket):
        try:
            overloads = [getattr(func, name) for name in func.overloads()]
        except Exception as error:  # cannot tell: the safe side
            log_fallback("torch.call_gate", f"reading the overloads of {func}", error)
            return _ALWAYS
        return _ALWAYS if any(written_arguments(o) for o in overloads) else _NEVER
    name = getattr(func, "__name__", "") or ""
    if (name.endswith("_") and not name.endswith("__")) or name in _INPLACE_DUNDERS or name in _KNOWN_WRITERS:
        return _ALWAYS
    code = getattr(func, "__code__", None)  # Python functions (torch.nn.functional); builtins take no ``inplace``
    if code is None:
        return _NEVER
    parameters = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    return -2 - parameters.index("inplace") if "inplace" in parameters else _NEVER


def may_write(func, args, kwargs) -> bool:
    """Whether the call is an in-place call (see NOTE [Ops at the price of calls])."""
    return _writes(_kind(func), args, kwargs)


def _writes(kind: int, args, kwargs) -> bool:
    if kind >= 0:
        return kind == _ALWAYS or bool(kwargs and kwargs.get("out") is not None)
    if kwargs and "inplace" in kwargs:
        return bool(kwargs["inplace"])
    position = -2 - kind
    return len(args) > position and bool(args[position])


_METHOD_WRAPPER = type(torch.Tensor.grad.__get__)
_BY_DESCRIPTOR: dict[tuple, int] = {}


def _kind(func) -> int:
    entry = _CLASSES.get(id(func))
    if entry is not None and entry[0] is func:
        return entry[1]
    if type(func) is _METHOD_WRAPPER:
        # A property's ``__get__``/``__set__`` is a new object per access: keyed by its descriptor instead
        key = (id(func.__self__), func.__name__)
        kind = _BY_DESCRIPTOR.get(key)
        if kind is None:
            kind = _BY_DESCRIPTOR[key] = _classify(func)
        return kind
    if len(_CLASSES) > 65536:
        _CLASSES.clear()
    kind = _classify(func)
    _CLASSES[id(func)] = (func, kind)
    return kind


def _learn(func) -> None:
    if type(func) is _METHOD_WRAPPER:
        _BY_DESCRIPTOR[(id(func.__self__), func.__name__)] = _ALWAYS
    else:
        _CLASSES[id(func)] = (func, _ALWAYS)


def python_op_name(func) -> str:
    """``torch.nn.functional.batch_norm``, ``torch.Tensor.foo``: the Python name of a call the gate logged."""
    module = getattr(func, "__module__", None) or "torch"
    qualname = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)
    if qualname.startswith(("TensorBase.", "_TensorBase.")):
        module, qualname = "torch", "Tensor." + qualname.split(".", 1)[1]
    elif qualname.startswith("_VariableFunctionsClass."):
        module, qualname = "torch", qualname.split(".", 1)[1]
    return f"{module}.{qualname}" if not qualname.startswith(module) else qualname


_Tensor = torch.Tensor


def _versions(args, out: list) -> list:
    """(tensor, version) of every tensor among ``args`` (and one level of lists/tuples: foreach ops)."""
    for value in args:
        if isinstance(value, _Tensor):
            try:
                out.append((value, value._version))
            except RuntimeError:  # inference tensors have no version counter
                pass
        elif isinstance(value, (list, tuple)):
            _versions([item for item in value if isinstance(item, _Tensor)], out)
    return out


class CallGate(TorchFunctionMode):
    """The TorchFunctionMode of NOTE [Ops at the price of calls]."""

    def __init__(self, stream, write_log, wants_ops, saved_alive, wrote):
        super().__init__()
        self._stream = stream  # the OpStream, a TorchDispatchMode entered only around gated calls
        self._write_log = write_log  # while its ``on_read`` is set, every call runs in the op stream
        self._wants_ops = wants_ops  # (args, kwargs) -> whether this in-place call needs the op stream
        self._saved_alive = saved_alive  # () -> whether any saved tensor is alive (else no version deltas)
        self._wrote = wrote  # (func, target, version before, version after): a write seen only as a delta

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        if _is_compiling():
            return func(*args, **kwargs)
        if self._write_log.on_read is not None:  # a read the write log waits for may be any op
            return self._in_stream(func, args, kwargs)
        entry = _CLASSES.get(id(func))  # _kind()'s hit, inlined: this runs for every torch call in the block
        if _writes(entry[1] if entry is not None and entry[0] is func else _kind(func), args, kwargs):
            if self._wants_ops(args, kwargs):
                return self._in_stream(func, args, kwargs)
            return func(*args, **kwargs)
        if not self._saved_alive():
            return func(*args, **kwargs)
        before = _versions(args, [])
        if kwargs:
            _versions(kwargs.values(), before)
        out = func(*args, **kwargs)
        for t, version in before:
            try:
                after = t._version
            except RuntimeError:
                continue
            if after != version:
                _learn(func)
                try:
                    self._wrote(func, t, version, after)
                except Exception as error:  # a diagnosis aid: the user's program goes on
                    log_fallback("torch.call_gate", f"logging a write by {python_op_name(func)}", error)
        return out

    def _in_stream(self, func, args, kwargs):
        # The op stream goes straight onto torch's dispatch-mode stack: ``with stream:`` also updates Python-side
        # flags that only compile-time code reads (not running here), at ~1 us more per call.
        _push_dispatch(self._stream)
        try:
            return func(*args, **kwargs)
        finally:
            _pop_dispatch(None)


class lifted:
    """Run a block with ``gate`` off the function-mode stack when it is on top (the guard's own hooks)."""

    __slots__ = ("gate", "popped")

    def __init__(self, gate):
        self.gate = gate
        self.popped = False

    def __enter__(self):
        depth = _function_stack_len()
        if depth and _function_stack_at(depth - 1) is self.gate:
            _pop_function()
            self.popped = True

    def __exit__(self, *exc_info):
        if self.popped:
            _push_function(self.gate)


_function_stack_len = torch._C._len_torch_function_stack
_function_stack_at = torch._C._get_function_stack_at
_pop_function = torch._C._pop_torch_function_stack
_push_function = torch._C._push_on_torch_function_stack
_push_dispatch = torch._C._push_on_torch_dispatch_stack
_pop_dispatch = torch._C._pop_torch_dispatch_stack
_is_compiling = torch.compiler.is_compiling  # torch >= 2.3; the gate is used from torch 2.5


# -- patched entry points: backward's Python code, and library calls that write from C++ ----------------------
#
# ``Tensor.backward`` and ``torch.autograd.grad`` are Python-level torch calls: the gate sees them with itself
# popped (torch pops a mode while it handles a call), so the custom Function backwards and hooks the engine
# calls would run ungated. Pushing the gate again inside the call does not work (both functions check for modes
# again and re-enter the gate forever), so the gate is pushed where the engine is entered,
# ``torch.autograd._engine_run_backward``, past those checks. One wrapper per process, installed while a gate
# is; it pushes the gate of the calling thread only.

_local = threading.local()


def _on_stack(mode) -> bool:
    try:
        return any(m is mode for m in torch.overrides._get_current_function_mode_stack())
    except Exception as error:  # cannot tell: do not push twice
        log_fallback("torch.call_gate", "reading the function-mode stack (backward runs ungated)", error)
        return True


# Library calls that write tensors from C++ without a Python-level torch call the gate could see: DDP's buffer
# broadcast copies rank 0's buffers into every rank's (``aten.copy_``, no version bump) at the start of each
# forward. While a gate is active they run inside its op stream, as every op did before the gate.
_OPAQUE_WRITERS = (("torch.nn.parallel.distributed", "DistributedDataParallel", "_distributed_broadcast_coalesced"),)


def _current_gate():
    gates = getattr(_local, "gates", None)
    return gates[-1] if gates else None


def _engine_entry(original):
    @functools.wraps(original)
    def run_backward(*args, **kwargs):
        gate = _current_gate()
        if gate is None or _on_stack(gate):
            return original(*args, **kwargs)
        with gate:
            return original(*args, **kwargs)

    return run_backward


def _in_op_stream(original):
    @functools.wraps(original)
    def run(*args, **kwargs):
        gate = _current_gate()
        if gate is None:
            return original(*args, **kwargs)
        with lifted(gate):  # the op stream runs the ops: the gate must not see them again (counted twice)
            return gate._in_stream(original, args, kwargs)

    return run


def _patches():
    """(owner, attribute, wrap) of what a gate patches: the engine's entry, and the opaque writers imported."""
    out = [(sys.modules["torch.autograd"], "_engine_run_backward", _engine_entry)]
    for module_name, class_name, attribute in _OPAQUE_WRITERS:
        owner = getattr(sys.modules.get(module_name), class_name, None)
        if owner is not None and attribute in owner.__dict__:
            out.append((owner, attribute, _in_op_stream))
    return out


_PATCHES = SharedPatches(_patches)


def install(gate) -> None:
    """Make ``gate`` the one the patched entry points use on this thread (the innermost guard's); patch them once
    per process (reference counted, undone by the last ``uninstall``)."""
    _local.__dict__.setdefault("gates", []).append(gate)
    _PATCHES.acquire()


def uninstall(gate) -> None:
    gates = getattr(_local, "gates", None) or []
    if gate in gates:
        gates.remove(gate)
    _PATCHES.release()
