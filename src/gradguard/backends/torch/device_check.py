"""Saved tensors on a GPU: fingerprints compared on the device, one host read per backward pass.

# NOTE [No host sync per saved tensor]
# Comparing a device fingerprint at unpack needs its answer on the host (``torch.equal`` is a synchronisation:
# the CPU waits until the GPU has run everything queued before it). Doing that for every saved tensor, inside
# the autograd engine's backward, drains the launch queue hundreds of times per step. So on a device:
#   * pack takes the fingerprint in one launch and never waits for it (``device_sample``, fingerprint.py);
#   * unpack checks the version counter at once (a host integer: loud findings stay immediate), takes the
#     fingerprint again, and only queues the pair; it never waits either;
#   * when the backward pass ends (an autograd engine callback, before ``backward()`` returns and so before
#     any optimizer step can use the gradients), the queued pairs are compared in a few batched launches per
#     dtype, and one value is read on the host: the pass's "something changed" flag;
#   * only when that flag is set does gradguard look (with syncs) for which saved tensor changed, and raise
#     the same ``SilentModificationError`` as at unpack on a CPU.
# What the finding loses against a CPU tensor's: the error is raised at the end of the backward pass rather
# than inside the node that unpacked it, so the graph picture is not drawn; the saver node is still named.
# A saved tensor the node released before the end is not kept alive for this (the pass would hold every
# activation until its end): the finding then describes it from its shape and dtype.
"""

from __future__ import annotations

import torch

from ...core.engine import SavedRecord
from ...core.facts import Facts
from ...core.diagnosis import saves_running_stat
from .fingerprint import bits, same
from .graph import _unpacking_argument, node_name

__all__ = ["defer"]

_queue_callback = torch.autograd.Variable._execution_engine.queue_callback
_current_task = torch._C._current_graph_task_id
_current_node = torch._C._current_autograd_node
_MAX_PASSES = 8  # passes with queued pairs kept at once (nested backward passes; a pass that failed never flushes)


class _Pass:
    """The pairs one backward pass queued: (saved fingerprint, fingerprint now, the record or None, the saver node's
    name and argument, then, without the record, what rebuilds it: its class, version, place, rarely set fields, and
    the tensor's shape, dtype and device)."""

    __slots__ = ("task", "entries")

    def __init__(self, task: int):
        self.task = task
        self.entries: list = []


def defer(session, record, now) -> bool:
    """Queue the comparison of ``record``'s device fingerprint with ``now`` until backward ends. Returns False when
    it cannot be deferred (no backward pass running: compare now)."""
    # Once per saved tensor at unpack: the pass of the previous unpack is kept at hand, and a node's name per class
    # (NOTE [The pack and unpack hooks' own cost] in session.py).
    task = _current_task()
    if task < 0:
        return False
    pending = session.__dict__.get("_device_pass")
    if pending is None or pending.task != task:
        pending = _pass_of(session, task)
    unpacking = session._unpacking
    if unpacking is not None and unpacking[0] is record:  # the node the session's unpack has just asked for
        node, name = unpacking[1], unpacking[2]
    elif (node := _current_node()) is None:
        name = None
    else:
        name = node_name(node)
    argument = None
    if name is not None and "BatchNorm" in name:  # NOTE [Running stats saved in eval mode] (session.py)
        argument = _unpacking_argument(node, record)
        if saves_running_stat(name, argument) and getattr(node, "_saved_training", True) is not False:
            return True  # a training-mode BatchNorm's running stats: a change is allowed, nothing to compare
    # A leaf stays alive anyway, and the write log's records must keep their writes: keep the record. An
    # activation's record would keep its memory alive to the end of the pass: keep what the finding needs of it
    # (see _Pass), in the entry's own tuple (one object per entry: NOTE [Few objects per saved tensor]).
    if record.where.producer == "leaf" or session.track_writes or record.writes is not None:
        pending.entries.append((record.fp, now, record, name, argument))
    else:
        t = record.tensor
        pending.entries.append((record.fp, now, None, name, argument, type(record), record.version, record.where,
                                record._seldom, t.shape, t.dtype, t.device))
    return True


def _pass_of(session, task: int) -> _Pass:
    """The queue of backward pass ``task`` (made, with its end-of-pass callback, on the pass's first unpack)."""
    passes = session.__dict__.setdefault("_device_passes", {})
    pending = passes.get(task)
    if pending is None:
        if len(passes) >= _MAX_PASSES:
            passes.pop(next(iter(passes)))
        pending = passes[task] = _Pass(task)
        _queue_callback(lambda: _flush(session, task))
    session._device_pass = pending
    return pending


def _flush(session, task: int) -> None:
    """The end of one backward pass: compare its queued pairs with one host read; raise for the first changed."""
    pending = session.__dict__.get("_device_passes", {}).pop(task, None)
    if session.__dict__.get("_device_pass") is pending:
        session._device_pass = None
    if pending is None or not pending.entries:
        return
    entries, pending.entries = pending.entries, []
    changed = _changed(entries)
    if not changed:
        return
    entry = changed[0]
    old, record, name, argument = entry[0], entry[2], entry[3], entry[4]
    if record is None:  # released by backward: a stand-in record over one element expanded to the tensor's shape
        kind, version, where, seldom, shape, dtype, device = entry[5:]
        stand_in = SavedRecord.__new__(kind)
        stand_in.tensor = torch.empty((), dtype=dtype, device=device).expand(shape)
        stand_in.version, stand_in.fp = version, old
        stand_in.where, stand_in._seldom = where, seldom
        record = stand_in
    note = None
    if len(changed) > 1:
        note = f"{len(changed) - 1} more saved tensor(s) of this backward pass were also modified"
    facts = Facts(checked="at the end of the backward pass (device fingerprints are compared there, with one "
                          "host read per pass)")
    session.engine.raise_record(record, "silent_write", note=note, facts=facts, saver=(name, argument))


def _changed(entries: list) -> list:
    """The entries whose fingerprint changed. One host read when none did (the common case); more only then."""
    groups: dict = {}
    for entry in entries:
        old, now = entry[0], entry[1]
        dtype, shape = old.dtype, old.shape
        if dtype != now.dtype or shape != now.shape:  # another layout came back: changed, no read needed
            return [entry] + [e for e in entries if e is not entry and not same(e[0], e[1])]
        key = (old.device, dtype, shape[1:])  # torch.cat joins tensors alike but in their first dimension
        olds, nows = groups.setdefault(key, ([], []))
        olds.append(old)
        nows.append(now)
    flags: dict = {}  # device -> one flag per dtype
    with torch._C._DisableTorchDispatch():
        for (device, _dtype, _rest), (olds, nows) in groups.items():
            flags.setdefault(device, []).append(torch.ne(bits(torch.cat(olds)), bits(torch.cat(nows))).any())
        for per_dtype in flags.values():
            flag = per_dtype[0] if len(per_dtype) == 1 else torch.stack(per_dtype).any()  # one read per device
            if flag.item():  # the pass's single host read (one per device the pass saved on)
                return [entry for entry in entries if not same(entry[0], entry[1])]
    return []
