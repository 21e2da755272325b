"""Name a tensor on the error path: "rnn.weight_hh_l0" rather than "[torch.FloatTensor [1, 1]]".

# NOTE [Why a heap scan, only on the error path]
# A global module forward hook would name parameters cheaply but crashes Dynamo ("... is already tracked
# for mutation"), so the guard installs nothing on modules. When a finding is built we scan the heap for
# ``nn.Module`` objects once, match parameter/buffer memory, and take the variable name of the outermost
# module from the user's frames (``rnn`` in ``rnn = nn.RNN(...)``).
#
# NOTE [One heap scan per finding]
# Naming the tensor, naming the parameters on the graph and the rules' own questions each need the modules on
# the heap; a scan costs ~0.1 s on a heap with torch, hypothesis and pytest loaded. While one finding is built
# (`one_heap_scan()`, entered by the engine through the probe's `finding_scope`) the first scan is kept and
# reused; it is dropped when the finding is done, so no module is kept alive by gradguard.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import sys
import threading

import torch

from ...core.findings import TensorInfo
from ...core.frames import user_frames, user_variable_names
from ...core.internal import log_fallback
from ...core.source_ast import reference_prefixes, written_reference

__all__ = ["name_tensor", "name_by_variable", "name_in_writing_frame", "first_tensor_step", "storage_key",
           "heap_modules", "one_heap_scan", "tensor_info"]

_scope = threading.local()  # .depth: open one_heap_scan scopes; .modules: their scan, once made


def heap_modules() -> list:
    """Every ``nn.Module`` on the heap (one scan per finding, NOTE [One heap scan per finding])."""
    cached = getattr(_scope, "modules", None)
    if cached is not None:
        return cached
    module_type = torch.nn.Module
    # ``type(m)`` and issubclass, not isinstance: isinstance triggers ``__class__`` properties of lazy
    # proxies on the heap (torch.distributed.reduce_op warns).
    modules = [m for m in gc.get_objects() if issubclass(type(m), module_type)]
    if getattr(_scope, "depth", 0):
        _scope.modules = modules
    return modules


@contextlib.contextmanager
def one_heap_scan():
    """While open, :func:`heap_modules` scans the heap once and reuses the scan."""
    _scope.depth = getattr(_scope, "depth", 0) + 1
    try:
        yield
    finally:
        _scope.depth -= 1
        if not _scope.depth:
            _scope.modules = None


def tensor_info(t: torch.Tensor, name: str | None, role: str, producer: str | None = "") -> TensorInfo:
    """A finding's description of ``t``; ``producer`` "" (the default): the name of its grad_fn."""
    if producer == "":
        grad_fn = t.grad_fn
        producer = grad_fn.name() if grad_fn is not None else None
    return TensorInfo(shape=tuple(t.shape), dtype=str(t.dtype).replace("torch.", ""), device=str(t.device),
                      name=name, role=role, producer=producer)


def storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def name_tensor(t: torch.Tensor) -> tuple[str | None, str | None]:
    """(qualified name, "parameter" | "buffer") of the module tensor sharing ``t``'s memory, or (None, None)."""
    try:
        key = storage_key(t)
    except Exception as error:  # no storage (e.g. sparse, fake)
        log_fallback("backends.torch", "reading a tensor's storage key", error)
        return None, None
    if key == 0:
        return None, None
    modules = heap_modules()
    children = {id(c) for m in modules for c in m.children()}
    roots = [m for m in modules if id(m) not in children] + [m for m in modules if id(m) in children]
    variable = user_variable_names({id(m) for m in modules})
    for module in roots:
        prefix = variable.get(id(module), type(module).__name__)
        for kind, items in (("parameter", module.named_parameters()), ("buffer", module.named_buffers())):
            for name, value in items:
                if value is not None and value.device == t.device and storage_key(value) == key:
                    return f"{prefix}.{name}", kind
    return None, None


def name_by_variable(t: torch.Tensor) -> str | None:
    """The user variable (innermost user frame first) holding a tensor with exactly ``t``'s memory and layout
    (same storage, offset, shape, strides): ``out`` for ``out = a.sigmoid()``. Error paths only: it reads the
    locals and globals of every user frame on the stack."""
    key = _layout_key(t, "reading a tensor's layout to name it")  # no storage: no variable can be matched by memory
    if key is None or key[0] == 0:
        return None
    for frame in user_frames(sys._getframe(1)):
        for scope in (frame.f_locals, frame.f_globals):
            for var, value in _user_names(scope):
                if type(value).__name__ == "ndarray" and type(value).__module__ == "numpy":
                    if t.device.type == "cpu" and _same_numpy_memory(value, t):
                        return var  # `torch.as_tensor(obs)` saved: the NumPy buffer the user holds
                elif issubclass(type(value), torch.Tensor):
                    if _holds(value, key, t):
                        return var
                else:
                    attribute = _attribute_holding(value, key, t)  # `runner.obs`: one level into user objects
                    if attribute is not None:
                        return f"{var}.{attribute}"
    return None


def _layout_key(value: torch.Tensor, what: str):
    """(storage address, offset, shape, strides, dtype), or None for a tensor without strided memory or without
    storage (sparse, fake, a subclass: logged as ``what``)."""
    try:
        if value.layout != torch.strided or value.is_nested:
            return None
        return (value.untyped_storage().data_ptr(), value.storage_offset(), tuple(value.shape), value.stride(),
                value.dtype)
    except Exception as error:
        log_fallback("backends.torch", what, error)
        return None


def _holds(value: torch.Tensor, key, t: torch.Tensor) -> bool:
    """Whether ``value`` has exactly the memory and layout ``key`` describes (on ``t``'s device)."""
    return value.device == t.device and _layout_key(value, "reading a user variable's layout") == key


def name_in_writing_frame(t: torch.Tensor) -> str | None:
    """The local of the innermost user frame holding exactly ``t``'s memory, read while a write into ``t`` runs.

    # NOTE [Naming a tensor where it is written]
    # By the time backward fails, the frame that held a module's input (``x`` in ``Block.forward``) is gone and
    # the saved tensor has no name left. While the in-place write runs, that frame is still on the stack. Only
    # its locals are read (no globals, no attributes of user objects: this runs inside the user's program,
    # not on an error path), once per saved tensor that is written.
    """
    key = _layout_key(t, "reading a written tensor's layout to name it")
    if key is None or key[0] == 0:
        return None
    frame = next(user_frames(sys._getframe(1)), None)
    if frame is None:
        return None
    local = next((var for var, value in _user_names(frame.f_locals)
                  if issubclass(type(value), torch.Tensor) and _holds(value, key, t)), None)
    if local is not None:
        return local
    # No local holds it: the reference the writing statement writes through (`U.blocks[(c0, c1)] *= s` writes a
    # tensor a dict holds, here a slice of the saved one), when it reaches a tensor in the saved one's memory.
    reference = written_reference(frame.f_code.co_filename, frame.f_lineno)
    found = first_tensor_step(reference, frame) if reference is not None else None
    return found[0] if found is not None and _in_storage(found[1], key[0], t) else None


def first_tensor_step(reference: str, frame) -> tuple[str, torch.Tensor] | None:
    """(text, value) of the first step of ``reference`` that is a tensor in ``frame``: ``hx[idx]`` of a tuple
    ``hx``, ``U.blocks[(c0, c1)]`` of a dict; None when no step resolves to one."""
    scope = collections.ChainMap(frame.f_locals, frame.f_globals)
    return next(((text, value) for text, value in reference_prefixes(reference, scope)
                 if issubclass(type(value), torch.Tensor)), None)


def _in_storage(value: torch.Tensor, storage: int, t: torch.Tensor) -> bool:
    """Whether ``value`` lies in the storage at address ``storage`` (on ``t``'s device)."""
    try:
        return value.device == t.device and value.layout == torch.strided and storage_key(value) == storage
    except Exception as error:  # a tensor subclass without storage
        log_fallback("backends.torch", "reading a written reference's storage", error)
        return False


def _user_names(scope: dict):
    """(name, value) of a frame scope, without private names and pytest's `@py_assert1` temporaries."""
    return [(var, value) for var, value in list(scope.items()) if not var.startswith("_") and var.isidentifier()]


def _attribute_holding(obj, key, t: torch.Tensor) -> str | None:
    """The attribute of a user object (not a class, a module or a builtin) holding exactly ``t``'s memory."""
    if isinstance(obj, (type, torch.nn.Module)) or type(obj).__module__ in ("builtins", "types"):
        return None
    attributes = getattr(obj, "__dict__", None)
    if not isinstance(attributes, dict):
        return None
    return next((attribute for attribute, value in list(attributes.items())
                 if not attribute.startswith("_") and issubclass(type(value), torch.Tensor) and _holds(value, key, t)),
                None)


def _same_numpy_memory(array, t: torch.Tensor) -> bool:
    itemsize = t.element_size()
    try:
        start = t.untyped_storage().data_ptr() + t.storage_offset() * itemsize
    except Exception as error:
        log_fallback("backends.torch", "reading a tensor's address", error)
        return False
    return (array.__array_interface__["data"][0] == start and tuple(array.shape) == tuple(t.shape)
            and tuple(array.strides) == tuple(s * itemsize for s in t.stride()) and array.itemsize == itemsize)
