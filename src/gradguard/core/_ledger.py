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

__all__ = ["SavedLedger"]


class SavedLedger:
    """Thread-safe map: storage key -> weakly held records with byte ranges ``[start, end)``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_storage: dict[int, dict[int, tuple[weakref.ref, int, int]]] = {}
        self.backward_passes = 0  # distinct backward passes that unpacked something, as seen by the hooks
        self._last_pass_id: object = None

    def add(self, record, storage_key: int, start: int, end: int) -> None:
        rid = id(record)

        def _drop(_ref, storage_key=storage_key, rid=rid, ledger_ref=weakref.ref(self)):
            ledger = ledger_ref()
            if ledger is None:
                return
            with ledger._lock:
                bucket = ledger._by_storage.get(storage_key)
                if bucket is not None:
                    entry = bucket.get(rid)
                    if entry is not None and entry[0] is _ref:
                        del bucket[rid]
                    if not bucket:
                        del ledger._by_storage[storage_key]

        ref = weakref.ref(record, _drop)
        with self._lock:
            self._by_storage.setdefault(storage_key, {})[rid] = (ref, start, end)

    def overlapping(self, storage_key: int, start: int, end: int) -> list:
        """Live records whose memory overlaps ``[start, end)`` of the given storage."""
        with self._lock:
            bucket = self._by_storage.get(storage_key)
            if not bucket:
                return []
            entries = list(bucket.values())
        out = []
        for ref, s, e in entries:
            if s < end and start < e:
                record = ref()
                if record is not None:
                    out.append(record)
        return out

    def has_storage(self, storage_key: int) -> bool:
        return storage_key in self._by_storage

    def any_alive(self) -> bool:
        """Whether any record is alive (empty buckets are dropped when their last record dies)."""
        return bool(self._by_storage)

    def live_records(self) -> Iterator:
        with self._lock:
            entries = [entry for bucket in self._by_storage.values() for entry in bucket.values()]
        for ref, _s, _e in entries:
            record = ref()
            if record is not None:
                yield record

    def __len__(self) -> int:
        with self._lock:
            return sum(len(b) for b in self._by_storage.values())

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
