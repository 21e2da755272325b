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
"""

from __future__ import annotations

import functools
import sys

import torch

from ...core.internal import log_fallback
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["OpStream", "WriteLog", "dynamo_safe", "run_op", "written_arguments"]


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
