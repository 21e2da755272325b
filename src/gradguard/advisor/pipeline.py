"""The advisor's pipeline, written once for every framework: the rule table, the judge (rules -> candidates), the
verify loop, each proposal's verdict and the order of the runs (``advise_runs``). Imports no framework.

A framework supplies an *advisee* that records and re-runs its step (``advisor/api.py``: PyTorch,
``backends/paddle/advisor.py``: Paddle): ``memory_method``, ``verify_kinds``, ``explain_together``, ``count`` (runs
so far); ``record(report)`` -> the candidates (warm-up, recording; fills the recorded figures, unsafe writes,
notes); ``baseline(report)`` -> False when nothing can be verified; ``check(kind, group)`` -> None or why the run
with ``group`` applied failed; ``proposal(c)``; ``measure(c)`` -> ``Measured``; ``totals(report, kept, proposed)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .report import AdviceReport, RejectedCandidate

__all__ = ["RULE_TABLE", "RULES", "Candidate", "Measured", "advise_runs", "closure_values", "judge", "plan_of",
           "ranges_overlap", "verify"]

# code, frameworks that apply it, meaning. A rejection's detail names the responsible line.
RULE_TABLE = (
    ("not_same_shape", "paddle", "the output's shape or dtype differs from the operand's (broadcasting, type "
                                 "promotion); on PyTorch such an op is no candidate at all"),
    ("leaf_requires_grad", "torch paddle", "the operand is a leaf that requires grad (Paddle: stop_gradient=False): "
                                           "the framework refuses an in-place write to it"),
    ("autograd_view", "torch", "the operand is a view autograd forbids writing in place (multi-output, no_grad "
                               "views)"),
    ("outlives_step", "torch paddle", "the operand existed before the step (parameter, batch, buffer) or is still "
                                      "referenced after it: overwriting it changes data the caller sees"),
    ("saved_for_backward", "torch paddle", "autograd saved the operand's memory for backward (this op or another)"),
    ("needed_by_optimizer", "torch", "the optimizer reads the operand's memory later (a .grad, optimizer state)"),
    ("used_later", "torch paddle", "a later op of the step reads (Paddle: or writes) the operand's memory"),
    ("aliased_by_live_view", "torch", "a view sharing the operand's memory is still alive after the step"),
)
RULES = tuple(code for code, frameworks, _ in RULE_TABLE if "torch" in frameworks)  # PyTorch's, in report order
_CODES = {code for code, _, _ in RULE_TABLE}


def ranges_overlap(a: tuple | None, b: tuple | None) -> bool:
    """Two memory ranges ``(storage key, start, end)`` share a byte (None: unknown, never overlaps)."""
    return a is not None and b is not None and a[0] == b[0] and a[1] < b[2] and b[1] < a[2]


def closure_values(fn) -> list:
    """The values in ``fn``'s closure cells (an empty cell has none): a step's model may be only there."""
    values = []
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            values.append(cell.cell_contents)
        except ValueError:
            pass
    return values


class Candidate:
    """An out-of-place call whose operand could be overwritten in place. A framework's candidate defines ``site``
    (the call), ``key`` (the call in a rewrite plan), ``operand`` (0 = self, 1 = other), ``op``-name, ``location``
    and ``shape`` for the report, and starts with ``reasons = []``: (rule code, detail), filled by ``judge``."""

    reasons: list
    safe = property(lambda self: not self.reasons)
    plan = property(lambda self: (self.key, self.operand))

    def rejected(self) -> RejectedCandidate:
        return RejectedCandidate(self.op_name, self.location, "self" if self.operand == 0 else "other", self.shape,
                                 list(self.reasons))


def plan_of(group) -> dict:
    return dict(c.plan for c in group)


def judge(candidates: list, tests: list[tuple[str, Callable]], *, keep_rejected: bool) -> list:
    """Each candidate's reasons: the framework's rule ``tests`` [(code, test)] in order, ``test(c)``: the detail when
    the rule fires, else None. Then one rewrite per call (both operands of ``x + y`` may be dead): the first safe
    operand, else the first one; ``keep_rejected``: every rejected operand is kept too, to be reported."""
    assert all(code in _CODES for code, _ in tests)
    for c in candidates:
        c.reasons = [(code, detail) for code, test in tests if (detail := test(c)) is not None]
    best: dict = {}
    for c in candidates:
        prev = best.get(c.site)
        if prev is None or (c.safe and not prev.safe):
            best[c.site] = c
    return [c for c in candidates if best[c.site] is c or (keep_rejected and not c.safe)]


_TOGETHER = "failed when applied together with the others"


def verify(candidates: list, check: Callable, kinds: tuple, *, explain_together: bool) -> dict[int, str]:
    """id(candidate) -> why it failed. Per verification kind, all candidates together; where the group fails, each
    alone, then the rest together again (all fail if that fails). ``check(kind, group)``: None when the run matches
    the baseline bit for bit, else why not. ``explain_together``: the last group's reason follows ``_TOGETHER``."""
    failed: dict[int, str] = {}
    for kind in kinds:
        live = [c for c in candidates if id(c) not in failed]
        if not live or check(kind, live) is None:
            continue
        for c in live:
            why = check(kind, [c])
            if why is not None:
                failed[id(c)] = why
        live = [c for c in candidates if id(c) not in failed]
        why = check(kind, live) if live else None
        if why is not None:
            for c in live:
                failed[id(c)] = _TOGETHER + (f": {why}" if explain_together else "")
    return failed


@dataclass
class Measured:
    """What a proposal's own run says: its peak saving; ``problem`` (why it is not verified, "" when it is);
    ``identical`` (gradients and parameters bit-identical); ``gain`` (it frees memory at the peak)."""

    saving: int | None
    problem: str = ""
    identical: bool = True
    gain: bool = True


def _verdicts(advisee, report: AdviceReport, safe: list, failed: dict[int, str]) -> list:
    """File each safe candidate's proposal: unverified, verified with a peak gain (returned), or without one."""
    proposed = []
    for c in safe:
        p = advisee.proposal(c)
        if id(c) in failed:
            p.note, p.gradients_identical = failed[id(c)], False
            report.unverified.append(p)
            continue
        m = advisee.measure(c)
        p.measured_peak_saving, p.gradients_identical, p.verified = m.saving, m.identical, not m.problem
        if m.problem:
            p.note = m.problem
            report.unverified.append(p)
        elif m.gain:
            report.proposals.append(p)
            proposed.append(c)
        else:
            report.safe_without_peak_gain.append(p)
    return proposed


def advise_runs(advisee) -> AdviceReport:
    """The advisor's runs on one step, in order: record, baseline, verify, each proposal alone, all together."""
    report = AdviceReport(memory_method=advisee.memory_method)
    candidates = advisee.record(report)
    report.rejected += [c.rejected() for c in candidates if not c.safe]
    safe = [c for c in candidates if c.safe]
    if advisee.baseline(report):
        failed = verify(safe, advisee.check, advisee.verify_kinds, explain_together=advisee.explain_together)
        proposed = _verdicts(advisee, report, safe, failed)
        advisee.totals(report, [c for c in safe if id(c) not in failed], proposed)
    report.runs = advisee.count
    return report
