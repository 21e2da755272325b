"""The in-place memory advisor for PaddlePaddle (dygraph): ``gradguard.advise(step)`` when the step uses Paddle.

Same questions and the same report (:class:`gradguard.advisor.report.AdviceReport`) as the PyTorch advisor:
which out-of-place calls could safely become in-place, how many bytes each frees at the step's peak
(measured with Paddle's own allocator statistics), and which of the step's own in-place writes are unsafe.

Runs, all from the same state (parameters, buffers, ``.grad``, optimizer state, LR schedulers and the RNGs are
restored before each):
  0. warm-up (optional): a plain run, so one-time allocations are not part of any measured peak
  1. record: Python-level wrappers log the candidate calls, reads and in-place writes; saved-tensor hooks log
     what autograd saves. The safety rules run over this log.
  2. baseline: plain runs; their peak (median) and results (gradients, parameters) are the reference
  3. verification: a *poison* run (the operand is overwritten with NaN right after the op: anything that still
     reads it changes the results) and a *rewrite* run (the call made in-place on the operand), all candidates
     together, then one by one where the group fails; results must be bit-identical to the baseline
  4. measurement: each verified rewrite alone, then all together; medians of ``repeats`` runs

# NOTE [Recording Paddle without a dispatch mode]
# Paddle has no TorchDispatchMode equivalent, so the advisor sees the public Python entry points only: it
# patches them (module functions and ``paddle.Tensor`` methods) for the duration of ``advise``. Candidates are
# the calls of an out-of-place op with an in-place twin (``F.relu`` -> ``F.relu_``, ``Tensor.__add__`` ->
# ``add_``...) made directly from user code, or from the ``forward`` of a ``paddle.nn`` layer the user called
# (``nn.ReLU``). Calls made inside other Paddle functions are never candidates (the user cannot rewrite them),
# but their tensor arguments still count as reads. Ops called through ``paddle._C_ops`` and entry points
# bound before ``advise`` started (``from paddle import exp``) are not seen: a read through them is caught
# by the poison run instead (see NOTE [Why a poison run]).
#
# NOTE [Why a poison run]
# The "used later" rule only sees reads through the wrapped entry points. A read through anything else
# (``_C_ops``, a C++ extension, numpy via ``.numpy()`` into a later computation) would make a rewrite wrong
# without any rule firing. The poison run overwrites the operand with NaN right after the (out-of-place) op:
# if anything later reads it and the value matters, a gradient or parameter changes (NaN is compared bit for
# bit) and the candidate is rejected. It is stronger than the rewrite run, where a later reader would see the
# op's output, often close to the operand's values (relu of a mostly positive tensor).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field


from ..._errors import InvalidArgument
from ...advisor.report import AdviceReport, Proposal, RejectedCandidate, UnsafeInplaceOp
from ...core.findings import SourceLocation
from .advisor_record import MEMORY_METHOD_CPU, MEMORY_METHOD_GPU, _Call, _Operand, _Patches, _Run, candidate_ops
from .advisor_state import _difference, _Meter, _Outcome, _State, _Step

__all__ = ["advise_paddle", "candidate_ops"]


# -- rules ------------------------------------------------------------------------------------------------
@dataclass
class _Candidate:
    call: _Call
    operand: _Operand
    reasons: list = field(default_factory=list)  # (code, detail)

    @property
    def plan(self) -> tuple:
        return self.call.key, self.operand.position


def _overlaps(a: tuple | None, b: tuple | None) -> bool:
    return a is not None and b is not None and a[0] == b[0] and a[1] < b[2] and b[1] < a[2]


def _short(loc: SourceLocation | None) -> str:
    return loc.short if loc is not None else "an unknown line"


def _judge(run: _Run) -> list[_Candidate]:
    candidates = []
    for call in run.calls:
        for operand in call.operands:
            c = _Candidate(call, operand)
            if not operand.same_shape:
                c.reasons.append(("not_same_shape", f"operand {list(operand.shape)} vs the output"))
            if operand.leaf_requires_grad:
                c.reasons.append(("leaf_requires_grad", f"the operand of {call.twin.op} at {_short(call.location)} "
                                                        "is a leaf with stop_gradient=False"))
            if operand.alive_after:
                c.reasons.append(("outlives_step", "the operand is still referenced after the step returned "
                                                   "(a parameter, an input, or a tensor the step keeps)"))
            saved = next((s for s in run.saved if _overlaps(s.range, operand.range)), None)
            if saved is not None:
                by = saved.saver or "an op"
                c.reasons.append(("saved_for_backward", f"saved for backward by {by} at {_short(saved.location)}"))
            later = next((clock for clock, rng in run.reads if clock > call.end and _overlaps(rng, operand.range)),
                         None)
            if later is not None:
                c.reasons.append(("used_later", f"read again later ({_reader(run, later)})"))
            candidates.append(c)
    return _one_operand_per_call(candidates)


def _reader(run: _Run, clock: int) -> str:
    call = next((c for c in run.calls if c.start <= clock <= c.end), None)
    if call is not None:
        return f"{call.twin.op} at {_short(call.location)}"
    write = next((w for w in run.writes if w.start <= clock <= w.end), None)
    if write is not None:
        return f"{write.op} at {_short(write.location)}"
    return "by a Paddle call the advisor wraps"


def _one_operand_per_call(candidates: list[_Candidate]) -> list[_Candidate]:
    """Both operands of ``x + y`` may be dead: keep the first safe one, drop the other (one rewrite per call)."""
    out, taken = [], set()
    for c in candidates:
        if not c.reasons:
            if c.call.key in taken:
                continue
            taken.add(c.call.key)
        out.append(c)
    return out


def _unsafe_writes(run: _Run) -> list[UnsafeInplaceOp]:
    found = []
    for w in run.writes:
        for s in run.saved:
            consumed = any(s.clock < b < w.start for b in run.backwards)
            if s.clock < w.start and not consumed and _overlaps(s.range, w.range):
                silent = s.pylayer or not w.bumped
                why = ("Paddle does not check PyLayer ctx.save_for_backward tensors: the gradient is silently wrong"
                       if s.pylayer else
                       f"{w.op} does not bump the inplace version: Paddle computes the gradient from the new "
                       "values without any error" if not w.bumped else
                       "Paddle raises '...modified by an inplace operation' at backward")
                found.append(UnsafeInplaceOp(
                    "silent" if silent else "raises", w.op, w.location, s.saver, s.location,
                    f"{w.op} at {_short(w.location)} overwrites a tensor that {s.saver or 'an op'} saved for "
                    f"backward at {_short(s.location)}: {why}. Fix: write into a copy (y = x.clone()) or use the "
                    f"out-of-place op."))
                break
    return found


# -- the advisor ------------------------------------------------------------------------------------------
def _proposal(c: _Candidate) -> Proposal:
    call, operand = c.call, c.operand
    a, b = ("x", "y") if operand.position == 0 else ("y", "x")
    suggestion = call.twin.spelling.format(a=a, b=b)
    if operand.position == 1:
        suggestion += ": overwrite the second operand, it is the dead one"
    if call.module is not None:
        suggestion = (f"paddle.nn.{call.module} has no in-place switch: call {suggestion} in place of the layer "
                      f"(in the forward that uses it)")
    return Proposal(op=call.twin.op, inplace_op=call.twin.inplace_op, location=call.location, module=call.module,
                    operand="self" if operand.position == 0 else "other", shape=operand.shape,
                    dtype=operand.dtype, tensor_bytes=operand.nbytes, suggestion=suggestion,
                    claimed_peak_saving=operand.nbytes, occurrence=call.key[-1])


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


class _Advisor:
    def __init__(self, step: _Step, tracker, repeats: int):
        self.step, self.tracker, self.repeats = step, tracker, repeats
        self.runs = 0
        self.base: _Outcome | None = None

    def execute(self, run: _Run, label: str) -> _Outcome:
        self.runs += 1
        self.tracker.update(f"run {self.runs}: {label}")
        return self.step.execute(run)

    def failure(self, kind: str, group: list[_Candidate]) -> str | None:
        out = self.execute(_Run(kind, dict(c.plan for c in group)), f"{kind} ({len(group)} candidate(s))")
        if out.error is not None:
            return f"{kind} run raised {_first_line(out.error)}"
        if len(out.run.applied) != len(group):
            return f"the call was not found again in the {kind} run"
        diff = _difference(self.base.results, out.results)
        if diff is None:
            return None
        if kind == "poison":
            return (f"poison run: {diff} when the operand is overwritten with NaN right after the op "
                    "(something the advisor does not see reads it later)")
        return f"rewrite run: {diff} (gradients or parameters not bit-identical)"

    def verify(self, candidates: list[_Candidate]) -> dict[int, str]:
        failed: dict[int, str] = {}
        for kind in ("poison", "rewrite"):
            live = [c for c in candidates if id(c) not in failed]
            if not live or self.failure(kind, live) is None:
                continue
            for c in live:
                why = self.failure(kind, [c])
                if why is not None:
                    failed[id(c)] = why
            live = [c for c in candidates if id(c) not in failed]
            if live:
                why = self.failure(kind, live)
                if why is not None:
                    for c in live:
                        failed[id(c)] = "failed when applied together with the others: " + why
        return failed

    def measure(self, group: list[_Candidate], label: str) -> tuple[int, list[float], str | None]:
        peaks, seconds, problem = [], [], None
        for _ in range(self.repeats):
            out = self.execute(_Run("rewrite", dict(c.plan for c in group)), label)
            if out.error is not None:
                return 0, [], f"raised {_first_line(out.error)}"
            problem = problem or _difference(self.base.results, out.results)
            peaks.append(out.peak)
            seconds.append(out.seconds)
        return int(statistics.median(peaks)), seconds, problem


def _report_rejected(report: AdviceReport, candidates: list[_Candidate]) -> None:
    for c in candidates:
        if c.reasons:
            report.rejected.append(RejectedCandidate(
                c.call.twin.op, c.call.location, "self" if c.operand.position == 0 else "other",
                c.operand.shape, list(c.reasons)))


def _run_advisor(step: _Step, tracker, *, repeats: int, warmup: bool) -> AdviceReport:
    gpu = step.meter.gpu
    report = AdviceReport(memory_method=MEMORY_METHOD_GPU if gpu else MEMORY_METHOD_CPU,
                          device="gpu" if gpu else "cpu")
    advisor = _Advisor(step, tracker, repeats)
    plain_error = None
    if warmup:
        warm = advisor.execute(_Run("plain"), "warm-up")
        plain_error = warm.error
        _check_optimizers(step.state, warm.run)
    else:
        first = advisor.execute(_Run("plain"), "baseline")
        plain_error = first.error
    recorded = advisor.execute(_Run("record"), "recording the step")
    rec = recorded.run
    report.unsafe_inplace = _unsafe_writes(rec)
    candidates = _judge(rec)
    _report_rejected(report, candidates)
    report.notes.append(f"{len(rec.calls)} candidate call(s) recorded at Python-level Paddle entry points, "
                        f"{len(rec.saved)} tensor(s) saved for backward; claimed saving = the operand's bytes "
                        "(an upper bound), measured = drop of the allocator peak")
    if recorded.error is not None and plain_error is None:
        raise recorded.error
    if not warmup:
        _check_optimizers(step.state, rec)

    if plain_error is not None:
        if not report.unsafe_inplace:
            raise plain_error
        report.notes.append(f"the step raises in plain Paddle ({_first_line(plain_error)}): fix the unsafe in-place "
                            "op(s) first; no proposal was verified")
        report.runs = advisor.runs
        return report
    base_runs = _baseline_runs(advisor, [] if warmup else [first], repeats, recorded)
    report.baseline_peak = int(statistics.median(o.peak for o in base_runs))
    baseline_seconds = [o.seconds for o in base_runs]

    safe = [c for c in candidates if not c.reasons]
    kept = _measure_each(advisor, report, safe)
    if kept:
        _measure_together(advisor, report, kept, baseline_seconds)
    if report.unsafe_inplace:
        report.notes.append("the step has unsafe in-place writes; proposals are checked against the step as it is")
    report.runs = advisor.runs
    return report


def _baseline_runs(advisor: _Advisor, done: list, repeats: int, recorded) -> list:
    """The plain baseline runs (``done`` already run), checked to reproduce each other and the recording."""
    base_runs = done + [advisor.execute(_Run("plain"), "baseline") for _ in range(repeats - len(done))]
    error = next((o.error for o in base_runs if o.error is not None), None)
    if error is not None:
        raise error
    advisor.base = base_runs[0]
    for other in [recorded, *base_runs[1:]]:
        diff = _difference(advisor.base.results, other.results)
        if diff is not None:
            raise InvalidArgument(
                f"advise(...): the step is not reproducible: two runs from the same restored state differ ({diff}). "
                "The advisor compares runs bit for bit, so the step must be deterministic and all of its state "
                "(layers, optimizers, schedulers) reachable from fn, its arguments or the globals it names. "
                "Pass the model and optimizer as arguments (advise(step, model, opt)) or make the step deterministic.")
    return base_runs


def _measure_each(advisor: _Advisor, report: AdviceReport, safe: list[_Candidate]) -> list[_Candidate]:
    """Verify and measure each safe candidate alone, sorting its proposal into the report; those kept."""
    failed = advisor.verify(safe)
    kept = []
    for c in safe:
        p = _proposal(c)
        if id(c) in failed:
            p.note, p.gradients_identical = failed[id(c)], False
            report.unverified.append(p)
            continue
        peak, _, problem = advisor.measure([c], f"measuring {c.call.location.short}")
        p.measured_peak_saving = report.baseline_peak - peak
        p.gradients_identical = problem is None
        p.verified = problem is None
        if problem is not None:
            p.note = problem
            report.unverified.append(p)
        elif p.measured_peak_saving > 0:
            report.proposals.append(p)
            kept.append(c)
        else:
            report.safe_without_peak_gain.append(p)
    return kept


def _measure_together(advisor: _Advisor, report: AdviceReport, kept: list[_Candidate], baseline_seconds) -> None:
    peak, seconds, problem = advisor.measure(kept, "all proposals together")
    report.rewritten_peak = peak
    report.measured_total_saving = report.baseline_peak - peak
    report.claimed_total_saving = sum(p.claimed_peak_saving for p in report.proposals)
    report.gradients_identical = problem is None
    if seconds:
        report.baseline_seconds = statistics.median(baseline_seconds)
        report.rewritten_seconds = statistics.median(seconds)
        report.timing_runs = (baseline_seconds, seconds)


def _check_optimizers(state: _State, run: _Run) -> None:
    known = {id(o) for o in state.optimizers}
    for opt in run.optimizers:
        if id(opt) not in known:
            raise InvalidArgument(
                f"advise(...): the step called {type(opt).__name__}.step() on an optimizer the advisor cannot "
                "reach from fn, its arguments or the globals it names, so its state could not be restored between "
                "runs. Pass it (and the model) as arguments: advise(step, model, opt) with def step(model, opt): ...")


def _roots(fn, args, kwargs) -> list:
    return [fn, *args, *kwargs.values()]


def advise_paddle(fn, args: tuple = (), kwargs: dict | None = None, *, per_proposal: bool = True,
                  repeats: int = 3, warmup: bool = True, allocator_check: bool | None = None) -> AdviceReport:
    """The Paddle advisor; called by :func:`gradguard.advise` when the step uses Paddle (see the module doc)."""
    if allocator_check is not None:
        raise InvalidArgument("advise(..., allocator_check=...) is PyTorch-only (a torch.profiler cross-check); "
                              "on Paddle the peak is always Paddle's own allocator statistics: drop the argument")
    if per_proposal is not True:
        raise InvalidArgument("advise(..., per_proposal=False) is not supported on Paddle: a Paddle proposal is "
                              "reported only with its own measured peak drop; drop the argument")
    if repeats < 1:
        raise InvalidArgument(f"advise(..., repeats={repeats}) on Paddle: peaks are medians of 'repeats' measured "
                              "runs, so it must be >= 1")
    from ...report.progress import progress

    kwargs = dict(kwargs or {})
    state = _State(_roots(fn, args, kwargs))
    if not state.params:
        raise InvalidArgument("advise(...): found no Paddle parameters reachable from fn, its arguments or the "
                              "globals it names, so gradients and parameters could not be compared. Pass the model "
                              "(and optimizer) as arguments: advise(step, model, opt).")
    step = _Step(fn, args, kwargs, state, _Meter(state.on_gpu()))
    patches = _Patches(candidate_ops())
    try:
        with progress("gradguard advise (paddle):") as tracker:
            return _run_advisor(step, tracker, repeats=repeats, warmup=warmup)
    finally:
        patches.undo()
        state.restore()
