"""Framework entry points replaced while a guard needs them, and restored exactly as they were.

# NOTE [One way to patch]
# Several probes wrap a framework function for as long as at least one guard is active (torch's
# ``autograd.Function.apply``, the backward engine's entry, ``saved_tensors_hooks.__enter__``, Triton's
# launcher, Paddle's write entry points). They share three rules, kept here once:
# * restore what was there: a class attribute the class only inherited is restored by deleting ours,
#   so the class sees its base's attribute again, not a copy frozen at patch time;
# * patch once per process however many guards nest or run on threads (``SharedPatches`` counts holders;
#   the last release restores);
# * never break another library's patch: when someone replaced our wrapper after we installed it
#   (a profiler, a second debugging tool), restoring would silently drop theirs. Ours is left in place
#   (every wrapper passes calls through unchanged when no guard is active) and a log record says so.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from .internal import log_fallback

__all__ = ["Patch", "apply_patch", "restore_patch", "SharedPatches"]

_MISSING = object()


@dataclass(frozen=True)
class Patch:
    """One replaced attribute: where, what was there (``None`` when it was only inherited), and ours."""

    owner: Any
    name: str
    original: Any
    wrapper: Any
    own: bool  # the attribute was in ``owner.__dict__`` (or ``owner`` is not a class)


def _current(owner: Any, name: str) -> Any:
    """What ``owner`` holds under ``name`` itself (a class's own ``__dict__`` entry: no descriptor binding)."""
    return owner.__dict__.get(name, _MISSING) if isinstance(owner, type) else getattr(owner, name, _MISSING)


def apply_patch(owner: Any, name: str, wrap: Callable[[Any], Any]) -> Patch | None:
    """Replace ``owner.name`` by ``wrap(original)``; None (and a log record) when there is nothing to wrap.

    ``original`` is the attribute as found: the class's own entry, or the inherited one for a class that
    does not define it (then restoring deletes ours)."""
    own = _current(owner, name)
    original = own if own is not _MISSING else getattr(owner, name, _MISSING)
    if original is _MISSING:
        log_fallback("patching", f"finding {getattr(owner, '__name__', owner)!r}.{name} to wrap", AttributeError(name))
        return None
    wrapper = wrap(original)
    setattr(owner, name, wrapper)
    return Patch(owner, name, original, wrapper, own is not _MISSING or not isinstance(owner, type))


def restore_patch(patch: Patch) -> bool:
    """Put back what ``patch`` replaced. False (ours left in place, logged) when another patch sits on top."""
    if _current(patch.owner, patch.name) is not patch.wrapper:
        log_fallback("patching", f"restoring {getattr(patch.owner, '__name__', patch.owner)!r}.{patch.name}: another "
                     "library replaced gradguard's wrapper since; both are left in place (ours passes calls through)")
        return False
    if patch.own:
        setattr(patch.owner, patch.name, patch.original)
    else:
        delattr(patch.owner, patch.name)
    return True


class SharedPatches:
    """Patches held while at least one user holds them: installed by the first ``acquire``, restored by the
    last ``release`` (thread safe). ``targets()`` lists ``(owner, name, wrap)`` and is read at install time,
    so it may depend on what is imported then."""

    def __init__(self, targets: Callable[[], Iterable[tuple[Any, str, Callable[[Any], Any]]]]):
        self._targets = targets
        # held around acquire and release: a caller's own bookkeeping under it stays consistent with them
        self.lock = threading.RLock()
        self._holders = 0
        self._patches: list[Patch] = []

    @property
    def held(self) -> bool:
        return self._holders > 0

    def acquire(self) -> None:
        with self.lock:
            if self._holders == 0:
                self._install(self._targets())
            self._holders += 1

    def release(self) -> None:
        with self.lock:
            if self._holders == 0:
                return
            self._holders -= 1
            if self._holders == 0:
                for patch in reversed(self._patches):
                    restore_patch(patch)
                self._patches.clear()

    def add(self, owner: Any, name: str, wrap: Callable[[Any], Any]) -> bool:
        """Patch one more entry point now, while held (a library imported after the first guard started);
        undone with the rest. False when not held or already patched."""
        with self.lock:
            if not self._holders or any(p.owner is owner and p.name == name for p in self._patches):
                return False
            self._install([(owner, name, wrap)])
            return True

    def names(self) -> list[str]:
        return [p.name for p in self._patches]

    def _install(self, targets: Iterable[tuple[Any, str, Callable[[Any], Any]]]) -> None:
        for owner, name, wrap in targets:
            patch = apply_patch(owner, name, wrap)
            if patch is not None:
                self._patches.append(patch)
