"""Which tensor each backward pass was called on, and through which user calls, to tell "the same loss
backpropagated twice" from a graph that crosses into another one.

# NOTE [The same loss backpropagated twice]
# R-Drop's criterion calls `optimizer.backward(loss)` and returns the loss; the task's `train_step` calls
# `optimizer.backward(loss)` on it again. Both backward passes start at the same tensor, through the same
# helper line (`loss.backward()` inside `Optimizer.backward`), from different callers. The second one meets the
# graph the first one freed. Nothing crosses between graphs and nothing is carried between iterations: the
# repair is to delete the second call, where the two call chains part (retain_graph=True would double the
# gradient). Recorded once per backward pass (its first unpack): a weak reference to the receiver of
# `.backward()` in the innermost user frame (never keeping it alive) and the user frames' lines, outwards.

Where the loss of the failing backward was made, when optimizer steps ran between making it and its backward.

# NOTE [A loss made before the steps]
# SAC-style updates compute every loss first and then call a helper per loss that does zero_grad, backward and
# step (`update_params(q1_optim, ..., q1_loss)`; `update_params(policy_optim, ..., policy_loss)`). The policy
# loss's graph went through the critic, whose weights the earlier helpers' steps updated in place. The step is
# inside the helper, after its own backward, so "step after the backward" is not an edit that helps; the
# repair is to compute the loss after the steps: move the statement that made it to just before the statement
# that leads to its backward. The other repair keeps the loss where it is and moves its backward up instead: the
# statements that zero the gradients, backpropagate this loss and step with it (gdrl's SAC, whose policy loss is
# built from critic outputs made statements before it, all stale after the critics' steps). Read while the
# backward runs (on CPU the engine runs on the caller's thread, so the user's frames are on the stack): the
# receiver of `.backward()` in the innermost user frame, followed outwards through the frames that pass it on,
# to the frame that assigned it.
"""

from __future__ import annotations

import ast
import collections
import functools
import itertools
import linecache
import os
import sys
import sysconfig
import weakref
from dataclasses import dataclass

import torch

from ...core.findings import SourceLocation
from ...core.fixes import statement_code
from ...core.frames import LIBRARY_PATHS, user_frames
from ...core.source_ast import assignment_before, backward_receiver as _backward_receiver, evaluate_reference
from ...core.source_ast import parse_file, statement_at
from .graph import _reaches_any

__all__ = ["BackwardCall", "backward_call", "raised_chain", "second_call_of_same_loss", "loss_made_before_steps"]

_CHAIN = 64  # user frames kept per call (compared from the outside in: both must reach the outermost)


@dataclass(frozen=True)
class BackwardCall:
    receiver: "weakref.ref[torch.Tensor] | None"
    version: int  # the receiver's version then: `loss += more` keeps the object but makes another graph
    chain: tuple[SourceLocation, ...]  # user frames, innermost first
    seq: int | None = None  # the root's sequence number: NOTE [Finding the crossing by the graph] (graph.py)


_INSTALLED = tuple(os.path.realpath(path) + os.sep for key, path in sysconfig.get_paths().items()
                   if key in ("stdlib", "purelib", "platlib"))


@functools.lru_cache(maxsize=4096)
def _is_user(filename: str) -> bool:
    """Not a registered library, the standard library or an installed package (pytest's frames move on before the
    error is diagnosed)."""
    if LIBRARY_PATHS.is_library(filename) or filename.startswith("<"):
        return filename.startswith("<") and not filename.startswith("<frozen ")  # exec'd or notebook cells count
    return not os.path.realpath(filename).startswith(_INSTALLED)


def _lookup(expression: str, frame) -> object:
    """The value of ``expression`` (the receiver of a ``.backward()`` call) in ``frame``."""
    return evaluate_reference(expression, collections.ChainMap(frame.f_locals, frame.f_globals))  # no copy


def loss_of(frame, code: str | None = None) -> tuple[str | None, object]:
    """(the receiver of the ``.backward()`` call in ``code``, by default ``frame``'s line; its value in ``frame``)."""
    receiver = _backward_receiver(linecache.getline(frame.f_code.co_filename, frame.f_lineno) if code is None
                                  else code)
    return receiver, (_lookup(receiver, frame) if receiver else None)


def _location(frame, line: int) -> SourceLocation:
    filename = frame.f_code.co_filename
    return SourceLocation(filename, line, frame.f_code.co_name, linecache.getline(filename, line).strip())


def user_frames_of(frame):
    """The user frames (:func:`_is_user`) from ``frame`` outwards."""
    while frame is not None:
        if _is_user(frame.f_code.co_filename):
            yield frame
        frame = frame.f_back


def user_chain(frame) -> tuple[SourceLocation, ...]:
    """The user (non-library) frames from ``frame`` outwards, as locations with their source line."""
    return tuple(_location(f, f.f_lineno) for f in itertools.islice(user_frames_of(frame), _CHAIN))


def raised_chain(traceback) -> tuple[SourceLocation, ...]:
    """:func:`user_chain` of the frame that raised, read from the traceback: the frames it passed through have
    moved on since (to the ``with`` that reports the error), the traceback kept the lines they were at."""
    entries = []
    while traceback is not None:
        entries.append((traceback.tb_frame, traceback.tb_lineno))
        traceback = traceback.tb_next
    if not entries:
        return ()
    inner = [_location(f, line) for f, line in reversed(entries) if _is_user(f.f_code.co_filename)]
    return (*inner, *user_chain(entries[0][0].f_back))[:_CHAIN]


def backward_call(skip: int = 2) -> BackwardCall | None:
    """The running backward pass's receiver and user call chain (CPU: the engine runs on the caller's thread)."""
    frame = sys._getframe(skip)
    while frame is not None and not _is_user(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return None
    code = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
    # Not for torch.autograd.grad: reading a function's locals caches them on its frame until they are read again,
    # and the gradients of a create_graph=True call would keep their graph alive there.
    _receiver, value = loss_of(frame, code) if "autograd.grad" not in code else (None, None)
    if not isinstance(value, torch.Tensor):
        node = torch._C._current_autograd_node()  # the node unpacking: near the root (`accelerator.backward(loss)`)
        return BackwardCall(None, 0, user_chain(frame), node._sequence_nr() if node is not None else None)
    root = value.grad_fn
    return BackwardCall(weakref.ref(value), value._version, user_chain(frame),
                        root._sequence_nr() if root is not None else None)


def second_call_of_same_loss(calls: list[BackwardCall], loss, chain: tuple[SourceLocation, ...]):
    """``(the earlier backward's own call, the earlier path's statement, the failing path's statement to delete)``:
    the first user frames, from the outside in, where an earlier backward from the same ``loss`` took another path;
    None when there is none, or it came through the same lines (a loop)."""
    def same(call: BackwardCall) -> bool:
        return call.receiver is not None and call.receiver() is loss and call.version == loss._version

    for call in reversed(calls[:-1] if calls and same(calls[-1]) and calls[-1].chain == chain else calls):
        if not same(call):
            continue
        for here, there in zip(chain[::-1], call.chain[::-1]):  # the first frame, from the outside in, that differs
            if (here.file, here.line) != (there.file, there.line):
                # the earlier backward's own call: its innermost frame past the lines both calls share inside
                # (the helper's `loss.backward()`)
                shared = 0
                while (shared < min(len(chain), len(call.chain)) - 1
                       and (chain[shared].file, chain[shared].line) == (call.chain[shared].file, call.chain[shared].line)):
                    shared += 1
                return call.chain[shared], there, here
        return None
    return None


# -- where the loss was made (NOTE [A loss made before the steps]) -----------------------------------------------------
def _block_siblings(filename: str, line: int) -> tuple[list[ast.stmt], int] | None:
    """The innermost block holding a statement that spans ``line``, and that statement's index."""
    tree = parse_file(filename)
    best = None
    for node in ast.walk(tree) if tree is not None else ():
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if not isinstance(block, list):
                continue
            for index, statement in enumerate(block):
                if isinstance(statement, ast.stmt) and statement.lineno <= line <= (statement.end_lineno or 0):
                    if best is None or statement.lineno >= best[0][best[1]].lineno:
                        best = (block, index)
    return best


def loss_made_before_steps() -> dict | None:
    """``{"file", "line", "code", "name", "after_line"}``: the statement that made the running backward's loss
    and the line of the statement after which it should be made instead (the one before the statement that
    leads to the backward, in the same block), when other statements ran in between; None otherwise."""
    frames = list(user_frames(sys._getframe()))
    if not frames:
        return None
    innermost = frames[0]
    receiver, loss = loss_of(innermost)
    if not isinstance(loss, torch.Tensor):
        return None
    for frame in frames:
        name = receiver if frame is innermost else next((n for n, v in frame.f_locals.items() if v is loss), None)
        if name is None:
            return None
        filename, line = frame.f_code.co_filename, frame.f_lineno
        made = assignment_before(filename, line, name)
        if made is None or made.line < frame.f_code.co_firstlineno:
            continue  # a parameter here: made by a caller
        siblings = _block_siblings(filename, line)
        if siblings is None:
            return None
        block, index = siblings
        made_index = next((i for i, s in enumerate(block) if s.lineno == made.line), None)
        if made_index is None or index - made_index < 2:
            return None  # made in another block, or right before: nothing ran in between
        return {"file": filename, "line": made.line, "code": made.code, "name": name,
                "function": frame.f_code.co_name, "after_line": block[index - 1].end_lineno or block[index - 1].lineno,
                "backward_block": _backward_block(block, made_index, index)}
    return None


def _called_method(statement: ast.stmt) -> str | None:
    """``step`` for the expression statement ``opt.step()``; None for any other statement."""
    if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
        func = statement.value.func
        return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return None


def _names(statements: list[ast.stmt], context: type) -> set[str]:
    return {n.id for s in statements for n in ast.walk(s) if isinstance(n, ast.Name) and isinstance(n.ctx, context)}


def _backward_block(block: list[ast.stmt], made_index: int, index: int) -> list[int] | None:
    """Lines of the statements that backpropagate the loss and step (`opt.zero_grad()` ... `opt.step()`), to move up
    to just after the loss is made; None when they read a name assigned in between."""
    start = index
    while start - 1 > made_index and _called_method(block[start - 1]) == "zero_grad":
        start -= 1
    end = index
    for offset, statement in enumerate(block[index + 1:], start=1):
        method = _called_method(statement)
        if method is None or "backward" in ast.dump(statement):  # another loss's backward: not this block
            break
        if method == "step":
            end = index + offset
            break
    if start - 1 <= made_index:
        return None  # nothing runs between the loss and its block
    moved = block[start:end + 1]
    if _names(moved, ast.Load) & _names(block[made_index + 1:start], ast.Store):
        return None
    return [s.lineno for s in moved]


# NOTE [A value made once, before the loop that steps]
# SinGAN's generator loop: `fake = netG(noise, prev)` is made once, in the discriminator's loop, and every
# iteration of the generator's loop builds its loss from it (`output = netD(fake)`) and steps netG. The first
# step updates the weights that `fake`'s forward saved, so the second iteration's backward meets them stale.
# The node unpacking the stale tensor lies in the graph of a variable made before the loop: recomputing that
# variable at the top of the loop (before its first use there) gives every iteration a fresh forward.


def innermost_loop(filename: str, line: int, kinds: tuple = (ast.For, ast.While),
                   inside=lambda loop: loop.body[0].lineno):
    """The innermost loop of ``kinds`` whose lines from ``inside(loop)`` to its end hold ``line``."""
    tree = parse_file(filename)
    loop = None
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, kinds) and inside(node) <= line <= (node.end_lineno or 0):
            if loop is None or node.lineno > loop.lineno:
                loop = node
    return loop


def _first_use(loop, name: str, line: int) -> int:
    """Line of the first statement of ``loop``'s body that reads ``name`` (the body's first one if none)."""
    for statement in loop.body:
        if statement.lineno > line:
            break
        if any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load) for n in ast.walk(statement)):
            return statement.lineno
    return loop.body[0].lineno


def _reads_stale_graph(code: str, name: str, scope: dict, node) -> bool:
    """``code`` reads another variable whose graph holds ``node``: running it again would not rerun the forward."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return True
    reads = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} - {name}
    return any(_holds_graph_of(scope.get(read), node) for read in reads)


def _holds_graph_of(value, node) -> bool:
    """``value`` (a tensor, or a list/tuple/dict of them: MADDPG's ``actions``) holds a tensor whose graph reaches
    ``node``."""
    values = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else [value]
    return any(isinstance(v, torch.Tensor) and v.grad_fn is not None and _reaches_any(v.grad_fn, {node})
               for v in values)


def recompute_in_loop() -> dict | None:
    """``{"file", "line", "code", "name", "made_line"}``: insert ``code`` (the statement that made ``name``) before
    ``line``, inside the loop that runs the backward (in the nearest user frame that has one: ``agent.learn()``);
    None when no variable made before that loop carries the node unpacking the stale tensor now."""
    node = torch._C._current_autograd_node()
    if node is None:
        return None
    for frame in user_frames(sys._getframe()):
        found = _recompute_in_frame(frame, node)
        if found is not None:
            return found
    return None


def _recompute_in_frame(frame, node) -> dict | None:
    filename, line = frame.f_code.co_filename, frame.f_lineno
    loop = innermost_loop(filename, line)
    if loop is None:
        return None
    candidates = []
    for name, value in frame.f_locals.items():
        if not _holds_graph_of(value, node):
            continue
        made = assignment_before(filename, line, name)
        if made is None or not frame.f_code.co_firstlineno <= made.line < loop.lineno:
            continue
        candidates.append((made.line, name, made))
    if not candidates:
        return None
    made_line, name, made = max(candidates, key=lambda c: c[0])
    code = statement_code(SourceLocation(filename, made_line, "", made.code))
    if _reads_stale_graph(code, name, frame.f_locals, node):
        return None  # `mu = torch.cat(outputs)`: recomputing it re-reads the old forward's outputs
    return {"file": filename, "line": _first_use(loop, name, line), "code": code, "name": name,
            "made_line": made_line}


# NOTE [A forward made once, before the loop that backpropagates it]
# makemore's reporter computed the forward once and repeated `loss.backward()` and the update in a loop: the
# first backward frees the graph, the second fails. The loss itself (the receiver of `.backward()`) was made
# before the loop, so no tensor "crosses" into a new graph: the whole forward must run in every iteration. The
# repair copies, in order, the statements before the loop that made the loss and the graph-carrying tensors it
# is computed from, to the top of the loop (before the first use of the loss). Leaves and constants (a weight,
# one-hot inputs) stop the chain: they carry no graph.
_MAX_FORWARD_STATEMENTS = 12


def forward_before_loop(frame, line: int) -> dict | None:
    """``{"line", "code", "name", "first", "last"}``: the statements (``code``, one per line) that made the loss of
    the backward at ``line`` before the loop around it, to insert before ``line``; None when that is not the case
    or the forward cannot be copied (it binds through a ``for``/``with``, or is longer than a few statements)."""
    filename = frame.f_code.co_filename
    receiver, loss = loss_of(frame, linecache.getline(filename, line))
    loop = innermost_loop(filename, line)
    if not carries_graph(loss) or loop is None:
        return None
    chain = _forward_chain(receiver, frame, filename, loop.lineno)
    if not chain or len(chain) > _MAX_FORWARD_STATEMENTS:
        return None
    source = "".join(linecache.getlines(filename))
    codes = [ast.get_source_segment(source, chain[n]) for n in sorted(chain)]
    if any(code is None for code in codes):
        return None
    return {"line": _first_use(loop, receiver, line), "code": "\n".join(codes), "name": receiver,
            "first": min(chain), "last": max(chain[n].end_lineno or n for n in chain)}


def carries_graph(value) -> bool:
    """A tensor with a grad_fn, or a tuple or list holding one (``torch.autograd.grad``'s gradients, an LSTM's
    state)."""
    if isinstance(value, torch.Tensor):
        return value.grad_fn is not None
    if isinstance(value, (tuple, list)):
        return any(carries_graph(v) for v in value)
    return False


def _forward_chain(receiver: str, frame, filename: str, before: int) -> dict[int, ast.stmt] | None:
    """The assignments, by line, before line ``before`` that made ``receiver`` and the graph-carrying tensors it
    is computed from; None when one of them is not a plain assignment in ``frame``'s function."""
    start = frame.f_code.co_firstlineno
    chain: dict[int, ast.stmt] = {}
    pending, seen = [receiver], set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        if not carries_graph(_lookup(name, frame)):
            continue  # a leaf or a constant: it carries no graph to rebuild
        made = assignment_before(filename, before, name)
        statement = statement_at(filename, made.line) if made is not None else None
        if made is None or made.line < start or not isinstance(statement, (ast.Assign, ast.AnnAssign)):
            return None
        chain[statement.lineno] = statement
        pending.extend(n.id for n in ast.walk(statement.value) if isinstance(n, ast.Name))
    return chain
