"""From a recorded step to candidates: the safety rules, one by one, and the peak-memory simulation.

A candidate is an out-of-place op (with an in-place overload in aten) whose operand could be overwritten.
Each rule below has a code; a candidate is safe only if no rule fires. The rules, in the order reported:

  leaf_requires_grad     the operand is a leaf that requires grad (PyTorch raises on an in-place write)
  autograd_view          the operand is a view autograd forbids writing in place (multi-output / no_grad views)
  outlives_step          the operand existed before the step (parameter, batch, buffer) or is still
                         referenced after it: overwriting it changes data the caller sees
  saved_for_backward     autograd saved the operand's memory for backward (this op or another)
  needed_by_optimizer    the optimizer reads the operand's memory later (a .grad, optimizer state)
  used_later             a later op of the step reads the operand's memory (through it or a view)
  aliased_by_live_view   a view sharing the operand's memory is still alive after the step
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.findings import SourceLocation
from .trace import OpRecord, StepMode

__all__ = ["Candidate", "Rejection", "UnsafeInplace", "analyse", "simulate_peak", "RULES"]

RULES = (
    "leaf_requires_grad",
    "autograd_view",
    "outlives_step",
    "saved_for_backward",
    "needed_by_optimizer",
    "used_later",
    "aliased_by_live_view",
)


@dataclass
class Rejection:
    code: str
    detail: str


@dataclass
class Candidate:
    op: OpRecord
    operand: int  # 0 = self, 1 = other (add/mul only)
    sid: int
    out_sid: int
    nbytes: int
    reasons: list[Rejection] = field(default_factory=list)
    claimed_peak_saving: int = 0

    @property
    def safe(self) -> bool:
        return not self.reasons

    @property
    def location(self) -> SourceLocation | None:
        return self.op.location


@dataclass
class UnsafeInplace:
    """An in-place write the step performs that breaks gradients."""

    kind: str  # "raises" (PyTorch's version check fires at backward) | "silent" (no version bump: wrong grads)
    op: str
    location: SourceLocation | None
    saved_by: str | None
    saved_at: SourceLocation | None
    detail: str


def _where(loc: SourceLocation | None) -> str:
    return loc.short if loc is not None else "?"


def _readers(mode: StepMode) -> dict[int, list[OpRecord]]:
    readers: dict[int, list[OpRecord]] = {}
    for op in mode.ops:
        for sid in set(op.in_sids):
            if sid is not None:
                readers.setdefault(sid, []).append(op)
    return readers


def _grad_sids(mode: StepMode) -> set[int]:
    out = set()
    for leaf in mode.leaves:
        g = leaf.grad
        if g is not None:
            sid = mode.sid_of(g)
            if sid is not None:
                out.add(sid)
    return out


def _saves_by_sid(mode: StepMode) -> dict[int, list]:
    saves_by_sid: dict[int, list] = {}
    for s in mode.saves:
        if s.sid is not None:
            saves_by_sid.setdefault(s.sid, []).append(s)
    return saves_by_sid


def _candidate_sid(op: OpRecord, position: int, out_sid: int) -> int | None:
    """The storage of ``op``'s operand at ``position`` if an in-place form could overwrite it, else None."""
    if position >= len(op.in_sids):
        return None
    sid = op.in_sids[position]
    if sid is None or sid == out_sid:
        return None
    if op.in_shapes[position] != op.out_shapes[0] or op.in_dtypes[position] != op.out_dtypes[0]:
        return None  # broadcasting or type promotion: no in-place form exists
    if op.in_overlap[position]:
        return None
    if position == 1 and op.in_sids[0] == sid:
        return None
    return sid


def _out_sid(mode: StepMode, op: OpRecord) -> int | None:
    """The single new output storage of a forward op, or None when the op is no candidate."""
    if op.phase != "forward" or not op.in_refs or len(op.out_sids) != 1:
        return None
    out_sid = op.out_sids[0]
    if out_sid is None or out_sid in mode.preexisting or not op.out_shapes:
        return None
    return out_sid


def analyse(mode: StepMode) -> tuple[list[Candidate], list[UnsafeInplace]]:
    """Candidates (each with its rejection reasons, empty when safe) and the unsafe in-place writes."""
    readers = _readers(mode)
    saves_by_sid = _saves_by_sid(mode)
    grad_sids = _grad_sids(mode)
    alive_end = mode.alive_sids_at_end or set()
    candidates: list[Candidate] = []
    for op in mode.ops:
        out_sid = _out_sid(mode, op)
        if out_sid is None:
            continue
        operands = [0, 1] if op.swappable else [0]
        for position in operands:
            sid = _candidate_sid(op, position, out_sid)
            if sid is None:
                continue
            cand = Candidate(op, position, sid, out_sid, mode.sizes.get(out_sid, 0))
            cand.reasons = _reasons(mode, op, position, sid, readers, saves_by_sid, grad_sids, alive_end)
            candidates.append(cand)
    # One operand per op: prefer a safe one (self first).
    chosen: dict[int, Candidate] = {}
    for cand in candidates:
        prev = chosen.get(cand.op.index)
        if prev is None or (not prev.safe and cand.safe):
            chosen[cand.op.index] = cand
    result = sorted(chosen.values(), key=lambda c: c.op.index)
    safe = [c for c in result if c.safe]
    base = simulate_peak(mode.events, [])
    for c in safe:
        c.claimed_peak_saving = base - simulate_peak(mode.events, [(c.sid, c.out_sid)])
    return result, _unsafe(mode)


def _reasons(mode, op, position, sid, readers, saves_by_sid, grad_sids, alive_end) -> list[Rejection]:
    out = _operand_reasons(mode, op, position, sid)
    saves = saves_by_sid.get(sid, [])
    if saves:
        s = saves[0]
        own = any(x.after_op == op.index for x in saves)
        who = "this op saves it" if own else f"saved by {s.node or '?'} at {_where(s.location)}"
        out.append(Rejection("saved_for_backward", f"autograd needs the operand for backward ({who})"))
    out += _later_reasons(op, sid, readers, grad_sids)
    if sid in alive_end and sid not in mode.preexisting:
        view_alive = bool(op.view_alive_end) and op.view_alive_end[position]
        if view_alive or not (op.in_alive_end and op.in_alive_end[position]):
            out.append(Rejection("aliased_by_live_view",
                                 "another tensor sharing the operand's memory (a view) is alive after the step"))
        else:
            out.append(Rejection("outlives_step", "the operand is still referenced after the step"))
    return out


def _operand_reasons(mode, op, position, sid) -> list[Rejection]:
    """The rules on the operand itself: leaf_requires_grad, autograd_view, outlives_step (pre-existing)."""
    out: list[Rejection] = []
    if op.in_leaf_rg[position] and op.grad_enabled:
        out.append(Rejection("leaf_requires_grad",
                             "the operand is a leaf tensor that requires grad: PyTorch raises on an in-place write"))
    meta = op.in_view_meta[position]
    if meta is not None and meta != "DEFAULT":
        out.append(Rejection("autograd_view",
                             f"the operand is a view autograd forbids modifying in place (creation: {meta})"))
    if sid in mode.preexisting:
        out.append(Rejection("outlives_step",
                             "the operand's memory existed before the step (an input, parameter or buffer)"))
    return out


def _later_reasons(op, sid, readers, grad_sids) -> list[Rejection]:
    """The rules on later reads: needed_by_optimizer, used_later."""
    out: list[Rejection] = []
    later = [r for r in readers.get(sid, []) if r.index > op.index]
    opt_readers = [r for r in later if r.phase == "optimizer"]
    if opt_readers or sid in grad_sids:
        what = f"read by {opt_readers[0].name} in optimizer.step()" if opt_readers else "it is a .grad"
        out.append(Rejection("needed_by_optimizer", f"the optimizer needs the operand's memory ({what})"))
    # Backward reads the operand's memory only through saved tensors: the saved_for_backward rule says that.
    other = [r for r in later if r.phase == "forward"]
    if other:
        r = other[0]
        where = f"at {_where(r.location)}"
        out.append(Rejection("used_later", f"read later by {r.name} {where}"
                                            + (f" (+{len(other) - 1} more)" if len(other) > 1 else "")))
    return out


def _unsafe(mode: StepMode) -> list[UnsafeInplace]:
    out: list[UnsafeInplace] = []
    seen = set()
    for s in mode.saves:
        writes = s.raising_writes if s.unpacked_version_mismatch else s.silent_writes
        if not writes:
            continue
        w = writes[0]
        key = (w.index, s.after_op)
        if key in seen:
            continue
        seen.add(key)
        kind = "raises" if s.unpacked_version_mismatch else "silent"
        consequence = ("PyTorch raises 'modified by an inplace operation' at backward" if kind == "raises"
                       else "the version counter did not move: PyTorch computes wrong gradients silently")
        out.append(UnsafeInplace(
            kind=kind, op=w.op, location=w.location, saved_by=s.node, saved_at=s.location,
            detail=f"{w.op} at {_where(w.location)} overwrites memory that {s.node or '?'} at "
                   f"{_where(s.location)} saved for backward; {consequence}",
        ))
    return out


def simulate_peak(events: list[tuple], merges: list[tuple[int, int]]) -> int:
    """Peak live bytes if each (operand_sid, out_sid) pair shared one storage (the out is never allocated).

    The shared storage lives from the operand's allocation until the last member is freed.
    """
    parent: dict[int, int] = {}

    def root(x: int) -> int:
        while parent.get(x, x) != x:
            x = parent[x]
        return x

    for keep, gone in merges:
        parent[root(gone)] = root(keep)
    sizes: dict[int, int] = {}
    for e in events:
        if e[0] == "a":
            sizes[e[1]] = e[2]
    members_alive: dict[int, int] = {}
    live = peak = 0
    for e in events:
        sid = e[1]
        r = root(sid)
        if e[0] == "a":
            n = members_alive.get(r, 0)
            if n == 0:
                live += sizes.get(r, e[2])
                peak = max(peak, live)
            members_alive[r] = n + 1
        else:
            n = members_alive.get(r, 0) - 1
            members_alive[r] = n
            if n == 0:
                live -= sizes.get(r, sizes.get(sid, 0))
    return peak
