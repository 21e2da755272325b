"""Where the guard cannot watch, it steps aside for that region, says so in one line, and the program runs
exactly as without gradguard.

# NOTE [Stepping aside for torch.func]
# ``torch.func.grad/vjp/jacrev/hessian`` enter ``torch.autograd.graph.disable_saved_tensors_hooks(message)``,
# which raises when any saved-tensor hooks are active: under a guard, a legal program failed with "torch.func
# ... don't yet support saved tensor hooks". While a guard is active that context manager is replaced: when
# the hooks on top of the stack are gradguard's own (not composed with the user's), they are popped for the
# transform and pushed back after it, with a ``NotWatched`` warning. Hooks the user entered stay where they
# are, so a program that fails without gradguard fails the same way with it.
#
# NOTE [Tensors the fingerprint cannot read]
# Sparse (COO, CSR, ...) and nested tensors have no single strided storage to version-check or hash: pack
# hands them back to autograd untouched (autograd keeps them exactly as without hooks, and PyTorch's own
# version check does not run for them, as for any tensor saved through hooks), with one ``NotWatched``.
"""

from __future__ import annotations

import contextlib

import torch

from ..._errors import NotWatched
from ...core.notices import notice
from ...core.patching import SharedPatches
from .compat import TOP_HOOKS

__all__ = ["install", "uninstall", "not_watched", "unreadable_layout", "guard_pack"]

_sessions: list = []


def not_watched(session, kind: str, message: str) -> None:
    """Warn once per ``kind`` per session: gradguard is not watching this part of the program."""
    seen = session.__dict__.setdefault("_not_watched", set())
    if kind not in seen:
        seen.add(kind)
        notice(f"gradguard: {message}", NotWatched)


def unreadable_layout(t: torch.Tensor) -> str | None:
    """Why gradguard cannot fingerprint or version-track ``t`` (one phrase), or None when it can."""
    if t.is_nested:
        return "nested tensors"
    if t.layout != torch.strided:
        return f"{str(t.layout).replace('torch.', '')} tensors"
    return None


def guard_pack(fn):
    """Mark a session method as a guard's own pack hook (plain, or lifting the call gate): popped for torch.func,
    unlike a pack composed with the user's hooks, which carries the user's hooks along."""
    fn._gradguard_guard_pack = True
    return fn


def _stepping_aside(original):
    """``disable_saved_tensors_hooks`` that first pops a guard's own hooks, with a one-line note."""

    @contextlib.contextmanager
    def disable_saved_tensors_hooks(error_message: str):
        with _stepping_aside_of_guards(), original(error_message):
            yield

    return disable_saved_tensors_hooks


@contextlib.contextmanager
def _stepping_aside_of_guards():
    popped = []
    if TOP_HOOKS is not None:
        hooks = TOP_HOOKS(False)
        # a guard's own pack (a bound method reads its function's attributes)
        while hooks is not None and getattr(hooks[0], "_gradguard_guard_pack", False):
            torch._C._autograd._pop_saved_tensors_default_hooks()
            popped.append(hooks)
            hooks = TOP_HOOKS(False)
    else:  # torch 2.4 cannot show the stack: the guard's hooks are on top unless the user entered some inside it,
        # or a transform around this one (vmap(grad(f))) has popped them already
        session = _sessions[-1] if _sessions else None
        if (session is not None and session._hooks is not None and not session.__dict__.get("_user_hook_depth", 0)
                and not session.__dict__.get("_stepped_aside")):
            torch._C._autograd._pop_saved_tensors_default_hooks()
            popped.append((session._hooks.pack_hook, session._hooks.unpack_hook))
            session._stepped_aside = True
    try:
        if popped:
            session = popped[0][0].__self__
            not_watched(session, "torch.func",
                        "not watching inside torch.func transforms (grad, vjp, jacrev, hessian refuse saved-tensor "
                        "hooks); that region runs unchecked, exactly as without gradguard")
        yield
    finally:
        for pack, unpack in reversed(popped):
            torch._C._autograd._push_saved_tensors_default_hooks(pack, unpack)
            pack.__self__._stepped_aside = False


_PATCHES = SharedPatches(lambda: [(torch.autograd.graph, "disable_saved_tensors_hooks", _stepping_aside)])


def install(session) -> None:
    with _PATCHES.lock:
        _sessions.append(session)
        _PATCHES.acquire()


def uninstall(session) -> None:
    with _PATCHES.lock:
        kept = [s for s in _sessions if s is not session]
        for _ in range(len(_sessions) - len(kept)):
            _PATCHES.release()
        _sessions[:] = kept
