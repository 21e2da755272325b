"""An in-place update that drops the differentiable gradient it was computed from.

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
import threading
import weakref
from dataclasses import dataclass

import torch

from ...core.facts import Facts
from ...core.findings import Finding, SourceLocation, WriteRecord
from ...core.frames import user_location
from ...core.deferred import DeferredUnderLock
from ...core.internal import log_fallback
from .naming import name_by_variable, name_tensor, tensor_info

__all__ = ["Entry", "entries", "wrap_grad", "note_write", "watch_backward", "finding"]

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
        key = x.untyped_storage().data_ptr()
        with _lock:
            _deferred.drain()
            if len(entries) >= _MAX_ENTRIES:
                entries.pop(next(iter(entries)))
            entries[key] = Entry(weakref.ref(x, functools.partial(_forget, key)), x._version, used, site)


_deferred = DeferredUnderLock(_lock)  # NOTE [A callback must never wait for a lock] (core/deferred.py)


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
    entry = entries.get(target.untyped_storage().data_ptr())
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
                    if other_leaf is not None and entries.get(other_leaf.untyped_storage().data_ptr()) is other:
                        del entries[other_leaf.untyped_storage().data_ptr()]
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
    return Finding(
        kind="dropped_inner_update",
        tensor=tensor_info(t, name, "leaf", None),
        modified_at=[write] if entry.written_at is not None else [],  # the sentinel sees no write
        facts=Facts(gradient_at=entry.grad_at.to_dict() if entry.grad_at else None,
                    backward_at=backward.to_dict() if backward else None, display=display),
    )
