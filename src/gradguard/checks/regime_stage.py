"""The regime stage of ``check_op``: which regimes run, in what order (NOTE [Budget]), which share one run (NOTE [Same
inputs, one run]), on the whole inputs or the first rows of a large batch (NOTE [Large inputs]), with progress."""

from __future__ import annotations

import dataclasses
import sys
import time

from .gradient_suite import GradientSuite
from .op_raised import OpRaised
from .regime_run import RegimeRun
from .regimes import Regime, Spec, build_regimes
from .report import CheckResult, Failure
from .repro import repro
from .runs import NotApplicable, Outcome, ReferenceRaised, Run
from .subject import Subject

__all__ = ["RegimeStage", "LARGE_INPUT_ELEMENTS", "budget_spent"]

LARGE_INPUT_ELEMENTS = 1 << 20  # NOTE [Large inputs]


def budget_spent(budget) -> str:
    return f"budget spent (budget={budget!r}); pass a larger budget, or none, to run it"


class RegimeStage:
    def __init__(self, op: Subject, out: Outcome, suite: GradientSuite, isolate: bool, arguments, vary, elements: int):
        self.op = op
        self.out = out
        self.suite = suite
        self.one = RegimeRun(op, out, suite, isolate)
        self.arguments = arguments
        self.vary = vary
        self.elements = elements  # differentiated, in the given inputs

    def run(self, groups, unsupported, base, t0: float, deadline: float | None) -> None:
        if "regime" not in groups:
            return
        op, out = self.op, self.out
        full_args = op.args
        try:
            base = self._slice_for_regimes(base)
            selected = set(op.opts["regimes"])
            for name in sorted(selected & set(unsupported)):
                out.checks.append(CheckResult(f"regime.{name}", name, "skip", unsupported[name]))
            regimes, skipped = build_regimes(op.B, op.args, op.wrt, op.kwargs, self.arguments, self.vary,
                                             selected - set(unsupported), op.names)
            for name, why in skipped.items():
                out.checks.append(CheckResult(f"regime.{name}", name, "skip", why))
            if deadline is not None:  # NOTE [Budget]: the argument regimes first
                regimes = _budget_order(regimes)
            given_s = time.perf_counter() - t0
            progress = _Progress(op.opts["name"] or op.B.op_name(op.fn), len(regimes), given_s)
            ran: dict = {}  # NOTE [Same inputs, one run]
            for n, regime in enumerate(regimes, start=1):
                if deadline is not None and time.perf_counter() > deadline:
                    out.checks.append(CheckResult(f"regime.{regime.name}", regime.name, "skip",
                                                  f"{regime.description}: {budget_spent(op.opts['budget'])}"))
                    continue
                progress.step(n, regime.name)
                key = self._regime_key(regime)
                if key is not None and key in ran:
                    self._reuse_regime(regime, *ran[key])
                    continue
                n_checks, n_findings, n_notes = len(out.checks), len(out.findings), len(out.notes)
                self.one.run(regime, base, n)
                if key is not None:
                    ran[key] = (regime, out.checks[n_checks:], out.findings[n_findings:], out.notes[n_notes:])
            progress.done()
        finally:
            op.args = full_args

    def _regime_key(self, regime: Regime):
        """What a value regime's run depends on besides its seed: spec, inputs (dtype, shape, layout, bytes) and which
        are differentiated; None for the regimes never merged (layout regimes, another ``kwargs``).

        # NOTE [Same inputs, one run]
        # Two regimes can build the same inputs: on a 1-D input the leading dimension is the last one, so
        # ``batch_size`` 10 -> 1 and ``feature_dim`` 10 -> 1 both keep x[:1]. The second is not run again: it
        # gets the first one's checks and findings under its own name, and a note says so. What that leaves
        # out is the second run's own random cotangents and directions on the same inputs.
        """
        if regime.spec.layout or regime.kwargs is not None:
            return None
        B = self.op.B
        contiguous = getattr(B, "is_contiguous", None)
        parts = []
        for a in regime.args:
            if B.is_tensor(a):
                parts.append((B.dtype_name(a), tuple(B.shape(a)), contiguous(a) if contiguous else None, B.fingerprint(a)))
            else:
                parts.append(("object", id(a)))
        return regime.spec, tuple(regime.wrt) if regime.wrt is not None else None, tuple(parts)

    def _reuse_regime(self, regime: Regime, first: Regime, checks: list[CheckResult], findings: list[Failure],
                      notes: list[str]) -> None:
        """``regime`` has ``first``'s inputs (NOTE [Same inputs, one run]): ``first``'s outcome under ``regime``'s name."""
        out = self.out

        def renamed(check: str) -> str:
            return f"regime.{regime.name}" if check == f"regime.{first.name}" else check

        for c in checks:
            detail = regime.description if c.detail == first.description else c.detail
            out.checks.append(dataclasses.replace(c, check=renamed(c.check), regime=regime.name, detail=detail))
        for f in findings:
            out.findings.append(dataclasses.replace(f, check=renamed(f.check), regime=regime.name,
                                                    message=f.message.replace(first.description, regime.description)))
        out.notes += [n.replace(f"regime.{first.name} ", f"regime.{regime.name} ") for n in notes]
        out.notes.append(f"regime.{regime.name} ({regime.description}) has the same inputs as regime.{first.name} "
                         f"({first.description}): not run again, its result is that run's")

    def _slice_for_regimes(self, base: Run) -> Run:
        """NOTE [Large inputs]: past LARGE_INPUT_ELEMENTS differentiated elements the regimes are derived from the
        first rows of the batch (the leading dimension the inputs share), checked first as inputs of their own,
        so a dozen regimes do not each hold float64 copies of the whole input. Returns the run the regimes are
        compared with (``op.args`` becomes the slice until the regimes are done)."""
        op, out = self.op, self.out
        B, args, n = op.B, op.args, self.elements
        first = next((i for i, a in enumerate(args) if B.is_tensor(a) and B.ndim(a) >= 1 and B.shape(a)[0] > 1), None)
        if n <= LARGE_INPUT_ELEMENTS or first is None:
            return base
        b = B.shape(args[first])[0]
        rows = max(1, int(LARGE_INPUT_ELEMENTS * b // n))
        if rows >= b:
            return base
        sliced = [B.from_numpy(B.to_numpy(a)[:rows], a) if B.is_tensor(a) and B.ndim(a) >= 1 and B.shape(a)[0] == b
                  else a for a in args]
        try:
            run = self.suite.run(sliced, "batch_slice", Spec(), linearity=False, seed_offset=500)
        except (OpRaised, ReferenceRaised, NotApplicable) as exc:
            out.notes.append(f"the regimes run on the whole inputs: fn on their first {rows} rows raised ({exc})")
            return base
        out.notes += run.notes
        if run.failures:
            text = repro(op, sliced, None)
            for f in run.failures:
                f.repro = text
            given = {(f.check, f.input) for f in out.findings if f.regime == "given"}
            out.findings += [f for f in run.failures if (f.check, f.input) not in given]
        out.checks.append(CheckResult("regime.batch_slice", "batch_slice", "fail" if run.failures else "pass",
                                      f"first {rows} of {b} rows"))
        out.notes.append(f"{n} differentiated elements: the regimes run on the first {rows} of {b} rows (leading "
                         f"dimension) to bound memory and time")
        op.args = sliced
        return run


class _Progress:
    """Progress of a long audit on stderr, only when stderr is a terminal (never in logs, CI or pipes).

    # NOTE [Cost before a long audit]
    # Each regime costs about what the given inputs' gradient suite cost; when that adds up to more than
    # LONG_AUDIT_S the audit says so once, with the estimate, before spending it.
    """

    LONG_AUDIT_S = 10.0

    def __init__(self, op: str, total: int, given_s: float):
        self.total = total
        self.on = bool(getattr(sys.stderr, "isatty", lambda: False)()) and total > 0
        estimate = given_s * total
        if self.on and estimate > self.LONG_AUDIT_S:
            print(f"gradguard.check_op: {op}: {total} regimes left, about {estimate:.0f} s "
                  f"(regimes=[...] or checks=('gradient',) makes it shorter)", file=sys.stderr)

    def step(self, n: int, name: str) -> None:
        if self.on:
            print(f"\r  check_op regime {n}/{self.total}: {name:<24}", end="", file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.on:
            print("\r" + " " * 60 + "\r", end="", file=sys.stderr, flush=True)


def _budget_order(regimes: list[Regime]) -> list[Regime]:
    """NOTE [Budget]: argument regimes first, one value of each argument in turn (negative dims first: the mapping of
    negative dims is where dim bugs hide), then the others in their usual order."""
    by_arg: dict[str, list[Regime]] = {}
    for r in regimes:
        if r.arg_name is not None:
            by_arg.setdefault(r.arg_name, []).append(r)
    for rs in by_arg.values():
        rs.sort(key=lambda r: r.name == "reduction_dim" and "-> " in r.description
                and not r.description.split("-> ")[-1].split("=")[-1].startswith("-"))
    turns = []
    while any(by_arg.values()):
        for rs in by_arg.values():
            if rs:
                turns.append(rs.pop(0))
    return turns + [r for r in regimes if r.arg_name is None]
