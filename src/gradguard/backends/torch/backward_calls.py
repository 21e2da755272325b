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
"""

from __future__ import annotations

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
from ...core.frames import LIBRARY_PATHS
from ...core.source_ast import backward_receiver as _backward_receiver, evaluate_reference

__all__ = ["BackwardCall", "backward_call", "raised_chain", "second_call_of_same_loss"]

_CHAIN = 64  # user frames kept per call (compared from the outside in: both must reach the outermost)


@dataclass(frozen=True)
class BackwardCall:
    receiver: "weakref.ref[torch.Tensor] | None"
    version: int  # the receiver's version then: `loss += more` keeps the object but makes another graph
    chain: tuple[SourceLocation, ...]  # user frames, innermost first
    seq: int | None = None  # the root's sequence number: NOTE [Finding the crossing by the graph] (crossing.py)


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
    _receiver, value = loss_of(frame)
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
