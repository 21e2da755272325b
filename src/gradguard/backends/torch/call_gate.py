"""The write log's gate at the Python-call level: the op stream (a Python dispatch mode) runs only inside calls
that may write memory saved for backward.

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
"""

from __future__ import annotations

import functools
import sys
import threading

import torch
from torch.overrides import TorchFunctionMode

from ...core.internal import log_fallback
from ...core.patching import SharedPatches
from .writes import written_arguments

__all__ = ["CallGate", "lifted", "may_write", "install", "python_op_name", "uninstall"]

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
