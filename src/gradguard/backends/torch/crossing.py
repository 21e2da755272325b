"""Which tensor crosses from a graph an earlier backward freed into the graph backpropagated now, read from the
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
import inspect
import itertools
import linecache
from dataclasses import dataclass

import torch

from ...core.findings import SourceLocation
from ...core.source_ast import assignment_before, function_node
from .graph import walk_nodes

__all__ = ["Crossing", "find_crossing"]

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
    if isinstance(value, (list, tuple, dict)):
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
        yield from ((item, f"{path}[{index}]", kind) for index, item in enumerate(value[:_ITEMS]))


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


def _class_statement(module: torch.nn.Module, lines) -> SourceLocation | None:
    """The statement of a method of ``module``'s class that ``lines(def node)`` picks: the last in ``forward``
    first, else the last. Read through the methods' code objects, which know their file even under ``exec``."""
    best = None
    for cls in type(module).__mro__:
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
    if kind == "module attribute":
        found = _module_of(path, frames)
        if found is not None:  # the statement in a method of its class that assigns `self.<attribute>`
            binding = f"self.{found[1]}"
            return _class_statement(found[0], lambda node: _assignments(node, binding)), binding
    if kind == "variable":
        code = frame.f_code
        made = assignment_before(code.co_filename, frame.f_lineno, path)
        if made is not None and made.line >= code.co_firstlineno:
            return made, path
    entry = node_sites.get((node.name(), _seq(node))) if node is not None else None
    if entry is not None:  # the forward line that made the crossed node, as the session noted it
        return entry[0], None
    if kind == "element":
        base = path.split("[", 1)[0]
        code = frame.f_code
        made = assignment_before(code.co_filename, frame.f_lineno, base)
        if made is not None and made.line >= code.co_firstlineno:
            return made, base
    return None, None


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
