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

Which tensor crosses from a graph an earlier backward freed into the graph backpropagated now, read from the
graphs themselves, whatever holds it: a variable in any user frame, an element of a list or dict, an attribute
of a module (a spiking neuron's membrane, an LSTM's state) or of another object (a trainer's data).

# NOTE [Finding the crossing by the graph]
# Autograd numbers its nodes in creation order (per thread; the forward and, on CPU, the backward run on the
# caller's). Each backward pass records its root's number when it starts (_backward_calls.BackwardCall.seq):
# every node numbered at or below it existed when that backward ran. Walking the failing loss's graph, an edge
# from a node made after the latest earlier backward to one made before it is where the new graph reaches an old
# one; the old node's output is the tensor that crossed. Whatever holds that tensor now names it. When nothing
# holds it any more (a module's state, replaced by every forward), the module attribute whose current value's
# graph runs back into the old nodes names the state that carried it. The backward that freed the old part is
# the first recorded backward whose root is younger than the newest crossed node; the line that made it is where
# the holder was assigned (a module attribute: in its class's source), else the forward line the session noted
# for the crossed node (NOTE [Where a freed graph was made], session.py).
"""

from __future__ import annotations

import ast
import collections
import contextlib
import gc
import inspect
import itertools
import linecache
import sys
import threading
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from ...core.facts import Facts
from ...core.findings import Finding, SourceLocation, TensorInfo
from ...core.frames import user_frames
from ...core.internal import log_fallback
from ...core.source_ast import (assignment_before, function_node, item_assignment_before, reference_prefixes,
                                 written_reference)
from ..adapter import layer_tensors
from .user_hooks import SAVED_TENSOR_DATA, probe_attribute

__all__ = ["capture_graph", "GRAPH_FORMAT_VERSION", "walk_nodes", "NODE_NAMES", "node_name", "name_tensor",
           "name_by_variable", "name_in_writing_frame", "first_tensor_step", "storage_key", "heap_modules",
           "module_tensors", "one_heap_scan", "tensor_info", "tensor_finding", "Crossing", "find_crossing"]

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
    """(qualified name, "parameter" | "buffer", tensor) of the modules on the heap (:func:`heap_modules`), as
    :func:`~gradguard.backends.adapter.layer_tensors` names them; ``roots_only``: the outermost modules only."""
    return layer_tensors(heap_modules(), lambda module: module.children(), roots_only=roots_only)


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


# -- the tensor crossing into a freed graph (NOTE [Finding the crossing by the graph]) --------------------------------
_NODES = 5000  # nodes walked per graph
_ITEMS = 64  # elements looked at per list, tuple or dict
_MODULES = 256  # submodules looked at per module in scope
_DEPTH = 3  # containers within containers
_RANK = {"variable": 0, "element": 1, "attribute": 2, "module attribute": 3}


@dataclass
class Crossing:
    name: str  # how the user reaches it now: `data`, `outputs[0]`, `net.block.sn1.v`
    tensor: torch.Tensor | None  # None when the loss itself is the old graph's
    holder: str  # "variable" | "element" | "attribute" | "module attribute" | "loss"
    made: SourceLocation | None
    freed_by: SourceLocation | None
    binding: str | None = None  # the assignment target as written where it is made: `data`, `self.v`
    read: SourceLocation | None = None  # module state with no assignment in its class: where forward reads it back
    used: SourceLocation | None = None  # the call that fed it into the earlier backward (eager.py)
    callee: str | None = None  # that call's callee as written


def _seq(node) -> int:
    return node._sequence_nr()


def _old_boundary(root, threshold: int) -> set:
    """Nodes made at or before ``threshold`` that a node made after it points to, in ``root``'s graph."""
    boundary = set()
    for node in walk_nodes([root], _NODES):
        if _seq(node) <= threshold:
            continue
        for child, _ in node.next_functions:
            if (child is not None and (child.next_functions or not child.name().endswith("AccumulateGrad"))
                    and _seq(child) <= threshold):  # not a leaf's AccumulateGrad
                boundary.add(child)
    return boundary


def _ran_before(boundary: set, node_sites: dict) -> set:
    """The boundary nodes an earlier backward pass ran through, when the session's notes tell them apart; else all.
    # NOTE [An old graph is not a freed one]
    # A node made before the latest earlier backward may still be alive: that backward never reached it (it went
    # through a `.detach()`d copy: vqtorch's codebook update backpropagates the codebook, not the encoder). The
    # session notes each node a pass unpacks, with the pass's number (NOTE [Where a freed graph was made],
    # session.py); a node below which an earlier pass unpacked is one that pass freed, while the failing pass's
    # own notes carry the latest number. Without such notes (a pass that unpacked nothing, notes capped) every old
    # node stays a candidate, as before."""
    if not boundary or not node_sites:
        return boundary
    latest = max(value[1] for value in node_sites.values())

    def ran(node) -> bool:
        for below in walk_nodes([node], 64):
            entry = node_sites.get((below.name(), _seq(below)))
            if entry is not None and entry[1] < latest:
                return True
        return False

    return {node for node in boundary if ran(node)} or boundary


def _tensors(value, path: str, kind: str, depth: int, seen: set):
    """(path, tensor, kind) for every graph-carrying tensor reachable from ``value``."""
    if isinstance(value, torch.Tensor):
        if value.grad_fn is not None:
            yield path, value, kind
        return
    children = None if depth >= _DEPTH or id(value) in seen else _children(value, path, kind)
    if children is None:
        return
    seen.add(id(value))
    for member, where, member_kind in children:
        yield from _tensors(member, where, member_kind, depth + 1, seen)


def _children(value, path: str, kind: str):
    """(value, path, kind) for what ``value`` holds, lazily; None when it is no container."""
    if isinstance(value, (list, tuple, dict, collections.deque)):
        return _elements(value, path, "element" if kind == "variable" else kind)
    if isinstance(value, torch.nn.Module):
        return _module_members(value, path)
    if hasattr(value, "__dict__") and not isinstance(value, type) and not inspect.ismodule(value) and not callable(
            value):
        return ((member, f"{path}.{attribute}", "attribute")
                for attribute, member in list(vars(value).items())[:_ITEMS] if not attribute.startswith("__"))
    return None


def _elements(value, path: str, kind: str):
    if isinstance(value, dict):
        keys = [key for key in list(value)[:_ITEMS] if isinstance(key, (str, int))]
        yield from ((value[key], f"{path}[{key!r}]", kind) for key in keys)
    else:
        yield from ((item, f"{path}[{index}]", kind) for index, item in enumerate(itertools.islice(value, _ITEMS)))


def _module_members(value, path: str):
    for prefix, module in itertools.islice(value.named_modules(), _MODULES):
        # buffers too: a register_buffer cache carries the graph it was made in (parameters are leaves: none)
        members = {**vars(module), **module._buffers}
        for attribute, member in members.items():
            if not attribute.startswith("_") and isinstance(member, (torch.Tensor, list, tuple)):
                where = f"{path}.{prefix}.{attribute}" if prefix else f"{path}.{attribute}"
                yield member, where, "module attribute"


def _holders(frames):
    """(path, tensor, kind, frame) for the graph-carrying tensors the user's frames hold, innermost first."""
    seen: set = set()
    for frame in frames:
        for name, value in list(frame.f_locals.items()):
            if name.startswith("__"):
                continue
            for path, tensor, kind in _tensors(value, name, "variable", 0, seen):
                yield path, tensor, kind, frame


def _class_statement(owner: object, lines) -> SourceLocation | None:
    """The statement of a method of ``owner``'s class (a module, or any object) that ``lines(def node)`` picks: the
    last in ``forward`` first, else the last. Read through the methods' code objects, which know their file even
    under ``exec``."""
    best = None
    for cls in type(owner).__mro__:
        if cls.__module__.startswith("torch."):
            break
        for function in vars(cls).values():
            code = getattr(function, "__code__", None)
            node = function_node(code.co_filename, code.co_firstlineno, code.co_name) if code is not None else None
            for line in lines(node) if isinstance(node, ast.FunctionDef) else ():  # its `def`, not an `async def`
                rank = (code.co_name == "forward", line)
                if best is None or rank > best[0]:
                    best = (rank, code.co_filename, line, code.co_name)
    if best is None:
        return None
    _rank, filename, line, function = best
    return SourceLocation(filename, line, function, linecache.getline(filename, line).strip())


def _class_read(module: torch.nn.Module, attribute: str) -> SourceLocation | None:
    """The statement of ``module``'s class that hands ``self.<attribute>`` on as a value (``return self.cache[:n]``,
    not ``self.cache.shape``): where state no statement of the class assigns flows back into the computation."""
    wanted = f"self.{attribute}"
    return _class_statement(module, lambda node: (
        statement.lineno for statement in ast.walk(node)
        if isinstance(statement, (ast.Return, ast.Assign)) and statement.value is not None
        and any(ast.unparse(n) == wanted for n in _value_uses(statement.value))))


def _value_uses(value: ast.expr):
    """The attribute references in ``value`` that are not the object of a further attribute (``.shape``)."""
    parents = {id(child): parent for parent in ast.walk(value) for child in ast.iter_child_nodes(parent)}
    for node in ast.walk(value):
        if isinstance(node, ast.Attribute) and not isinstance(parents.get(id(node)), ast.Attribute):
            yield node


def _assignments(node: ast.AST, wanted: str):
    """Lines of the statements within ``node`` that assign ``wanted`` (`self.v`), alone or in a tuple."""
    for statement in ast.walk(node):
        if not isinstance(statement, (ast.Assign, ast.AnnAssign)):
            continue
        targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
        names = {ast.unparse(t) for target in targets
                 for t in (target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target])}
        if wanted in names:
            yield statement.lineno


def _module_of(path: str, frames) -> tuple[torch.nn.Module, str] | None:
    """The module holding the attribute at ``path`` (`net.block.sn1.v` -> (net.block.sn1, "v"))."""
    head, *middle, attribute = path.replace("[", ".[").split(".")
    for frame in frames:
        value = frame.f_locals.get(head)
        if value is None:
            continue
        for part in middle:
            if isinstance(value, torch.nn.Module):
                value = value.get_submodule(part) if not part.startswith("[") else None
            elif isinstance(value, (list, tuple, dict)) and part.startswith("["):
                try:
                    value = value[ast.literal_eval(part[1:-1])]
                except (ValueError, KeyError, IndexError, SyntaxError):
                    value = None
            else:
                value = getattr(value, part, None)
            if value is None:
                break
        if isinstance(value, torch.nn.Module):
            return value, attribute
    return None


def _read_back(path: str, kind: str, frames, made: SourceLocation | None) -> SourceLocation | None:
    """For module state its class never assigns (``made`` is None), where the class reads it back."""
    found = _module_of(path, frames) if kind == "module attribute" and made is None else None
    return _class_read(*found) if found is not None else None


def _made(path: str, kind: str, frame, frames, node, node_sites) -> tuple[SourceLocation | None, str | None]:
    if kind in ("module attribute", "attribute"):
        found = _module_of(path, frames) if kind == "module attribute" else _attribute_of(path, frame)
        if found is not None:  # the statement in a method of its class that assigns `self.<attribute>`
            binding = f"self.{found[1]}"
            made = _class_statement(found[0], lambda node: _assignments(node, binding))
            if made is not None or kind == "module attribute":
                return made, binding
    if kind == "variable":
        code = frame.f_code
        made = assignment_before(code.co_filename, frame.f_lineno, path)
        if made is not None and made.line >= code.co_firstlineno:
            return made, path
    entry = node_sites.get((node.name(), _seq(node))) if node is not None else None
    if entry is not None:  # the forward line that made the crossed node, as the session noted it
        return entry[0], None
    if kind == "element":  # the element's own assignment (`state["h"] = ...`, `state[sid] = ...`), else its container's
        code = frame.f_code
        container = path.split("[", 1)[0]
        made = assignment_before(code.co_filename, frame.f_lineno, path)
        item = item_assignment_before(code.co_filename, frame.f_lineno, container) if made is None else None
        found = (made, path) if made is not None else item or (
            assignment_before(code.co_filename, frame.f_lineno, container), container)
        if found[0] is not None and found[0].line >= code.co_firstlineno:
            return found
    return None, None


def _attribute_of(path: str, frame) -> tuple[object, str] | None:
    """``self.hidden[0]`` -> (the frame's ``self``, "hidden"): the object and the attribute the path reaches first."""
    head, _, rest = path.partition(".")
    attribute = rest.split("[", 1)[0]
    owner = frame.f_locals.get(head) if attribute.isidentifier() else None
    return (owner, attribute) if owner is not None else None


def _is_alias(made: SourceLocation | None) -> bool:
    """``made`` binds a name to what another expression already holds (`x = y`, `x = ys[i]`, `x = obj.y`)."""
    if made is None:
        return False
    try:
        statement = ast.parse(made.code).body[0]
    except (SyntaxError, IndexError):
        return False
    return isinstance(statement, ast.Assign) and isinstance(statement.value, (ast.Name, ast.Subscript, ast.Attribute))


def _freed_by(calls, seq: int) -> SourceLocation | None:
    """The first recorded backward that ran after the node numbered ``seq`` was made (its innermost user line)."""
    for call in calls:
        if call.seq is not None and call.seq >= seq and call.chain:
            return call.chain[0]
    return None


def find_crossing(loss: torch.Tensor, frames: list, calls: list, node_sites: dict) -> Crossing | None:
    """The tensor by which ``loss``'s graph reaches a graph an earlier recorded backward ran, or the loss itself
    when its own graph is that old one; None when the recorded backward calls say nothing about it."""
    root = loss.grad_fn
    if root is None:
        return None
    top = _seq(root)
    earlier = [call.seq for call in calls if call.seq is not None and call.seq < top]
    boundary = _ran_before(_old_boundary(root, max(earlier)), node_sites) if earlier else set()
    if not boundary:
        if any(call.seq is not None and call.seq >= top for call in calls):  # the loss was made before a backward
            return Crossing("", None, "loss", None, _freed_by(calls, top))
        return None
    newest = max(_seq(node) for node in boundary)
    freed_by = _freed_by(calls, newest)
    holders = list(_holders(frames))
    exact = [(path, t, kind, frame) for path, t, kind, frame in holders if t.grad_fn in boundary]
    if exact:
        return _exact_holder(exact, frames, node_sites, freed_by)
    return _replaced_state(holders, boundary, max(earlier), frames, node_sites, freed_by)


def _exact_holder(exact: list, frames: list, node_sites: dict, freed_by) -> Crossing:
    """The holder, of those whose tensor is itself a crossed node's output, that the user made it by."""
    ranked = []
    for path, tensor, kind, frame in exact:
        made, binding = _made(path, kind, frame, frames, tensor.grad_fn, node_sites)
        # a name bound to another holder's tensor (`peer = outputs[1 - i]`) did not make it: the last choice
        ranked.append(((_is_alias(made), _RANK[kind], -_seq(tensor.grad_fn)), path, tensor, kind, made, binding))
    _key, path, tensor, kind, made, binding = min(ranked, key=lambda r: r[0])
    return Crossing(path, tensor, kind, made, freed_by, binding, _read_back(path, kind, frames, made))


def _replaced_state(holders: list, boundary: set, threshold: int, frames: list, node_sites: dict,
                    freed_by) -> Crossing | None:
    """State replaced since: the holder whose current value's graph runs back into the old nodes."""
    state = [(_steps_to(t.grad_fn, boundary), path, t, kind, frame) for path, t, kind, frame in holders
             if kind != "variable" and _seq(t.grad_fn) > threshold]
    state = [entry for entry in state if entry[0] is not None]
    if not state:
        return None
    # the kind of holder first (module state), then the one whose graph reaches the old part soonest: the value made
    # from the freed tensor (`vq_out['z_q']`, an embedding of it), not a loss computed further from it
    _steps, path, tensor, kind, frame = min(state, key=lambda h: (-_RANK[h[3]], h[0], h[1]))
    noted = node_sites.get((tensor.grad_fn.name(), _seq(tensor.grad_fn))) if kind == "element" else None
    if noted is not None:  # an element's value was made where the session saw its node save (not the dict's line)
        return Crossing(path, tensor, kind, noted[0], freed_by, None, None)
    made, binding = _made(path, kind, frame, frames, max(boundary, key=_seq), node_sites)
    return Crossing(path, tensor, kind, made, freed_by, binding, _read_back(path, kind, frames, made))


def _steps_to(root, nodes: set) -> int | None:
    """How many edges below ``root`` the first of ``nodes`` lies (breadth first), or None within the walk's limit."""
    level, seen, depth = [root], {root}, 0
    while level and len(seen) < _NODES:
        if any(node in nodes for node in level):
            return depth
        following = []
        for node in level:
            for child, _ in node.next_functions:
                if child is not None and child not in seen:
                    seen.add(child)
                    following.append(child)
        level, depth = following, depth + 1
    return None
