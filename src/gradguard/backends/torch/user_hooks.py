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

Where the guard cannot watch, it steps aside for that region, says so in one line, and the program runs
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

``guard(sample_steps=N)``: the saved-tensor hooks are on for one backward cycle in N, off otherwise (``Cycles``).

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

What differs between the torch releases gradguard supports (pyproject: torch>=2.4,<2.16), in one place
(``TOP_HOOKS`` ... ``probe_attribute`` below).

# NOTE [torch 2.4: saved tensors cannot be read back without unpacking]
# From torch 2.5 ``SavedTensor.data`` returns what the pack hook returned, so a graph node's saved arguments
# can be matched to gradguard's records without unpacking (``graph.iter_saved``). torch 2.4's SavedTensor
# has only ``register_hooks``: the record is found by reading ``node._saved_<name>`` once, which calls the
# unpack hook; while ``probe_attribute`` runs, the session's unpack hands back the tensor unchecked and notes
# which record it was given.
#
# NOTE [torch 2.4: the user's saved-tensor hooks cannot be listed]
# ``torch._C._autograd._top_saved_tensors_default_hooks`` (torch >= 2.5) lets a guard entered inside the user's
# hooks call them from its own. torch 2.4 has no way to get them back, only to know that some are active
# (disabling saved-tensor hooks raises while any are on the stack). A guard entered inside the user's hooks on
# torch 2.4 therefore steps aside for saved tensors (one NotWatched line) instead of replacing the user's
# hooks, which would change the gradients.
#
# NOTE [torch 2.4: Dynamo traces saved-tensor hooks]
# From torch 2.5 Dynamo switches saved-tensor hooks off while it traces; torch 2.4 traces into them, and
# tracing the guard's pack hook fails inside Dynamo (an assertion in symbolic_convert). On torch 2.4 the pack
# hook returns the tensor untouched while ``torch.compiler.is_compiling()`` (True only during tracing).
#
# NOTE [torch 2.14: Function.apply is a C method]
# ``torch.autograd.Function.apply`` became a ``classmethod_descriptor``; _attribution wraps it through its
# descriptor protocol (works on every version).
"""

from __future__ import annotations

import contextlib
import functools
import threading

import torch
from torch.autograd.graph import saved_tensors_hooks

from ..._errors import NotWatched
from ...core.frames import notice
from ...core.patching import SharedPatches

__all__ = ["install", "uninstall", "top_hooks", "mark", "guard_hooks_on_top", "not_watched", "unreadable_layout",
           "guard_pack", "Cycles", "GATE_CALLS", "TOP_HOOKS", "SAVED_TENSOR_DATA", "DYNAMO_TRACES_HOOKS",
           "saved_tensors_hooks_active", "probe_attribute", "probing_unpack"]

TOP_HOOKS = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)  # torch >= 2.5
SAVED_TENSOR_DATA = hasattr(torch._C._autograd.SavedTensor, "data")  # torch >= 2.5
DYNAMO_TRACES_HOOKS = tuple(int(part) for part in torch.__version__.split(".")[:2]) < (2, 5)
# The write log's call gate (writes.py) is a TorchFunctionMode; Dynamo traces such modes from torch 2.5.
# On torch 2.4 the write log keeps its op stream on for the whole guard.
GATE_CALLS = not DYNAMO_TRACES_HOOKS


def saved_tensors_hooks_active() -> bool:
    """Whether any saved-tensor hooks are active on this thread (any torch version)."""
    autograd = torch._C._autograd
    if TOP_HOOKS is not None:
        return TOP_HOOKS(False) is not None
    previous = autograd._saved_tensors_hooks_get_disabled_error_message()
    try:
        autograd._saved_tensors_hooks_disable("gradguard: probing for active saved-tensor hooks")
    except RuntimeError:
        return True
    finally:
        if previous is None:
            autograd._saved_tensors_hooks_enable()
        else:
            autograd._saved_tensors_hooks_disable(previous)
    return False


_probe = threading.local()


def probing_unpack(record) -> bool:
    """Called first by the session's unpack hooks: True while ``probe_attribute`` reads a node (record noted)."""
    seen = getattr(_probe, "seen", None)
    if seen is None:
        return False
    seen.append(record)
    return True


def probe_attribute(obj, attribute: str) -> list:
    """The pack hook's return values for the saved tensors that reading ``obj.<attribute>`` unpacks (torch 2.4:
    a graph node's ``_saved_x``, a custom Function's ``saved_tensors``)."""
    _probe.seen = []
    try:
        getattr(obj, attribute)
    finally:
        seen, _probe.seen = _probe.seen, None
    return seen

_sessions: list = []  # (session, thread id), innermost last


def mark(fn):
    """Mark ``fn`` as one of gradguard's hooks (never wrapped, never composed with)."""
    fn._gradguard_hook = True
    return fn


def _ours(fn) -> bool:
    return getattr(fn, "_gradguard_hook", False) or type(getattr(fn, "__self__", None)).__name__ == "TorchGuardSession"


def top_hooks():
    """The user's (pack, unpack) active on this thread, or None (none, gradguard's own, or torch < 2.5)."""
    if TOP_HOOKS is None:  # torch 2.4: see NOTE above
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
            and not getattr(session, "_stepped_aside", False))  # popped inside a torch.func transform


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
        self._gradguard_session = session  # counted: torch 2.4 cannot show the stack (_stepping_aside_of_guards)
        session._user_hook_depth = getattr(session, "_user_hook_depth", 0) + 1

    return __enter__


def _exiting(original_exit):
    def __exit__(self, *exc_info):
        session = self.__dict__.pop("_gradguard_session", None)
        if session is not None:
            session._user_hook_depth -= 1
        return original_exit(self, *exc_info)

    return __exit__


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
        session = _sessions[-1][0] if _sessions else None
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


_PATCHES = SharedPatches(lambda: [(saved_tensors_hooks, "__enter__", _entering),
                                  (saved_tensors_hooks, "__exit__", _exiting),
                                  (torch.autograd.graph, "disable_saved_tensors_hooks", _stepping_aside)])


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


# -- the sampled guard (NOTE [Sampled guard]) ----------------------------------------------------------------
_lock = threading.Lock()  # guards _active and _ended
_active: list["Cycles"] = []
_local = threading.local()  # depth of backward calls on this thread (a backward inside a backward is one cycle)
_ended = 0  # backward cycles ended under a sampled guard in this process


def _wrap(original):
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


_CYCLE_PATCHES = SharedPatches(lambda: [(torch.autograd, "backward", _wrap), (torch.autograd, "grad", _wrap)])


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
                _CYCLE_PATCHES.acquire()
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
                _CYCLE_PATCHES.release()
        # paused: the session's hooks are already off the stack (session._hooks is None), nothing to pop

    def switch(self, on: bool) -> None:
        session = self.session
        forward_hooks = session._forward_hooks  # the sentinel's module hooks cost per module call: off with the rest
        if forward_hooks is not None:
            forward_hooks.install() if on else forward_hooks.uninstall()
        if not on:  # not while someone else's hooks are above ours: removing ours would remove theirs
            if (self._paused is None and session._hooks is not None and guard_hooks_on_top()
                    and _innermost_session() is session):
                hooks = session._hooks
                hooks.__exit__(None, None, None)
                session._hooks, self._paused = None, hooks
            return
        if self._paused is not None:
            if top_hooks() is not None:  # the user's own hooks entered meanwhile: stay off
                return
            hooks, self._paused = self._paused, None
            hooks.__enter__()
            session._hooks = hooks
        self.sampled += 1
