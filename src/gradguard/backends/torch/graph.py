"""Capture the autograd graph around a finding, at error time, as a framework-neutral dict.

The unpack hook raises while ``torch._C._current_autograd_node()`` is the node that saved the stale tensor (the
*saver*). From it we walk ``next_functions`` a few levels towards the inputs, list every node's saved arguments
(through ``_raw_saved_*``: unpacking would re-enter the guard's hook), and add the stale tensor and the writes
that changed it. The HTML report draws the result; the JSON report carries it in ``context.graph``.

Format (``format_version`` 1)::

    {"format_version": 1,
     "nodes": [{"id": "n0", "type": "op" | "leaf" | "tensor" | "write", "role": "saver" | "input" | "stale" |
                "write", "name": str, "label": str, "detail": str, "depth": int,
                "saved": [{"argument": str, "shape": [...], "dtype": str, "stale": bool}]}, ...],
     "edges": [{"from": id, "to": id, "kind": "input" | "saved" | "write", "label": str}, ...],
     "saver": id, "stale": id | None, "writes": [id, ...], "truncated": bool}

Edges point the way data flows in backward: from a node to the nodes that compute its inputs' gradients.

Name a tensor on the error path: "rnn.weight_hh_l0" rather than "[torch.FloatTensor [1, 1]]".

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
from typing import Any, Iterator

import torch

from ...core.facts import Facts
from ...core.findings import Finding, TensorInfo
from ...core.frames import user_frames, user_variable_names
from ...core.internal import log_fallback
from ...core.source_ast import reference_prefixes, written_reference
from .user_hooks import SAVED_TENSOR_DATA, probe_attribute

__all__ = ["capture_graph", "GRAPH_FORMAT_VERSION", "walk_nodes", "NODE_NAMES", "node_name", "name_tensor",
           "name_by_variable", "name_in_writing_frame", "first_tensor_step", "storage_key", "heap_modules",
           "module_tensors", "one_heap_scan", "tensor_info", "tensor_finding"]

NODE_NAMES: dict[type, str] = {}  # built-in node class -> its name: one shared string, not a new one per tensor


def node_name(node) -> str:
    """An autograd node's name, kept per node class for built-in nodes (read per saved tensor; custom Function
    nodes, BackwardCFunction, are named per Function and are not cached)."""
    name = NODE_NAMES.get(type(node))
    if name is None:
        name = node.name()
        if type(node).__name__ == name:
            NODE_NAMES[type(node)] = name
    return name


GRAPH_FORMAT_VERSION = 1
_MAX_DEPTH = 3
_MAX_NODES = 24


def walk_nodes(roots, limit: int | None = None) -> Iterator:
    """Every node of the graphs below ``roots`` (grad_fns; None entries skipped) once, depth first, at most
    ``limit`` of them. The nodes seen are held until the walk ends, so no node's identity is reused meanwhile."""
    stack, seen = list(roots), set()
    while stack and (limit is None or len(seen) < limit):
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        yield node
        stack.extend(next_node for next_node, _ in node.next_functions)


def _reaches_any(root, nodes: set, limit: int = 5000) -> bool:
    return any(node in nodes for node in walk_nodes([root], limit))


def _parameter_names() -> dict[int, str]:
    """storage pointer -> "model.layer.weight" for every module parameter/buffer on the heap (one scan)."""
    names: dict[int, str] = {}
    for name, _kind, value in module_tensors(roots_only=True):
        try:
            key = storage_key(value)
        except Exception as error:
            log_fallback("backends.torch", "reading a storage pointer", error)
            continue
        if key and key not in names:
            names[key] = name
    return names


def iter_saved(node) -> Iterator[tuple[str, Any]]:
    """(argument, packed object) for each tensor the node saved, e.g. ("mat2", record), ("tensors[0]", record).
    Reads ``_raw_saved_*`` (the pack hook's return value), so nothing is unpacked."""
    for attr in dir(node):
        if not attr.startswith("_raw_saved_"):
            continue
        try:
            value = getattr(node, attr)
        except Exception as error:
            log_fallback("backends.torch", "reading a saved attribute of a graph node", error)
            continue
        name = attr[len("_raw_saved_"):]
        many = isinstance(value, (tuple, list))
        saved_values = list(value if many else (value,))
        probed = None
        if saved_values and not SAVED_TENSOR_DATA:  # torch 2.4 (NOTE in user_hooks.py)
            try:
                probed = probe_attribute(node, "_saved_" + name)
            except Exception as error:  # already freed, or not unpackable: no names for this argument
                log_fallback("backends.torch", "probing a saved argument (torch 2.4)", error)
                probed = []
        for index, saved in enumerate(saved_values):
            if probed is not None:
                data = probed[index] if index < len(probed) else None
            else:
                try:
                    data = saved.data
                except Exception as error:
                    log_fallback("backends.torch", "reading a saved tensor's data", error)
                    data = None
            yield (f"{name}[{index}]" if many else name), data


def _unpacking_argument(node, target) -> str | None:
    return next((argument for argument, data in iter_saved(node) if data is target), None)


def _saved_arguments(node, record) -> list[dict[str, Any]]:
    """The node's saved tensor arguments, ``record``'s marked stale."""
    out: list[dict[str, Any]] = []
    for argument, data in iter_saved(node):
        tensor = getattr(data, "tensor", data)
        entry: dict[str, Any] = {"argument": argument, "stale": data is record and record is not None}
        if isinstance(tensor, torch.Tensor):
            entry["shape"] = list(tensor.shape)
            entry["dtype"] = str(tensor.dtype).replace("torch.", "")
        out.append(entry)
    return out


def _via(write) -> str | None:
    if write.via:
        return write.via
    if "nn/parallel/distributed.py" in (write.library_frame or "").replace("\\", "/"):
        return "DDP buffer broadcast"
    return None


class _Capture:
    """The nodes and edges of a captured graph, one entry per autograd node."""

    def __init__(self, record):
        self.record = record
        self.names: dict[int, str] | None = None
        self.nodes: list[dict[str, Any]] = []
        self.edges: list[dict[str, Any]] = []
        self.ids: dict[int, str] = {}
        self.keep_alive: list[object] = []  # ids are only unique while the nodes are alive

    def add(self, fn, depth: int, role: str) -> str:
        key = id(fn)
        if key in self.ids:
            return self.ids[key]
        node_id = f"n{len(self.ids)}"
        self.ids[key] = node_id
        self.keep_alive.append(fn)
        name = fn.name().replace("torch::autograd::", "")
        entry: dict[str, Any] = {"id": node_id, "type": "op", "role": role, "name": name, "label": name,
                                 "detail": "", "depth": depth, "saved": []}
        variable = getattr(fn, "variable", None) if "AccumulateGrad" in name else None
        if isinstance(variable, torch.Tensor):
            self._describe_leaf(entry, variable)
        else:
            saved = _saved_arguments(fn, self.record)
            entry["saved"] = saved
            if saved:
                entry["detail"] = "saved: " + ", ".join(s["argument"] for s in saved)
        self.nodes.append(entry)
        return node_id

    def _describe_leaf(self, entry: dict[str, Any], variable) -> None:
        if self.names is None:
            try:
                self.names = _parameter_names()
            except Exception as error:
                log_fallback("backends.torch", "naming parameters", error)
                self.names = {}
        try:
            label = self.names.get(storage_key(variable))
        except Exception as error:
            log_fallback("backends.torch", "naming a leaf", error)
            label = None
        entry["type"] = "leaf"
        entry["label"] = label or "leaf tensor"
        shape = ", ".join(str(s) for s in variable.shape)
        entry["detail"] = f"{'parameter' if label else 'leaf'} {str(variable.dtype).replace('torch.', '')}[{shape}]"
        record = self.record
        try:  # the saved tensor is (a view of) this parameter
            stale_storage = storage_key(record.tensor) if record is not None else None
            if stale_storage and storage_key(variable) == stale_storage:
                entry["stale_alias"] = True
                entry["detail"] += ": the stale tensor"
        except Exception as error:
            log_fallback("backends.torch", "comparing a leaf with the stale storage", error)

    def walk_inputs(self, node, saver_id: str) -> bool:
        """Add the inputs of ``node`` breadth first up to ``_MAX_DEPTH``; whether the graph was cut short."""
        truncated = False
        frontier = [(node, saver_id)]
        for depth in range(1, _MAX_DEPTH + 1):
            following = []
            for fn, fn_id in frontier:
                for position, (child, _) in enumerate(getattr(fn, "next_functions", ()) or ()):
                    if child is None:
                        continue
                    if id(child) not in self.ids and len(self.ids) >= _MAX_NODES:
                        truncated = True
                        continue
                    new = id(child) not in self.ids
                    child_id = self.add(child, depth, "input")
                    self.edges.append({"from": fn_id, "to": child_id, "kind": "input", "label": f"input {position}"})
                    if new:
                        following.append((child, child_id))
            frontier = following
        return truncated or any(getattr(fn, "next_functions", ()) for fn, _ in frontier)

    def add_stale(self, saver_id: str, finding) -> str | None:
        """The stale tensor's node, saved by the saver; None when neither the finding nor the saver names one."""
        stale_argument = next((s for s in self.nodes[0]["saved"] if s.get("stale")), None)
        if finding is None and stale_argument is None:
            return None
        stale_id = "t0"
        label = finding.tensor.label if finding is not None else "saved tensor"
        detail = ""
        if finding is not None and finding.versions:
            detail = f"version saved {finding.versions.get('saved')}, now {finding.versions.get('now')}"
        self.nodes.append({"id": stale_id, "type": "tensor", "role": "stale", "name": "stale tensor", "label": label,
                           "detail": detail, "depth": 1, "saved": []})
        argument = stale_argument["argument"] if stale_argument else (
            finding.saved_at.argument if finding is not None else None)
        self.edges.append({"from": saver_id, "to": stale_id, "kind": "saved",
                           "label": f"saved {argument or ''}".strip()})
        return stale_id

    def add_writes(self, finding, stale_id: str) -> list[str]:
        write_ids: list[str] = []
        for index, write in enumerate(finding.modified_at[:4]):
            write_id = f"w{index}"
            write_ids.append(write_id)
            where = write.location.short if write.location else "an unknown line"
            self.nodes.append({
                "id": write_id, "type": "write", "role": "write", "name": write.op,
                "label": f"{write.op}{' via ' + _via(write) if _via(write) else ''}",
                "detail": f"at {where}" + (f": {write.location.code}" if write.location and write.location.code else ""),
                "depth": 2, "saved": [],
            })
            versions = ""
            if write.version_before is not None:
                versions = f"version {write.version_before} -> {write.version_after}"
            if not write.bumps_version:
                versions = f"{versions}, no version bump" if versions else "no version bump"
            self.edges.append({"from": write_id, "to": stale_id, "kind": "write", "label": versions or "wrote"})
        return write_ids


def capture_graph(node, record=None, finding=None) -> dict[str, Any] | None:
    """The graph around ``node`` (the saver), with ``record``'s tensor and ``finding``'s writes marked."""
    if node is None:
        return None
    capture = _Capture(record)
    saver_id = capture.add(node, 0, "saver")
    truncated = capture.walk_inputs(node, saver_id)
    stale_id = capture.add_stale(saver_id, finding)
    write_ids = capture.add_writes(finding, stale_id) if finding is not None and stale_id is not None else []
    return {"format_version": GRAPH_FORMAT_VERSION, "nodes": capture.nodes, "edges": capture.edges,
            "saver": saver_id, "stale": stale_id, "writes": write_ids, "truncated": truncated}


# -- naming a tensor on the error path (NOTE [Why a heap scan, only on the error path]) --------------------------
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


def tensor_finding(kind: str, t: torch.Tensor, name: str | None, role: str, writes: list, display: list,
                   producer: str | None = "", /, **facts) -> Finding:
    """The finding of a torch-only check about ``t`` (:func:`tensor_info`): its writes, ``facts``, ``display``."""
    return Finding(kind=kind, tensor=tensor_info(t, name, role, producer), modified_at=writes,
                   facts=Facts(**facts, display=display))


def storage_key(t: torch.Tensor) -> int:
    """The base address of ``t``'s storage (the ledger's key): ``data_ptr()`` less the offset, without building a
    storage object (0.9 -> 0.4 us); an empty tensor's data_ptr may be null, so its storage is asked."""
    if t.numel() == 0:
        return t.untyped_storage().data_ptr()
    return t.data_ptr() - t.storage_offset() * t.element_size()


def name_tensor(t: torch.Tensor) -> tuple[str | None, str | None]:
    """(qualified name, "parameter" | "buffer") of the module tensor sharing ``t``'s memory, or (None, None)."""
    try:
        key = storage_key(t)
    except Exception as error:  # no storage (e.g. sparse, fake)
        log_fallback("backends.torch", "reading a tensor's storage key", error)
        return None, None
    if key == 0:
        return None, None
    for name, kind, value in module_tensors():
        if value is not None and value.device == t.device and storage_key(value) == key:
            return name, kind
    return None, None


def module_tensors(roots_only: bool = False):
    """(qualified name, "parameter" | "buffer", tensor) of the modules on the heap, outermost modules first, each
    named from the user's variable holding it (``model.fc.weight``); ``roots_only``: the outermost modules only."""
    modules = heap_modules()
    children = {id(c) for m in modules for c in m.children()}
    roots = [m for m in modules if id(m) not in children]
    if not roots_only:
        roots += [m for m in modules if id(m) in children]
    variable = user_variable_names({id(m) for m in roots})
    for module in roots:
        prefix = variable.get(id(module), type(module).__name__)
        for kind, items in (("parameter", module.named_parameters()), ("buffer", module.named_buffers())):
            for name, value in items:
                yield f"{prefix}.{name}", kind, value


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
