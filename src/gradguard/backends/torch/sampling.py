"""``guard(sample_steps=N)``: the saved-tensor hooks are on for one backward cycle in N, off otherwise.

# NOTE [Sampled guard]
# A cycle is everything from the end of one backward pass to the end of the next (the forward that saves, and the
# backward that unpacks). In a sampled cycle the guard's saved-tensor hooks are installed as usual; in the others
# they are removed, so saving and unpacking cost exactly what they cost without gradguard (the sentinel's module
# forward hooks, forward_hooks.py, are removed and put back with them). The switch happens when
# an outermost ``torch.autograd.backward`` / ``torch.autograd.grad`` call returns (wrapped while a sampled guard is
# active: one Python call per backward pass). The cycle count is per process, not per guard: a guard entered
# around each training step (callbacks, benchmarks) keeps the phase, so a write that happens on every step is
# seen within N steps whatever the guard's lifetime.
# What sampling cannot see: a silent write on a step that is not sampled (a write that happens once, or only on
# some steps). Loud in-place errors are unaffected: with the hooks off, PyTorch's own version check raises them on
# every step (and gradguard explains them as usual).
"""

from __future__ import annotations

import functools
import threading

import torch

from . import user_hooks as _user_hooks

__all__ = ["Cycles"]

_lock = threading.Lock()
_active: list["Cycles"] = []
_originals: dict[str, object] = {}
_local = threading.local()  # depth of backward calls on this thread (a backward inside a backward is one cycle)
_ended = 0  # backward cycles ended under a sampled guard in this process


def _wrap(name: str):
    original = getattr(torch.autograd, name)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        depth = getattr(_local, "depth", 0)
        _local.depth = depth + 1
        try:
            return original(*args, **kwargs)
        finally:
            _local.depth = depth
            if depth == 0:
                _cycle_ended()

    return wrapper


def _cycle_ended() -> None:
    global _ended
    with _lock:
        _ended += 1
        ended, cycles = _ended, list(_active)
    ident = threading.get_ident()
    for cycle in cycles:
        if cycle.thread == ident:  # saved-tensor hooks are per thread: only the entering thread can move them
            cycle.switch(ended % cycle.n == 0)


class Cycles:
    """The hooks of one torch guard session, switched at backward boundaries."""

    def __init__(self, session, n: int):
        self.session, self.n = session, n
        self.thread = threading.get_ident()
        self._paused = None  # the session's saved_tensors_hooks object while removed
        self.sampled = 0  # cycles run with the hooks on

    def start(self) -> None:
        with _lock:
            if not _active:
                for name in ("backward", "grad"):
                    _originals[name] = getattr(torch.autograd, name)
                    setattr(torch.autograd, name, _wrap(name))
            _active.append(self)
            on = _ended % self.n == 0
        if on:
            self.sampled += 1
        else:
            self.switch(False)

    def stop(self) -> None:
        with _lock:
            if self in _active:
                _active.remove(self)
            if not _active:
                for name, original in _originals.items():
                    setattr(torch.autograd, name, original)
                _originals.clear()
        # paused: the session's hooks are already off the stack (session._hooks is None), nothing to pop

    def switch(self, on: bool) -> None:
        session = self.session
        forward_hooks = session._forward_hooks  # the sentinel's module hooks cost per module call: off with the rest
        if forward_hooks is not None:
            forward_hooks.install() if on else forward_hooks.uninstall()
        if not on:  # not while someone else's hooks are above ours: removing ours would remove theirs
            if (self._paused is None and session._hooks is not None and _user_hooks.guard_hooks_on_top()
                    and _user_hooks._innermost_session() is session):
                hooks = session._hooks
                hooks.__exit__(None, None, None)
                session._hooks, self._paused = None, hooks
            return
        if self._paused is not None:
            if _user_hooks.top_hooks() is not None:  # the user's own hooks entered meanwhile: stay off
                return
            hooks, self._paused = self._paused, None
            hooks.__enter__()
            session._hooks = hooks
        self.sampled += 1
