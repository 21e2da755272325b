"""Without a reference: ``gradient.precision`` (the op's dtype against its own float64 run) and ``gradient.nonfinite``
(at kinks, finite where the float64 gradient is)."""

from __future__ import annotations

import numpy as np

from . import numerical as num
from .runs import Sink, Suite
from .subject import Check, scale
from .tolerances import TOLERANCES

__all__ = ["PrecisionCheck", "NonfiniteCheck"]


class PrecisionCheck(Check):
    """``gradient.precision`` without a reference: the op's dtype run against its own float64 run."""

    def compare(self, s: Suite, sink: Sink) -> None:
        op, run = self.op, s.run
        ok = True
        for i in range(len(op.wrt)):
            dt = op.dtype(i)
            got = np.stack([g[i] for g in run.g_d])
            truth = np.stack([g[i] for g in run.g_64])
            rel = TOLERANCES["gradient.precision"].get(dt, TOLERANCES["gradient.precision.other"])
            m = num.compare(got, truth, rel * scale(truth) + op.floor(i, run, dt))
            if not m.ok:
                ok = False
                m.index = m.index[1:] if m.index else m.index
                name = op.names[op.wrt[i]]
                sink.fail("gradient.precision", input=name,
                          message=f"gradient of {name} in {dt} is far from the op's own float64 gradient",
                          max_abs_err=m.max_abs, max_rel_err=m.max_rel, tolerance=f"{rel:g} x max|float64 gradient|",
                          where=op.where(i, m, dt, "float64"),
                          why="overflow, cancellation or a missing upcast in low precision (the float64 run is "
                          "correct or was checked against finite differences).",
                          fix=f"accumulate in float32 (or subtract the row max / use a stable formula); pass reference= to "
                          f"judge {dt} error against a trusted implementation instead of a fixed tolerance.")
        sink.record("gradient.precision", ok)


class NonfiniteCheck(Check):
    """``gradient.nonfinite`` at kinks without a reference: finite where the float64 gradient is."""

    def compare(self, s: Suite, sink: Sink) -> None:
        op, run = self.op, s.run
        ok = True
        for i in range(len(op.wrt)):
            got = np.stack([g[i] for g in run.g_d])
            truth = np.stack([g[i] for g in run.g_64])
            bad = ~np.isfinite(got) & np.isfinite(truth)
            if bad.any():
                ok = False
                name = op.names[op.wrt[i]]
                sink.fail("gradient.nonfinite", input=name, message=f"gradient of {name} is not finite ({int(bad.sum())} elements)",
                          why="a value at a kink or boundary makes the backward divide by zero or take log(0).",
                          fix="guard the special value in backward (torch.where) the way the forward does.")
        sink.record("gradient.nonfinite", ok)
