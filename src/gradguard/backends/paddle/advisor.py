"""The in-place memory advisor for PaddlePaddle (dygraph): ``gradguard.advise(step)`` when the step uses Paddle.

Paddle's part of the one advisor pipeline (``gradguard/advisor/pipeline.py``): the tests of the rules over Paddle's
recording, and the runs, each from the same restored state (parameters, buffers, ``.grad``, optimizer state, LR
schedulers, RNGs): an optional warm-up (one-time allocations stay out of the peaks), a record run (calls, reads,
writes and saves logged), plain baseline runs (the reference results and peak), poison and rewrite runs per group
of candidates (results bit-identical to the baseline), then measured rewrites (medians of ``repeats`` runs).

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
from ...advisor import pipeline
from ...advisor.pipeline import Measured, advise_runs, plan_of, ranges_overlap
from ...advisor.report import AdviceReport, Proposal, UnsafeInplaceOp
from ...checks.adapter_base import first_line
from ...core.findings import SourceLocation
from .advisor_record import MEMORY_METHOD_CPU, MEMORY_METHOD_GPU, _Call, _Operand, _Patches, _Run, candidate_ops
from .advisor_state import _difference, _Outcome, _State, _Step

__all__ = ["advise_paddle", "candidate_ops"]


@dataclass
class _Candidate(pipeline.Candidate):
    call: _Call
    arg: _Operand
    reasons: list = field(default_factory=list)  # (code, detail)

    operand = property(lambda self: self.arg.position)
    site = key = property(lambda self: self.call.key)
    op_name = property(lambda self: self.call.twin.op)
    location = property(lambda self: self.call.location)
    shape = property(lambda self: self.arg.shape)


def _short(loc: SourceLocation | None) -> str:
    return loc.short if loc is not None else "an unknown line"


def _rule_tests(run: _Run) -> list:
    """Paddle's test of each rule over the recorded log, in report order (see ``pipeline.judge``)."""

    def saved(c):
        s = next((s for s in run.saved if ranges_overlap(s.range, c.arg.range)), None)
        if s is not None:
            return f"saved for backward by {s.saver or 'an op'} at {_short(s.location)}"

    def used_later(c):
        later = next((clock for clock, rng in run.reads if clock > c.call.end and ranges_overlap(rng, c.arg.range)),
                     None)
        if later is not None:
            return f"read again later ({_reader(run, later)})"

    return [
        ("not_same_shape", lambda c: None if c.arg.same_shape else f"operand {list(c.arg.shape)} vs the output"),
        ("leaf_requires_grad", lambda c: f"the operand of {c.call.twin.op} at {_short(c.call.location)} is a leaf "
                                         "with stop_gradient=False" if c.arg.leaf_requires_grad else None),
        ("outlives_step", lambda c: "the operand is still referenced after the step returned (a parameter, an "
                                    "input, or a tensor the step keeps)" if c.arg.alive_after else None),
        ("saved_for_backward", saved), ("used_later", used_later)]


def _reader(run: _Run, clock: int) -> str:
    call = next((c for c in run.calls if c.start <= clock <= c.end), None)
    if call is not None:
        return f"{call.twin.op} at {_short(call.location)}"
    write = next((w for w in run.writes if w.start <= clock <= w.end), None)
    if write is not None:
        return f"{write.op} at {_short(write.location)}"
    return "by a Paddle call the advisor wraps"


def _unsafe_writes(run: _Run) -> list[UnsafeInplaceOp]:
    found = []
    for w in run.writes:
        for s in run.saved:
            consumed = any(s.clock < b < w.start for b in run.backwards)
            if s.clock < w.start and not consumed and ranges_overlap(s.range, w.range):
                why = ("Paddle does not check PyLayer ctx.save_for_backward tensors: the gradient is silently wrong"
                       if s.pylayer else
                       f"{w.op} does not bump the inplace version: Paddle computes the gradient from the new "
                       "values without any error" if not w.bumped else
                       "Paddle raises '...modified by an inplace operation' at backward")
                found.append(UnsafeInplaceOp(
                    "silent" if s.pylayer or not w.bumped else "raises", w.op, w.location, s.saver, s.location,
                    f"{w.op} at {_short(w.location)} overwrites a tensor that {s.saver or 'an op'} saved for "
                    f"backward at {_short(s.location)}: {why}. Fix: write into a copy (y = x.clone()) or use the "
                    f"out-of-place op."))
                break
    return found


class _Advisor:
    """Paddle's advisee (``advisor/pipeline.py``), making the runs the module doc lists."""

    verify_kinds = ("poison", "rewrite")
    explain_together = True

    def __init__(self, step: _Step, tracker, repeats: int, warmup: bool):
        self.step, self.tracker, self.repeats, self.warmup = step, tracker, repeats, warmup
        self.memory_method = MEMORY_METHOD_GPU if step.gpu else MEMORY_METHOD_CPU
        self.count = 0
        self.base: _Outcome | None = None

    def execute(self, run: _Run, label: str) -> _Outcome:
        self.count += 1
        self.tracker.update(f"run {self.count}: {label}")
        return self.step.execute(run)

    def record(self, report: AdviceReport) -> list:
        report.device = "gpu" if self.step.gpu else "cpu"
        self.first = self.execute(_Run("plain"), "warm-up" if self.warmup else "baseline")
        if self.warmup:
            _check_optimizers(self.step.state, self.first.run)
        self.recorded = self.execute(_Run("record"), "recording the step")
        rec = self.recorded.run
        report.unsafe_inplace = _unsafe_writes(rec)
        candidates = pipeline.judge([_Candidate(call, arg) for call in rec.calls for arg in call.operands],
                                    _rule_tests(rec), keep_rejected=True)
        report.notes.append(f"{len(rec.calls)} candidate call(s) recorded at Python-level Paddle entry points, "
                            f"{len(rec.saved)} tensor(s) saved for backward; claimed saving = the operand's bytes "
                            "(an upper bound), measured = drop of the allocator peak")
        if self.recorded.error is not None and self.first.error is None:
            raise self.recorded.error
        if not self.warmup:
            _check_optimizers(self.step.state, rec)
        return candidates

    def baseline(self, report: AdviceReport) -> bool:
        """The plain baseline runs, checked to reproduce each other and the recording (False: the step raises)."""
        plain_error = self.first.error
        if plain_error is not None:
            if not report.unsafe_inplace:
                raise plain_error
            report.notes.append(f"the step raises in plain Paddle ({first_line(plain_error)}): fix the unsafe "
                                "in-place op(s) first; no proposal was verified")
            return False
        done = [] if self.warmup else [self.first]
        base_runs = done + [self.execute(_Run("plain"), "baseline") for _ in range(self.repeats - len(done))]
        error = next((o.error for o in base_runs if o.error is not None), None)
        if error is not None:
            raise error
        self.base = base_runs[0]
        for other in [self.recorded, *base_runs[1:]]:
            diff = _difference(self.base.results, other.results)
            if diff is not None:
                raise InvalidArgument(
                    f"advise(...): the step is not reproducible: two runs from the same restored state differ "
                    f"({diff}). The advisor compares runs bit for bit, so the step must be deterministic and all of "
                    "its state (layers, optimizers, schedulers) reachable from fn, its arguments or the globals it "
                    "names. Pass the model and optimizer as arguments (advise(step, model, opt)) or make the step "
                    "deterministic.")
        report.baseline_peak = self.baseline_peak = int(statistics.median(o.peak for o in base_runs))
        self.baseline_seconds = [o.seconds for o in base_runs]
        return True

    def check(self, kind: str, group: list[_Candidate]) -> str | None:
        out = self.execute(_Run(kind, plan_of(group)), f"{kind} ({len(group)} candidate(s))")
        if out.error is not None:
            return f"{kind} run raised {first_line(out.error)}"
        if len(out.run.applied) != len(group):
            return f"the call was not found again in the {kind} run"
        diff = _difference(self.base.results, out.results)
        if diff is None:
            return None
        if kind == "poison":
            return (f"poison run: {diff} when the operand is overwritten with NaN right after the op "
                    "(something the advisor does not see reads it later)")
        return f"rewrite run: {diff} (gradients or parameters not bit-identical)"

    @staticmethod
    def proposal(c: _Candidate) -> Proposal:
        call, operand = c.call, c.arg
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

    def measure(self, c: _Candidate) -> Measured:
        peak, _, problem = self.measure_runs([c], f"measuring {c.call.location.short}")
        saving = self.baseline_peak - peak
        return Measured(saving, problem or "", identical=problem is None, gain=saving > 0)

    def measure_runs(self, group: list[_Candidate], label: str) -> tuple[int, list[float], str | None]:
        peaks, seconds, problem = [], [], None
        for _ in range(self.repeats):
            out = self.execute(_Run("rewrite", plan_of(group)), label)
            if out.error is not None:
                return 0, [], f"raised {first_line(out.error)}"
            problem = problem or _difference(self.base.results, out.results)
            peaks.append(out.peak)
            seconds.append(out.seconds)
        return int(statistics.median(peaks)), seconds, problem

    def totals(self, report: AdviceReport, kept: list, proposed: list[_Candidate]) -> None:
        if proposed:
            peak, seconds, problem = self.measure_runs(proposed, "all proposals together")
            report.rewritten_peak = peak
            report.measured_total_saving = report.baseline_peak - peak
            report.claimed_total_saving = sum(p.claimed_peak_saving for p in report.proposals)
            report.gradients_identical = problem is None
            if seconds:
                report.baseline_seconds = statistics.median(self.baseline_seconds)
                report.rewritten_seconds = statistics.median(seconds)
                report.timing_runs = (self.baseline_seconds, seconds)
        if report.unsafe_inplace:
            report.notes.append("the step has unsafe in-place writes; proposals are checked against the step as it is")


def _check_optimizers(state: _State, run: _Run) -> None:
    known = {id(o) for o in state.optimizers}
    for opt in run.optimizers:
        if id(opt) not in known:
            raise InvalidArgument(
                f"advise(...): the step called {type(opt).__name__}.step() on an optimizer the advisor cannot "
                "reach from fn, its arguments or the globals it names, so its state could not be restored between "
                "runs. Pass it (and the model) as arguments: advise(step, model, opt) with def step(model, opt): ...")


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
    state = _State([fn, *args, *kwargs.values()])
    if not state.params:
        raise InvalidArgument("advise(...): found no Paddle parameters reachable from fn, its arguments or the "
                              "globals it names, so gradients and parameters could not be compared. Pass the model "
                              "(and optimizer) as arguments: advise(step, model, opt).")
    step = _Step(fn, args, kwargs, state)
    patches = _Patches(candidate_ops())
    try:
        with progress("gradguard advise (paddle):") as tracker:
            return advise_runs(_Advisor(step, tracker, repeats, warmup))
    finally:
        patches.undo()
        state.restore()
