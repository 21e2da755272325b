"""From a recorded PyTorch step to candidates: the tests of the safety rules (the table and the judge that applies
them: ``pipeline.py``), the unsafe in-place writes, and the peak-memory simulation.

A candidate is an out-of-place op (with an in-place overload in aten) whose operand could be overwritten; it is
safe only if no rule fires.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.findings import SourceLocation
from . import pipeline
from .pipeline import RULES
from .report import UnsafeInplaceOp
from .trace import OpRecord, StepMode

__all__ = ["Candidate", "analyse", "simulate_peak", "RULES"]


@dataclass
class Candidate(pipeline.Candidate):
    op: OpRecord
    operand: int  # 0 = self, 1 = other (add/mul only)
    sid: int
    out_sid: int
    nbytes: int
    reasons: list = field(default_factory=list)  # (rule code, detail)
    claimed_peak_saving: int = 0

    site = property(lambda self: self.op.index)
    key = property(lambda self: self.op.key)
    op_name = property(lambda self: self.op.name)
    shape = property(lambda self: self.op.out_shapes[0])
    location = property(lambda self: self.op.location)


def _where(loc: SourceLocation | None) -> str:
    return loc.short if loc is not None else "?"


def _candidate_sid(op: OpRecord, position: int, out_sid: int) -> int | None:
    """The storage of ``op``'s operand at ``position`` if an in-place form could overwrite it, else None."""
    if position >= len(op.in_sids):
        return None
    sid = op.in_sids[position]
    # a different shape or dtype (broadcasting, type promotion): no in-place form exists
    if (sid is None or sid == out_sid or op.in_shapes[position] != op.out_shapes[0]
            or op.in_dtypes[position] != op.out_dtypes[0] or op.in_overlap[position]
            or (position == 1 and op.in_sids[0] == sid)):
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


def analyse(mode: StepMode) -> tuple[list[Candidate], list[UnsafeInplaceOp]]:
    """Candidates (each with its rejection reasons, empty when safe) and the unsafe in-place writes."""
    candidates: list[Candidate] = []
    for op in mode.ops:
        out_sid = _out_sid(mode, op)
        if out_sid is None:
            continue
        for position in [0, 1] if op.swappable else [0]:
            sid = _candidate_sid(op, position, out_sid)
            if sid is not None:
                candidates.append(Candidate(op, position, sid, out_sid, mode.sizes.get(out_sid, 0)))
    result = pipeline.judge(candidates, _rule_tests(mode), keep_rejected=False)
    base = simulate_peak(mode.events, [])
    for c in result:
        if c.safe:
            c.claimed_peak_saving = base - simulate_peak(mode.events, [(c.sid, c.out_sid)])
    return result, _unsafe(mode)


def _rule_tests(mode: StepMode) -> list:
    """PyTorch's test of each rule, in report order: test(candidate) -> the detail when the rule fires, else None."""
    readers: dict[int, list[OpRecord]] = {}
    for op in mode.ops:
        for sid in set(op.in_sids) - {None}:
            readers.setdefault(sid, []).append(op)
    saves_by_sid: dict[int, list] = {}
    for s in mode.saves:
        if s.sid is not None:
            saves_by_sid.setdefault(s.sid, []).append(s)
    grad_sids = {mode.sid_of(leaf.grad) for leaf in mode.leaves if leaf.grad is not None} - {None}
    alive_end = mode.alive_sids_at_end or set()

    def leaf(c):
        if c.op.in_leaf_rg[c.operand] and c.op.grad_enabled:
            return "the operand is a leaf tensor that requires grad: PyTorch raises on an in-place write"

    def view(c):
        meta = c.op.in_view_meta[c.operand]
        if meta is not None and meta != "DEFAULT":
            return f"the operand is a view autograd forbids modifying in place (creation: {meta})"

    def preexisting(c):
        if c.sid in mode.preexisting:
            return "the operand's memory existed before the step (an input, parameter or buffer)"

    def saved(c):
        saves = saves_by_sid.get(c.sid, [])
        if saves:
            own = any(x.after_op == c.op.index for x in saves)
            who = "this op saves it" if own else f"saved by {saves[0].node or '?'} at {_where(saves[0].location)}"
            return f"autograd needs the operand for backward ({who})"

    def later(c, phase):
        return [r for r in readers.get(c.sid, []) if r.index > c.op.index and r.phase == phase]

    def optimizer(c):
        opt_readers = later(c, "optimizer")
        if opt_readers or c.sid in grad_sids:
            what = f"read by {opt_readers[0].name} in optimizer.step()" if opt_readers else "it is a .grad"
            return f"the optimizer needs the operand's memory ({what})"

    def used_later(c):  # backward reads the operand's memory only through saved tensors (saved_for_backward)
        other = later(c, "forward")
        if other:
            return (f"read later by {other[0].name} at {_where(other[0].location)}"
                    + (f" (+{len(other) - 1} more)" if len(other) > 1 else ""))

    def alive_at_end(c, through_view: bool):
        if c.sid in alive_end and c.sid not in mode.preexisting:
            op, i = c.op, c.operand
            via_view = bool(op.view_alive_end and op.view_alive_end[i]) or not (op.in_alive_end and op.in_alive_end[i])
            if via_view == through_view:
                return ("another tensor sharing the operand's memory (a view) is alive after the step" if through_view
                        else "the operand is still referenced after the step")

    return [("leaf_requires_grad", leaf), ("autograd_view", view), ("outlives_step", preexisting),
            ("saved_for_backward", saved), ("needed_by_optimizer", optimizer), ("used_later", used_later),
            ("aliased_by_live_view", lambda c: alive_at_end(c, True)),
            ("outlives_step", lambda c: alive_at_end(c, False))]


def _unsafe(mode: StepMode) -> list[UnsafeInplaceOp]:
    out: list[UnsafeInplaceOp] = []
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
        out.append(UnsafeInplaceOp(
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
    sizes: dict[int, int] = {e[1]: e[2] for e in events if e[0] == "a"}
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
