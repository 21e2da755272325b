"""The ledger: which memory ranges are currently saved for backward, and what wrote into them.

# NOTE [Matching writes by memory, not by Python identity]
# Views, ``.data``, NumPy and DLPack aliases are different Python objects (some with their own version
# counter) over the same memory. A write is matched to a saved tensor when it touches the same storage
# (by base address) and the byte ranges overlap.
#
# NOTE [Lifetime]
# The ledger holds only weak references. A record lives exactly as long as the autograd graph that
# holds it (the framework keeps what the pack hook returned), so the ledger never keeps a tensor alive.
"""

from __future__ import annotations

import threading
import weakref
from typing import Iterator

from ._deferred import DeferredUnderLock

__all__ = ["SavedLedger"]


# NOTE [A small entry per saved tensor]
# The ledger holds one entry per live saved tensor, so its size is paid per saved tensor for as long as the
# graph lives (issue 17's target: records within 0.2 KiB). An entry is one weak reference that carries its own
# storage key and byte range (a weakref subclass with slots), its callback is one module-level function, and a
# storage's entries are the entry itself while it is the only one (most storages hold one saved tensor), else a
# plain list. A closure, a (ref, start, end) tuple and a dict per storage took ~250 bytes per saved tensor.


class _Entry(weakref.ref):
    """A weak reference to a record, with where its memory lies and the ledger to drop it from."""

    __slots__ = ("ledger", "key", "start", "end")


def _drop(entry: _Entry) -> None:
    """The record died: remove its entry (the graph holding it was freed). NOTE [A callback must never wait for
    a lock] (core/_deferred.py)."""
    ledger = entry.ledger()
    if ledger is not None:
        ledger._deferred.run(ledger._remove, entry)


def _entries(bucket) -> list[_Entry]:
    return bucket if isinstance(bucket, list) else [bucket]


class SavedLedger:
    """Thread-safe map: storage key -> weakly held records with byte ranges ``[start, end)``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_storage: dict[int, _Entry | list[_Entry]] = {}
        self._self_ref = weakref.ref(self)  # shared by every entry: the ledger is never kept alive by them
        self._deferred = DeferredUnderLock(self._lock)  # removals whose callbacks found the lock taken
        self.backward_passes = 0  # distinct backward passes that unpacked something, as seen by the hooks
        self._last_pass_id: object = None

    def add(self, record, storage_key: int, start: int, end: int) -> None:
        entry = _Entry(record, _drop)
        entry.ledger, entry.key, entry.start, entry.end = self._self_ref, storage_key, start, end
        with self._lock:
            self._deferred.drain()
            bucket = self._by_storage.get(storage_key)
            if bucket is None:
                self._by_storage[storage_key] = entry
            elif isinstance(bucket, list):
                bucket.append(entry)
            else:
                self._by_storage[storage_key] = [bucket, entry]

    def overlapping(self, storage_key: int, start: int, end: int) -> list:
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
        """Drop ``entry`` (lock held); absent already is fine."""
        bucket = self._by_storage.get(entry.key)
        if bucket is entry:
            del self._by_storage[entry.key]
        elif isinstance(bucket, list):
            for i, other in enumerate(bucket):
                if other is entry:
                    del bucket[i]
                    break
            if len(bucket) == 1:
                self._by_storage[entry.key] = bucket[0]
            elif not bucket:
                del self._by_storage[entry.key]

    def has_storage(self, storage_key: int) -> bool:
        self._deferred.settle()
        return storage_key in self._by_storage

    def any_alive(self) -> bool:
        """Whether any record is alive (empty buckets are dropped when their last record dies)."""
        self._deferred.settle()
        return bool(self._by_storage)

    def live_records(self) -> Iterator:
        with self._lock:
            self._deferred.drain()
            entries = [entry for bucket in self._by_storage.values() for entry in _entries(bucket)]
        for entry in entries:
            record = entry()
            if record is not None:
                yield record

    def __len__(self) -> int:
        with self._lock:
            self._deferred.drain()
            return sum(len(_entries(b)) for b in self._by_storage.values())

    def note_backward_pass(self, pass_id: object) -> bool:
        """Count distinct backward passes (by the framework's graph-task id); True when ``pass_id`` is new."""
        if pass_id == self._last_pass_id:
            return False
        with self._lock:
            if pass_id == self._last_pass_id:
                return False
            self._last_pass_id = pass_id
            self.backward_passes += 1
            return True
