"""The user's own ``saved_tensors_hooks`` under a guard: stacked with the guard's, never replaced.

PyTorch calls only the innermost saved-tensor hooks: a guard entered inside the user's hooks (activation
offloading, bf16 compression) would switch them off, and user hooks entered inside the guard would switch the guard
off. ``top_hooks()`` gives the user's hooks active when a guard enters (the session calls them from its own);
while a session is active, ``saved_tensors_hooks.__enter__`` is patched so that hooks the user enters on the
session's thread are pushed wrapped by the session (``TorchGuardSession.composed``).

# NOTE [Which hooks are wrapped]
# Hooks of classes defined in torch itself other than ``save_on_cpu`` (activation checkpointing's
# ``_checkpoint_hook``/``_recomputation_hook``, compile internals) are left alone: their unpack recomputes or
# rebuilds the tensor by design, and PyTorch checks them itself. gradguard's own hooks are never wrapped.
"""

from __future__ import annotations

import threading

import torch
from torch.autograd.graph import saved_tensors_hooks

from ...core.patching import SharedPatches
from .compat import TOP_HOOKS

__all__ = ["install", "uninstall", "top_hooks", "mark", "guard_hooks_on_top"]

_sessions: list = []  # (session, thread id), innermost last


def mark(fn):
    """Mark ``fn`` as one of gradguard's hooks (never wrapped, never composed with)."""
    fn._gradguard_hook = True
    return fn


def _ours(fn) -> bool:
    return getattr(fn, "_gradguard_hook", False) or type(getattr(fn, "__self__", None)).__name__ == "TorchGuardSession"


def top_hooks():
    """The user's (pack, unpack) active on this thread, or None (none, gradguard's own, or torch < 2.5)."""
    if TOP_HOOKS is None:  # torch 2.4: see NOTE in compat.py
        return None
    hooks = TOP_HOOKS(False)
    return None if hooks is None or _ours(hooks[0]) else hooks


def _innermost_session():
    ident = threading.get_ident()
    return next((session for session, thread in reversed(_sessions) if thread == ident), None)


def guard_hooks_on_top() -> bool:
    """Whether the innermost saved-tensor hooks on this thread are a guard's own (torch 2.4 cannot list them:
    a guard on this thread with its hooks pushed and no user hooks entered inside it)."""
    session = _innermost_session()
    return (session is not None and session._hooks is not None and not getattr(session, "_user_hook_depth", 0)
            and not getattr(session, "_stepped_aside", False))  # popped inside a torch.func transform (_step_aside)


def _wrapped_class(hooks) -> bool:
    cls = type(hooks)
    return (cls is saved_tensors_hooks or cls is torch.autograd.graph.save_on_cpu
            or not (cls.__module__ or "").startswith("torch."))


def _entering(original_enter):
    def __enter__(self):
        session = _innermost_session()
        if session is None or _ours(self.pack_hook) or not _wrapped_class(self):
            return original_enter(self)
        pack, unpack = session.composed(self.pack_hook, self.unpack_hook)
        torch._C._autograd._push_saved_tensors_default_hooks(pack, unpack)
        self._gradguard_session = session  # counted: torch 2.4 cannot show the stack (_step_aside)
        session._user_hook_depth = getattr(session, "_user_hook_depth", 0) + 1

    return __enter__


def _exiting(original_exit):
    def __exit__(self, *exc_info):
        session = self.__dict__.pop("_gradguard_session", None)
        if session is not None:
            session._user_hook_depth -= 1
        return original_exit(self, *exc_info)

    return __exit__


_PATCHES = SharedPatches(lambda: [(saved_tensors_hooks, "__enter__", _entering),
                                  (saved_tensors_hooks, "__exit__", _exiting)])


def install(session) -> None:
    with _PATCHES.lock:
        _sessions.append((session, threading.get_ident()))
        _PATCHES.acquire()


def uninstall(session) -> None:
    """Remove ``session`` (from any thread: a guard may be exited on another thread than it entered on)."""
    with _PATCHES.lock:
        kept = [(s, t) for s, t in _sessions if s is not session]
        for _ in range(len(_sessions) - len(kept)):
            _PATCHES.release()
        _sessions[:] = kept
