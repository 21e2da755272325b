"""One regime of ``check_op``: its gradient suite (or layout check), in a child process when isolated, and what it adds
to the audit: failures not already seen on the given inputs, a skip when the regime does not apply, a crash."""

from __future__ import annotations

from .._errors import InvalidArgument
from .gradient_suite import GradientSuite
from .isolate import run_forked
from .layout import LayoutCheck
from .op_raised import OpRaised
from .regimes import Regime
from .report import CheckResult, Failure
from .repro import raised_finding, repro
from .runs import NotApplicable, Outcome, ReferenceRaised, Run
from .subject import Subject

__all__ = ["RegimeRun"]


class RegimeRun:
    def __init__(self, op: Subject, out: Outcome, suite: GradientSuite, isolate: bool):
        self.op = op
        self.out = out
        self.suite = suite
        self.layout = LayoutCheck(op)
        self.isolate = isolate

    def run(self, regime: Regime, base: Run, n: int):
        """``regime`` against the given inputs' run ``base`` (``n``: its place, which seeds its cotangents)."""
        op = self.op
        saved = (op.kwargs, op.wrt)
        op.kwargs = regime.kwargs if regime.kwargs is not None else op.kwargs
        op.wrt = regime.wrt if regime.wrt is not None else op.wrt
        try:
            if self.isolate and not regime.spec.layout:
                self._forked(regime, base, n)
            else:
                self._inner(regime, base, n)
        finally:
            op.kwargs, op.wrt = saved

    def _forked(self, regime: Regime, base: Run, n: int) -> None:
        """NOTE [Isolated regimes]: the regime in a child process; a crash there is this regime's failure."""
        out = self.out
        counts = len(out.checks), len(out.findings), len(out.notes)

        def work():
            self._inner(regime, base, n)
            return out.checks[counts[0]:], out.findings[counts[1]:], out.notes[counts[2]:]

        status, result = run_forked(work)
        if status == "raised":
            raise result
        if status == "ok":
            checks, findings, notes = result
            out.checks += checks
            out.findings += findings
            out.notes += notes
            return
        check = f"regime.{regime.name}"
        out.findings.append(Failure(
            check=check, regime=regime.name,
            message=f"fn crashed the process on these inputs: {result} ({regime.description})",
            why="a compiled kernel read or wrote out of bounds on inputs whose shapes or indices differ from the given "
                "ones (it trusts relations between its inputs, or sizes, without checking them).",
            fix="check the shapes and index ranges the kernel relies on before launching it (raise a clear error).",
            repro=repro(self.op, regime.args, regime)))
        out.checks.append(CheckResult(check, regime.name, "fail", result))

    def _inner(self, regime: Regime, base: Run, n: int):
        check = f"regime.{regime.name}"
        try:
            if regime.spec.layout:
                found, checks = self.layout.compare(regime, base)
                for f in found:
                    f.repro = repro(self.op, self.op.args, regime)
                self.out.findings += found
                self.out.checks += checks
                return
            run = self.suite.run(regime.args, regime.name, regime.spec, linearity=False, seed_offset=n)
        except InvalidArgument:
            raise
        except (NotApplicable, ReferenceRaised) as exc:
            why = str(exc) if isinstance(exc, NotApplicable) else f"the reference raised on these inputs ({exc})"
            self.out.checks.append(CheckResult(check, regime.name, "skip", f"regime not applicable: {why}"))
            if regime.fallback is not None:
                self._inner(regime.fallback, base, n)
            return
        except OpRaised as exc:
            self._raised(regime, exc)
            return
        self._outcome(regime, run, n)

    def _reference_raises(self, args) -> bool:
        op = self.op
        try:
            op.B.linearize(op.reference, args, op.kwargs, op.wrt)
        except OpRaised:
            return True
        return False

    def _raised(self, regime: Regime, exc: OpRaised) -> None:
        """fn raised on a regime's inputs: a skip, a failure (the reference handles them) or a warning."""
        out = self.out
        check = f"regime.{regime.name}"
        err = exc.error
        if regime.new_argument and exc.phase.startswith("forward"):
            # NOTE [Argument regimes]: an argument value the op does not support says nothing about its gradients
            out.checks.append(CheckResult(check, regime.name, "skip",
                                          f"fn rejects {regime.argument} ({type(err).__name__}: {str(err)[:120]})"))
            return
        if self.op.reference is not None and self._reference_raises(regime.args):
            out.checks.append(CheckResult(check, regime.name, "skip", "regime not applicable: the reference raises on these inputs too"))
            return
        if self.op.reference is not None:
            # NOTE [The reference runs, the op raises]: inputs the trusted implementation handles are inputs the op
            # is meant to handle (only a subset requiring grad, a size-1 feature dimension): a failure, with the
            # line it raised at. Without a reference the op may legitimately not support them: a warning.
            found = raised_finding(self.op, exc, regime.name)
            found.check = check
            found.message = f"fn's {exc.phase} raised {type(err).__name__} on inputs the reference handles ({regime.description}): {str(err)[:200]}"
            found.why = f"the reference computes these inputs, the op's {exc.phase} crashes on them."
            found.repro = repro(self.op, regime.args, regime)
            out.findings.append(found)
            out.checks.append(CheckResult(check, regime.name, "fail", type(err).__name__))
            return
        out.findings.append(Failure(check=check, regime=regime.name, severity="warning",
                                    message=f"fn's {exc.phase} raised {type(err).__name__} on these inputs ({regime.description}): {str(err)[:200]}",
                                    why="the op may not support this input (fine if documented) or crashes on it.",
                                    fix="if the op should support it, this is a bug; otherwise exclude the regime with regimes=[...]."))
        out.checks.append(CheckResult(check, regime.name, "warn", type(err).__name__))

    def _outcome(self, regime: Regime, run: Run, n: int) -> None:
        """A value regime's gradient suite ran: its failures, except those the given inputs already showed."""
        out = self.out
        check = f"regime.{regime.name}"
        out.notes += run.notes
        # A bug that already fails on the given inputs fails in most regimes too: report it once.
        given = {(f.check, f.input) for f in out.findings if f.regime == "given"}
        repeated = [f for f in run.failures if (f.check, f.input) in given]
        run.failures = [f for f in run.failures if (f.check, f.input) not in given]
        if repeated and not run.failures:
            out.checks.append(CheckResult(check, regime.name, "fail", "same failures as on the given inputs"))
            out.notes.append(f"{check} fails the same way as the given inputs ({', '.join(sorted({f.check for f in repeated}))}); not repeated")
            return
        if run.failures:
            small = self.suite.shrink(regime.args, regime.spec, run.failures, n)
            text = repro(self.op, small, regime)
            for f in run.failures:
                f.message = f"[{f.check}] {f.message} ({regime.description})"
                if regime.argument:
                    f.message += f"; fails only with {regime.argument}"
                f.check = check
                f.repro = text
            out.findings += run.failures
        out.checks.append(CheckResult(check, regime.name, "fail" if run.failures else "pass", regime.description))
