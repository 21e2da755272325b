"""The ledger: which memory ranges are currently saved for backward, and what wrote into them; and the work a
weakref callback must not wait for (``DeferredUnderLock``), which the ledger and torch's second-order tracker share.

# NOTE [Matching writes by memory, not by Python identity]
# Views, ``.data``, NumPy and DLPack aliases are different Python objects (some with their own version
# counter) over the same memory. A write is matched to a saved tensor when it touches the same storage
# (by base address) and the byte ranges overlap.
#
# NOTE [Lifetime]
# The ledger holds only weak references. A record lives exactly as long as the autograd graph that
# holds it (the framework keeps what the pack hook returned), so the ledger never keeps a tensor alive.
#
# NOTE [A callback must never wait for a lock]
# A tracked object (a saved tensor's record, a create_graph leaf) can die while this thread holds the lock that
# guards its bookkeeping: the garbage collector runs inside any allocation, including the ones made under the
# lock, and frees a graph kept by a reference cycle; the weakref callbacks then run right there. Waiting for the
# lock would deadlock the user's program. A callback that cannot take the lock at once leaves its work in a
# ``DeferredUnderLock``; whoever holds the lock next does it first (``drain``).
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any, Callable, Iterator

if TYPE_CHECKING:
    from .engine import SavedRecord

__all__ = ["SavedLedger", "DeferredUnderLock"]


class DeferredUnderLock:
    """Work from weakref callbacks for the state ``lock`` guards (NOTE [A callback must never wait for a lock]):
    done now when the lock is free, else by the lock's next holder."""

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


# NOTE [A small entry per saved tensor]
# The ledger holds one entry per live saved tensor, so its size is paid per saved tensor for as long as the
# graph lives (issue 17's target: records within 0.2 KiB). An entry is one weak reference that carries its own
# storage key and byte range (a weakref subclass with slots); its callback is one object per ledger, which
# holds the ledger weakly; a storage's entries are the entry itself while it is the only one (most storages hold
# one saved tensor), else a plain list. Entries of one storage share one key object, and byte offsets are
# shared ints (``_shared_int``): a new int is 28-32 bytes, a saved tensor's range is usually one already seen.
# A closure, a (ref, start, end) tuple and a dict per storage took ~550 bytes per saved tensor; now 130-200
# (benchmarks/bench_records.py, forensic less sentinel).


class _Entry(weakref.ref["SavedRecord"]):
    """A weak reference to a record, with where its memory lies and its place in its storage's list."""

    __slots__ = ("key", "start", "end", "index")
    key: int
    start: int
    end: int
    index: int


class _DropFrom:
    """An entry's weakref callback: the record died (the graph holding it was freed), so remove its entry. Holds
    its ledger weakly: entries never keep the ledger alive. NOTE [A callback must never wait for a lock]."""

    __slots__ = ("ledger",)

    def __init__(self, ledger: "SavedLedger") -> None:
        self.ledger = weakref.ref(ledger)

    def __call__(self, entry: _Entry) -> None:
        ledger = self.ledger()
        if ledger is not None:
            ledger._deferred.run(ledger._remove, entry)


_SHARED_INTS: dict[int, int] = {}


def _shared_int(n: int) -> int:
    """One int object per value (bounded): byte offsets and sizes repeat across saved tensors."""
    if -5 <= n <= 256:  # CPython's own small ints
        return n
    found = _SHARED_INTS.get(n)
    if found is None:
        if len(_SHARED_INTS) >= 4096:
            _SHARED_INTS.clear()
        found = _SHARED_INTS[n] = n
    return found


def _entries(bucket: _Entry | list[_Entry]) -> list[_Entry]:
    return bucket if isinstance(bucket, list) else [bucket]


class SavedLedger:
    """Thread-safe map: storage key -> weakly held records with byte ranges ``[start, end)``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_storage: dict[int, _Entry | list[_Entry]] = {}
        self._drop = _DropFrom(self)  # every entry's callback
        self._deferred = DeferredUnderLock(self._lock)  # removals whose callbacks found the lock taken
        self.backward_passes = 0  # distinct backward passes that unpacked something, as seen by the hooks
        self.last_pass_id: object = None  # the framework id of the latest such pass (a probe may compare it first)

    def add(self, record: SavedRecord, storage_key: int, start: int, end: int) -> None:
        entry = _Entry(record, self._drop)
        entry.start, entry.end = _shared_int(start), _shared_int(end)
        with self._lock:
            self._deferred.drain()
            bucket = self._by_storage.get(storage_key)
            if bucket is None:
                entry.key = storage_key
                self._by_storage[storage_key] = entry
            elif isinstance(bucket, list):
                entry.key = bucket[0].key
                entry.index = _shared_int(len(bucket))
                bucket.append(entry)
            else:
                entry.key = bucket.key
                bucket.index, entry.index = 0, 1
                self._by_storage[storage_key] = [bucket, entry]

    def overlapping(self, storage_key: int, start: int, end: int) -> list[SavedRecord]:
        """Live records whose memory overlaps ``[start, end)`` of the given storage."""
        with self._lock:
            self._deferred.drain()
            bucket = self._by_storage.get(storage_key)
            if not bucket:
                return []
            entries = list(_entries(bucket))
        out = []
        for entry in entries:
            if entry.start < end and start < entry.end:
                record = entry()
                if record is not None:
                    out.append(record)
        return out

    def _remove(self, entry: _Entry) -> None:
        """Drop ``entry`` (lock held); absent already is fine. O(1): the last entry of its storage's list takes
        its place (100k saved views of one storage were freed in quadratic time by a scan)."""
        bucket = self._by_storage.get(entry.key)
        if bucket is entry:
            del self._by_storage[entry.key]
        elif isinstance(bucket, list):
            i = getattr(entry, "index", None)
            if i is None or i >= len(bucket) or bucket[i] is not entry:
                return
            last = bucket.pop()
            if last is not entry:
                bucket[i] = last
                last.index = i
            if len(bucket) == 1:
                self._by_storage[entry.key] = bucket[0]

    def has_storage(self, storage_key: int) -> bool:
        self._deferred.settle()
        return storage_key in self._by_storage

    def any_alive(self) -> bool:
        """Whether any record is alive (empty buckets are dropped when their last record dies)."""
        self._deferred.settle()
        return bool(self._by_storage)

    def _all_entries(self) -> list[_Entry]:
        with self._lock:
            self._deferred.drain()
            return [entry for bucket in self._by_storage.values() for entry in _entries(bucket)]

    def live_records(self) -> Iterator[SavedRecord]:
        for entry in self._all_entries():
            record = entry()
            if record is not None:
                yield record

    def storage_key_of(self, record: SavedRecord) -> int | None:
        """The storage key ``record`` was saved under (a scan: for building a finding, never per tensor)."""
        return next((entry.key for entry in self._all_entries() if entry() is record), None)

    def __len__(self) -> int:
        with self._lock:
            self._deferred.drain()
            return sum(len(_entries(b)) for b in self._by_storage.values())

    def note_backward_pass(self, pass_id: object) -> bool:
        """Count distinct backward passes (by the framework's graph-task id); True when ``pass_id`` is new."""
        if pass_id == self.last_pass_id:
            return False
        with self._lock:
            if pass_id == self.last_pass_id:
                return False
            self.last_pass_id = pass_id
            self.backward_passes += 1
            return True
