"""core/ledger.py: which saved memory is alive, found by storage and byte range, held weakly."""

from __future__ import annotations

import gc
import weakref

from gradguard.core.ledger import SavedLedger


class Record:
    """Stands in for a SavedRecord: the ledger only needs something weakly referenceable."""

    def __init__(self, name):
        self.name = name


def _names(records):
    return sorted(r.name for r in records)


def test_overlap_is_by_storage_and_byte_range():
    ledger = SavedLedger()
    a, b, c = Record("a"), Record("b"), Record("c")
    ledger.add(a, 1, 0, 64)
    ledger.add(b, 1, 64, 128)  # a sibling view of the same storage
    ledger.add(c, 2, 0, 64)
    assert _names(ledger.overlapping(1, 0, 8)) == ["a"]
    assert _names(ledger.overlapping(1, 60, 70)) == ["a", "b"]
    assert _names(ledger.overlapping(1, 128, 256)) == []  # touching the end is not overlapping
    assert _names(ledger.overlapping(2, 0, 1)) == ["c"]
    assert ledger.overlapping(3, 0, 64) == []
    assert len(ledger) == 3 and _names(ledger.live_records()) == ["a", "b", "c"]


def test_entries_go_with_their_records_in_any_order():
    ledger = SavedLedger()
    records = [Record(str(i)) for i in range(3)]
    for record in records:
        ledger.add(record, 7, 0, 64)
    del record  # the loop variable would keep the last one alive
    del records[1]  # the middle one of three on one storage
    gc.collect()
    assert _names(ledger.overlapping(7, 0, 64)) == ["0", "2"] and ledger.has_storage(7)
    del records[0]
    gc.collect()
    assert _names(ledger.overlapping(7, 0, 64)) == ["2"]
    ledger.add(Record("late"), 7, 0, 64)  # dies at once: nothing holds it
    gc.collect()
    assert _names(ledger.overlapping(7, 0, 64)) == ["2"]
    records.clear()
    gc.collect()
    assert not ledger.has_storage(7) and not ledger.any_alive() and len(ledger) == 0


def test_the_ledger_keeps_neither_records_nor_itself_alive():
    ledger = SavedLedger()
    record = Record("r")
    ledger.add(record, 1, 0, 8)
    dead_record = weakref.ref(record)
    del record
    assert dead_record() is None  # refcount alone frees it: no cycle through the ledger
    ledger.add(keep := Record("k"), 1, 0, 8)
    dead_ledger = weakref.ref(ledger)
    del ledger
    assert dead_ledger() is None
    del keep  # its entry's callback finds no ledger and does nothing


def test_a_record_dying_while_the_lock_is_held_never_deadlocks():
    # The garbage collector can free a record inside an allocation the ledger makes under its own lock; the weakref
    # callback then runs on this thread with the lock taken. It must not wait for it (NOTE in core/ledger.py).
    import threading

    ledger = SavedLedger()
    keep, doomed = Record("keep"), Record("doomed")
    ledger.add(keep, 1, 0, 64)
    ledger.add(doomed, 1, 0, 64)
    ledger.add(lone := Record("lone"), 2, 0, 64)
    finished = threading.Event()

    def die_under_the_lock():
        nonlocal doomed, lone
        with ledger._lock:
            doomed = lone = None  # both callbacks run here, synchronously, with the lock held
        finished.set()

    worker = threading.Thread(target=die_under_the_lock, daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert finished.is_set(), "the weakref callback waited for the ledger's lock (deadlock)"
    assert _names(ledger.overlapping(1, 0, 64)) == ["keep"]  # the deferred removal happened first
    assert not ledger.has_storage(2) and len(ledger) == 1 and not ledger._deferred.pending
