"""The reproducer printed under a finding, and the ``op.raised`` finding for an op that crashed."""

from __future__ import annotations

from .op_raised import OpRaised
from .regimes import Regime
from .report import Failure
from .subject import Subject

__all__ = ["repro", "raised_finding"]


def repro(op: Subject, args, regime: Regime | None) -> str:
    """The inputs as source (or described, when too large) and the ``check_op`` call that reproduces a finding."""
    B = op.B
    lines = []
    for name, a in zip(op.names, args):
        if not B.is_tensor(a):
            lines.append(f"{name} = {a!r}")
        elif B.numel(a) <= 64:
            lines.append(f"{name} = {B.literal(a)}")
        else:
            v = B.to_numpy(a)
            lines.append(f"{name}: {B.describe(a)}, values in [{v.min():.4g}, {v.max():.4g}] "
                         f"(too large to print; the {regime.name if regime else 'given'} regime of your inputs, seed={op.opts['seed']})")
    if regime is not None and regime.spec.layout:
        lines.append(f"# then: {regime.description}")
    call = ", ".join(op.names)
    kw = ", ".join(f"{k}={v!r}" for k, v in op.kwargs.items())
    lines.append(f"gradguard.check_op(fn, {call}{', kwargs=dict(' + kw + ')' if kw else ''}{', reference=reference' if op.reference else ''})")
    return "\n".join(lines)


def raised_finding(op: Subject, exc: OpRaised, regime: str) -> Failure:
    err = exc.error
    where = ""
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is not None:
        where = f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno} in {tb.tb_frame.f_code.co_name}"
    return Failure(check="op.raised", regime=regime,
                   message=f"fn's {exc.phase} raised {type(err).__name__}: {str(err)[:300]}"
                           + (f" (inputs: {exc.dtype})" if exc.dtype else ""),
                   where=where or None,
                   why=("the op runs with autograd on but crashes with it off (evaluation loops, finite differences): "
                        "a branch for inputs that do not require grad." if exc.autograd_off else
                        f"the op fails on the inputs as given, so no gradient can be checked; every other check "
                        f"depends on a {exc.phase} that runs."),
                   fix=f"fix the {exc.phase} (the line above is where it raised), then re-run check_op.",
                   repro=repro(op, op.args, None))
