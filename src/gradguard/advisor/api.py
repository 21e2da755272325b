"""``gradguard.advise(fn, *args)``: record one step, propose in-place rewrites, verify them by re-running.

Runs, all on the same state (parameters, optimizer state, ``.grad`` and the RNG are restored after each):
  0. warm-up (optional): lazily created state (optimizer moments) exists before the measured runs
  1. record: the op trace, saved tensors, live-storage accounting, gradients (the baseline)
  2. rewrite: every safe candidate applied at dispatch level; gradients compared bit for bit
  3. one run per proposal: its own measured peak saving, compared with its claim
  4. timing: baseline and rewritten steps alternated, medians
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import statistics
import sys
import time
from dataclasses import dataclass, field

from .._errors import InvalidArgument
from ..core.findings import SourceLocation
from . import pipeline
from .pipeline import Measured, advise_runs, closure_values, plan_of
from .report import AdviceReport, Proposal, UnsafeInplaceOp

# NOTE [advise without torch]: a Paddle-only Python has no torch; advise() then dispatches to the Paddle
# advisor (gradguard.backends.paddle.advisor) and the torch machinery below is never used.
try:
    import torch

    from .trace import OpRecord, StepComplete, StepMode, inplace_overload
except ModuleNotFoundError as _missing:
    if _missing.name != "torch":
        raise
    torch = None

_log = logging.getLogger("gradguard.advisor")

__all__ = ["advise", "run_advisor", "FunctionStep"]

MEMORY_METHOD = ("tracked live tensor storage bytes allocated by the step (op outputs via a TorchDispatchMode, "
                 "frees via storage weakref finalizers)")


@dataclass
class RunOutcome:
    mode: StepMode
    grads: list
    values: list
    seconds: float
    error: BaseException | None
    cuda_peak: int | None = None  # torch.cuda.max_memory_allocated above the start, when CUDA is in use


class FunctionStep:
    """One call of ``fn(*args)`` is the step. State the step writes in place is restored afterwards."""

    warmup = True
    restores_state = True

    def __init__(self, fn, args, kwargs):
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.rng = torch.get_rng_state()

    def execute(self, mode: StepMode):
        return self.fn(*self.args, **self.kwargs)

    def cleanup(self, mode: StepMode) -> None:
        for leaf, grad in zip(mode.leaves, mode.leaf_grads_before):
            leaf.grad = grad
        with torch.no_grad():
            for storage, copy in mode.snapshots.values():
                storage.copy_(copy)
        mode.snapshots.clear()


def _cuda_in_use() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def _run(step, mode: StepMode) -> RunOutcome:
    torch.set_rng_state(step.rng)
    mode.snapshot_writes = step.restores_state
    cuda = _cuda_in_use()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        cuda_start = torch.cuda.memory_allocated()
    import torch.optim.optimizer as opt_mod

    def pre(*_):
        mode.in_optimizer += 1

    def post(*_):
        mode.in_optimizer -= 1
        mode.optimizer_steps += 1

    handles = [opt_mod.register_optimizer_step_pre_hook(pre), opt_mod.register_optimizer_step_post_hook(post)]
    error = None
    result = None
    start = time.perf_counter()
    try:
        with mode.hooks(), mode:
            try:
                result = step.execute(mode)
            except StepComplete:
                pass
    except BaseException as exc:  # noqa: BLE001 - reported, then re-raised by the caller if it is the baseline
        error = exc
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    cuda_peak = (torch.cuda.max_memory_allocated() - cuda_start) if cuda else None
    for h in handles:
        h.remove()
    mode.finish()
    grads, values = [], []
    if error is None:
        with torch.no_grad():
            grads = [None if leaf.grad is None else leaf.grad.detach().clone() for leaf in mode.leaves]
            values = [leaf.detach().clone() for leaf in mode.leaves]
    del result
    step.cleanup(mode)
    return RunOutcome(mode, grads, values, seconds, error, cuda_peak)


def _identical(a: RunOutcome, b: RunOutcome) -> bool:
    if a.error is not None or b.error is not None or len(a.grads) != len(b.grads):
        return False
    for x, y in zip(a.grads + a.values, b.grads + b.values):
        if (x is None) != (y is None):
            return False
        if x is not None and (x.dtype != y.dtype or x.shape != y.shape or not torch.equal(x, y)):
            return False
    return True


# -- from a recorded step to candidates: a candidate is an out-of-place op (with an in-place overload in aten) whose
# operand could be overwritten; it is safe only if no rule fires (the rule table and the judge: ``pipeline.py``).
# Also the unsafe in-place writes, and the peak-memory simulation.
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


_OPERATORS = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
_INPLACE_MODULES = {"ReLU", "ReLU6", "LeakyReLU", "ELU", "SELU", "CELU", "Hardtanh", "Hardswish", "Hardsigmoid",
                    "SiLU", "Mish", "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "Threshold"}


def _suggestion(cand: Candidate) -> str:
    op = cand.op
    packet = op.name.split("::", 1)[-1].split(".", 1)[0]
    if op.module in _INPLACE_MODULES:
        return f"construct nn.{op.module}(..., inplace=True)"
    if packet in _OPERATORS:
        a, b = ("x", "y") if cand.operand == 0 else ("y", "x")
        text = f"{a}.{packet}_({b}) (or {a} {_OPERATORS[packet]}= {b})"
        if cand.operand == 1:
            text += ": overwrite the second operand, it is the dead one"
        return text
    if packet in ("relu", "elu", "leaky_relu", "hardtanh", "silu", "hardswish", "hardsigmoid", "threshold"):
        return f"F.{packet}(x, inplace=True) or x.{packet}_()"
    return f"x.{packet}_(...) instead of x.{packet}(...) / torch.{packet}(x, ...)"


def _proposal(cand: Candidate) -> Proposal:
    target = inplace_overload(cand.op.func)
    dtype = str(cand.op.out_dtypes[0]).replace("torch.", "")
    return Proposal(
        op=cand.op.name, inplace_op=target.name() if target is not None else "?",
        location=cand.op.location, module=cand.op.module, operand="self" if cand.operand == 0 else "other",
        shape=cand.op.out_shapes[0], dtype=dtype, tensor_bytes=cand.nbytes,
        suggestion=_suggestion(cand), claimed_peak_saving=cand.claimed_peak_saving,
        occurrence=(cand.op.key[-1] + 1) if cand.op.key else 1,
    )


def run_advisor(step, *, per_proposal: bool = True, repeats: int = 3, allocator_check: bool = True) -> AdviceReport:
    """The advisor's runs on ``step``, with a progress display on stderr where it is a terminal."""
    from ..report.progress import progress

    with progress("gradguard advise:") as tracker:
        return advise_runs(_Runs(step, tracker, per_proposal, repeats, allocator_check))


class _Runs:
    """PyTorch's advisee (``pipeline.py``): the runs of one advice on ``step``; the record run is the baseline."""

    memory_method = MEMORY_METHOD
    # the dispatch mode sees every read: no poison run (NOTE [Why a poison run], backends/paddle/advisor.py)
    verify_kinds = ("rewrite",)
    explain_together = False

    def __init__(self, step, tracker, per_proposal: bool, repeats: int, allocator_check: bool):
        self.step, self.tracker, self.count, self.base, self.together = step, tracker, 0, None, None
        self.per_proposal, self.repeats, self.allocator_check = per_proposal, repeats, allocator_check

    def checked(self, mode: StepMode) -> RunOutcome:
        outcome = _run(self.step, mode)
        self.count += 1
        if outcome.error is not None:
            raise outcome.error
        return outcome

    def rewrite(self, cands) -> RunOutcome:
        self.count += 1
        self.tracker.update(f"verification run {self.count} ({len(cands)} rewrite(s) applied)")
        return _run(self.step, StepMode(record=False, plan=plan_of(cands)))

    def ok(self, outcome: RunOutcome, cands) -> bool:
        return _identical(self.base, outcome) and len(outcome.mode.applied) == len(cands)

    def record(self, report: AdviceReport) -> list:
        if self.step.warmup:
            self.tracker.update("warm-up run")
            self.checked(StepMode(record=False))
        self.tracker.update("recording the step")
        self.base = self.checked(StepMode(record=True))
        mode = self.base.mode
        report.ops_recorded = len(mode.ops)
        report.baseline_peak = mode.peak_bytes
        report.device = ",".join(sorted({t.device.type for t in mode.leaves})) or "cpu"
        candidates, report.unsafe_inplace = analyse(mode)
        if report.unsafe_inplace:
            report.notes.append("the step has unsafe in-place writes; its gradients already differ from what plain "
                                "PyTorch would compute (or raise), and proposals are checked against them as recorded")
        return candidates

    def baseline(self, report: AdviceReport) -> bool:
        return True  # the record run

    def check(self, kind: str, group: list) -> str | None:
        outcome = self.together = self.rewrite(group)  # the last group that passed: all proposals together
        if self.ok(outcome, group):
            return None
        return ("raised " + type(outcome.error).__name__ if outcome.error is not None
                else "gradients or parameters differ" if len(outcome.mode.applied) == len(group)
                else "the op was not found again in the rewrite run")

    proposal = staticmethod(_proposal)

    def measure(self, c) -> Measured:
        if c.claimed_peak_saving <= 0:
            return Measured(None if self.per_proposal else 0, gain=False)
        if not self.per_proposal:
            return Measured(None)
        alone = self.rewrite([c])
        measured = self.base.mode.peak_bytes - alone.mode.peak_bytes
        identical = self.ok(alone, [c])
        return Measured(measured, identical=identical, problem=(
            "gradients differ when applied alone" if not identical
            else f"measured {measured} B vs claimed {c.claimed_peak_saving} B" if measured != c.claimed_peak_saving
            else ""))

    def totals(self, report: AdviceReport, kept: list, proposed: list) -> None:
        base, together = self.base, self.together if kept else None
        if base.cuda_peak is not None:
            report.notes.append(f"CUDA allocator (torch.cuda.max_memory_allocated above the step's start): baseline "
                                f"{base.cuda_peak} B" + (f", all proposals applied {together.cuda_peak} B"
                                                          if together is not None and together.cuda_peak is not None
                                                          else ""))
            report.cuda_peaks = (base.cuda_peak, together.cuda_peak if together is not None else None)
        if together is not None:
            claimed_total = base.mode.peak_bytes - simulate_peak(base.mode.events, [(c.sid, c.out_sid) for c in kept])
            report.rewritten_peak = together.mode.peak_bytes
            report.measured_total_saving = base.mode.peak_bytes - together.mode.peak_bytes
            report.gradients_identical = _identical(base, together)
            report.claimed_total_saving = claimed_total
            if report.measured_total_saving != claimed_total:
                report.notes.append(f"combined: measured {report.measured_total_saving} B vs claimed {claimed_total} B")
        if self.allocator_check and kept and not _cuda_in_use():
            _allocator_cross_check(self, report, kept)
        if self.repeats > 0 and kept:
            _time_runs(self, report, kept, self.repeats)


def _allocator_cross_check(runs: _Runs, report: AdviceReport, kept: list) -> None:
    runs.tracker.update("allocator cross-check (2 runs under torch.profiler)")
    base_alloc = _allocator_peak(runs.step, StepMode(record=False, plan={("no such op",): 0}))
    new_alloc = _allocator_peak(runs.step, StepMode(record=False, plan=plan_of(kept)))
    runs.count += 2
    if base_alloc is not None and new_alloc is not None:
        report.allocator_peaks = (base_alloc, new_alloc)
    else:
        report.notes.append("the CPU allocator cross-check did not run (torch.profiler failed or the step "
                            "raised under it; the 'gradguard.advisor' log says why)")


def _time_runs(runs: _Runs, report: AdviceReport, kept: list, repeats: int) -> None:
    plain_t, fast_t = [], []
    for repeat in range(repeats):
        runs.tracker.update(f"timing {repeat + 1}/{repeats}")
        # The same mode work as the rewritten run (user-line lookup per op), with nothing to rewrite.
        plain_t.append(_run(runs.step, StepMode(record=False, plan={("no such op",): 0})).seconds)
        fast_t.append(_run(runs.step, StepMode(record=False, plan=plan_of(kept))).seconds)
        runs.count += 2
    report.baseline_seconds = statistics.median(plain_t)
    report.rewritten_seconds = statistics.median(fast_t)
    report.timing_runs = (plain_t, fast_t)


@contextlib.contextmanager
def _quiet_stderr():
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _allocator_peak(step, mode: StepMode) -> int | None:
    """Cross-check on CPU: the peak of the c10 CPU allocator's own reports (torch.profiler memory events),
    which also see kernel scratch buffers that never surface as op outputs."""
    try:
        from torch.profiler import ProfilerActivity, profile

        prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        with _quiet_stderr():  # kineto prints "profiler_start/stop" lines to fd 2
            prof.__enter__()
        try:
            outcome = _run(step, mode)
        finally:
            with _quiet_stderr():
                prof.__exit__(None, None, None)
        if outcome.error is not None:
            return None
        events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                        if e.name() == "[memory]" and e.device_type() == torch._C._autograd.DeviceType.CPU)
    except Exception as error:  # profiler unavailable or its private result API changed: no cross-check
        _log.warning("gradguard advise: CPU allocator cross-check skipped: torch.profiler failed (%s: %s)",
                     type(error).__name__, error)
        return None
    return max([0, *itertools.accumulate(nbytes for _, nbytes in events)])  # the peak of the live bytes


def advise(fn, *args, kwargs: dict | None = None, per_proposal: bool = True, repeats: int = 3,
           warmup: bool = True, allocator_check: bool | None = None, backend: str = "auto") -> AdviceReport:
    """Record one training step ``fn(*args)`` and advise which out-of-place ops can safely become in-place.

    ``fn`` runs several times (record, rewrite, verification, timing); every in-place write it makes to
    memory that existed before the call (parameters, optimizer state, ``.grad``) is undone after each run,
    and the torch RNG is reset to the same state before each run. Proposals are reported only when the
    rewritten step gives bit-identical gradients and parameters and its peak drops by the claimed bytes.

    ``backend``: "auto" (the framework of the arguments, else the one imported), "torch" or "paddle". On Paddle
    (see docs/advisor.md) ``allocator_check`` and ``per_proposal=False`` are not supported (InvalidArgument).
    """
    if not callable(fn):
        raise InvalidArgument(f"advise(fn, ...): 'fn' must be callable (one training step), got {type(fn).__name__}")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise InvalidArgument(f"advise(...): 'kwargs' must be a dict of keyword arguments for fn, "
                              f"got {type(kwargs).__name__}")
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 0:
        raise InvalidArgument(f"advise(...): 'repeats' must be an int >= 0, got {repeats!r}")
    for name, flag in (("per_proposal", per_proposal), ("warmup", warmup), ("allocator_check", allocator_check)):
        if not isinstance(flag, bool) and not (name == "allocator_check" and flag is None):
            raise InvalidArgument(f"advise(...): '{name}' must be a bool, got {flag!r}")
    framework = _framework(fn, args, kwargs or {}, backend)
    if hasattr(framework, "advise"):  # a framework with its own advisor (Paddle); torch's is this module's
        return framework.advise(fn, args, kwargs, per_proposal=per_proposal, repeats=repeats, warmup=warmup,
                                allocator_check=allocator_check)
    step = FunctionStep(fn, args, kwargs or {})
    step.warmup = warmup
    return run_advisor(step, per_proposal=per_proposal, repeats=repeats, allocator_check=allocator_check is not False)


def _framework(fn, args, kwargs, backend):
    """The framework of this step (``backend="auto"``: the framework of its arguments, else the one imported)."""
    from ..backends import KNOWN, choose

    objects = [*args, *kwargs.values(), *closure_values(fn)]
    # a user's model (class MLP(paddle.nn.Layer)) tells the framework through its base classes
    roots = ((cls.__module__ or "").split(".")[0] for obj in objects for cls in type(obj).__mro__)
    found = next((root for root in roots if root in KNOWN), None) if backend == "auto" else None
    return choose(found or backend, objects, fallback=None, needs="advise")
