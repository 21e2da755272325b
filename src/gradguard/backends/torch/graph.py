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
"""

from __future__ import annotations

from typing import Any, Iterator

import torch

from ...core.frames import user_variable_names
from ...core.internal import log_fallback
from .compat import SAVED_TENSOR_DATA, probe_attribute
from .naming import heap_modules

__all__ = ["capture_graph", "GRAPH_FORMAT_VERSION", "walk_nodes", "NODE_NAMES", "node_name"]

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
    modules = heap_modules()
    children = {id(c) for m in modules for c in m.children()}
    roots = [m for m in modules if id(m) not in children]
    variables = user_variable_names({id(m) for m in roots})
    names: dict[int, str] = {}
    for module in roots:
        prefix = variables.get(id(module), type(module).__name__)
        for items in (module.named_parameters(), module.named_buffers()):
            for name, value in items:
                try:
                    key = value.untyped_storage().data_ptr()
                except Exception as error:
                    log_fallback("backends.torch", "reading a storage pointer", error)
                    continue
                if key and key not in names:
                    names[key] = f"{prefix}.{name}"
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
        if saved_values and not SAVED_TENSOR_DATA:  # torch 2.4 (NOTE in compat.py)
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
            label = self.names.get(variable.untyped_storage().data_ptr())
        except Exception as error:
            log_fallback("backends.torch", "naming a leaf", error)
            label = None
        entry["type"] = "leaf"
        entry["label"] = label or "leaf tensor"
        shape = ", ".join(str(s) for s in variable.shape)
        entry["detail"] = f"{'parameter' if label else 'leaf'} {str(variable.dtype).replace('torch.', '')}[{shape}]"
        record = self.record
        try:  # the saved tensor is (a view of) this parameter
            stale_storage = record.tensor.untyped_storage().data_ptr() if record is not None else None
            if stale_storage and variable.untyped_storage().data_ptr() == stale_storage:
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
