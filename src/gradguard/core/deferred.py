"""Bookkeeping a weakref callback must not wait for: done now when its lock is free, else by the lock's next holder.

# NOTE [A callback must never wait for a lock]
# A tracked object (a saved tensor's record, a create_graph leaf) can die while this thread holds the lock that
# guards its bookkeeping: the garbage collector runs inside any allocation, including the ones made under the
# lock, and frees a graph kept by a reference cycle; the weakref callbacks then run right there. Waiting for the
# lock would deadlock the user's program. A callback that cannot take the lock at once leaves its work here;
# whoever holds the lock next does it first (``drain``).
"""

from __future__ import annotations

import threading
from typing import Any, Callable

__all__ = ["DeferredUnderLock"]


class DeferredUnderLock:
    """Work from weakref callbacks for the state ``lock`` guards (see NOTE above)."""

    __slots__ = ("lock", "_pending")

    def __init__(self, lock: threading.Lock) -> None:
        self.lock = lock
        self._pending: list[tuple[Callable[[Any], None], Any]] = []

    def run(self, work: Callable[[Any], None], arg: Any) -> None:
        """From a weakref callback: ``work(arg)`` under the lock if it is free, else by its next holder."""
        if not self.lock.acquire(blocking=False):
            self._pending.append((work, arg))  # atomic under the GIL
            return
        try:
            work(arg)
        finally:
            self.lock.release()

    def drain(self) -> None:
        """Do what callbacks left behind (the caller holds the lock)."""
        while self._pending:
            work, arg = self._pending.pop()
            work(arg)

    def settle(self) -> None:
        """``drain`` for a reader that does not hold the lock (a no-op, without locking, when nothing is left)."""
        if self._pending:
            with self.lock:
                self.drain()

    @property
    def pending(self) -> bool:
        return bool(self._pending)
