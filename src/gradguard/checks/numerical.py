"""Float64 numerics for ``check_op``: finite-difference probes and tolerant comparisons (numpy only).

# NOTE [Directional probes]
# A VJP ``g = J^T u`` is checked without building J: for a tangent ``w`` the scalar ``<u, J w>`` from
# central differences must equal ``<g, w>``. One finite-difference pair per tangent checks every
# cotangent at once, so K tangents x K cotangents give K^2 checks for 2K forward calls. Cotangents are
# random and non-unit, so a backward that squares (or ignores) its upstream gradient is caught, which
# ``torch.autograd.gradcheck``'s unit cotangents cannot do. Small inputs (<= ``full_jacobian_max``
# elements) use the basis tangents instead: that is the full Jacobian, and failures point at elements.
#
# The allowed errors are NOTE [Tolerances] in ``tolerances``, which holds every value they use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .tolerances import TOLERANCES

__all__ = ["Mismatch", "compare", "step_size", "EPS64", "Cotangents"]

EPS64 = float(np.finfo(np.float64).eps)


@dataclass
class Mismatch:
    """Outcome of a tolerant comparison; ``ok`` False means at least one element exceeded its tolerance."""

    ok: bool
    max_abs: float = 0.0
    max_rel: float = 0.0
    index: tuple[int, ...] | None = None
    got: float | None = None
    expected: float | None = None


def compare(got: np.ndarray, expected: np.ndarray, allowed: np.ndarray | float) -> Mismatch:
    """Element-wise ``|got - expected| <= allowed``. Non-finite values must match exactly (nan vs nan ok).

    ``max_rel`` is relative to the largest expected magnitude (a per-element relative error explodes on
    elements that are zero by chance).
    """
    got = np.asarray(got, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    if got.shape != expected.shape:
        got = np.broadcast_to(got, expected.shape) if got.size == 1 else got.reshape(expected.shape)
    allowed = np.broadcast_to(np.asarray(allowed, dtype=np.float64), expected.shape)
    if expected.size == 0:
        return Mismatch(ok=True)
    fin_e = np.isfinite(expected)
    all_finite = bool(fin_e.all()) and bool(np.isfinite(got).all())
    with np.errstate(invalid="ignore", over="ignore"):
        if all_finite:  # the usual case, without the masks below (which then change nothing)
            diff = np.abs(got - expected)
        else:
            fin_g = np.isfinite(got)
            diff = np.where(fin_e & fin_g, np.abs(got - expected), 0.0)
            same_nonfinite = (~fin_e) & (~fin_g) & ((np.isnan(got) & np.isnan(expected)) | (got == expected))
            bad_finite = fin_e != fin_g
            diff = np.where(bad_finite | ((~fin_e) & (~fin_g) & ~same_nonfinite), np.inf, diff)
        excess = diff - allowed
    scale = float(np.max(np.abs(expected if all_finite else np.where(fin_e, expected, 0.0))))
    max_abs = float(np.max(diff))
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
    if bool(np.all(diff <= allowed)):  # the usual case: where the worst element is matters only to a failure
        return Mismatch(ok=True, max_abs=max_abs, max_rel=max_rel)
    worst = int(np.argmax(np.where(np.isfinite(excess), excess, np.inf)))
    idx = tuple(int(i) for i in np.unravel_index(worst, expected.shape)) if expected.ndim else ()
    return Mismatch(ok=False, max_abs=max_abs, max_rel=max_rel, index=idx, got=float(got.reshape(-1)[worst]),
                    expected=float(expected.reshape(-1)[worst]))


def step_size(x: np.ndarray, rel: float = TOLERANCES["gradient.numerical.step"]) -> float:
    """Finite-difference step for one input: relative to its magnitude, at least ``rel``."""
    finite = x[np.isfinite(x)]
    mag = float(np.max(np.abs(finite))) if finite.size else 1.0
    return rel * max(1.0, mag)


def dot(us: Sequence[np.ndarray], vs: Sequence[np.ndarray]) -> float:
    return float(sum(np.sum(u * v) for u, v in zip(us, vs)))


def absdot(us: Sequence[np.ndarray], vs: Sequence[np.ndarray]) -> float:
    with np.errstate(invalid="ignore", over="ignore"):
        return float(sum(np.sum(np.abs(u) * np.abs(v)) for u, v in zip(us, vs)))


class Cotangents:
    """The K cotangents of a run stacked per output, so ``<u_k, v>`` and ``<|u_k|, |v|>`` come for every k at once.

    Each row is the same contiguous product that ``dot`` / ``absdot`` form for one k, summed the same way
    (numpy's pairwise sum along a contiguous row, outputs added in order to 0.0), so the numbers are the same
    bit for bit; only the Python loop over k is gone. ``fits`` says whether values have the cotangents' sizes
    (when not, use ``dot`` / ``absdot`` per k, which broadcast).
    """

    def __init__(self, U: Sequence[Sequence[np.ndarray]]):
        self.K = len(U)
        n_out = len(U[0]) if U else 0
        self.rows = [np.stack([np.asarray(us[o]).reshape(-1) for us in U]) for o in range(n_out)]
        self.abs_rows = [np.abs(r) for r in self.rows]

    def fits(self, vs: Sequence[np.ndarray]) -> bool:
        return len(vs) == len(self.rows) and all(np.size(v) == r.shape[1] for v, r in zip(vs, self.rows))

    def dot(self, vs: Sequence[np.ndarray], absolute: bool = False) -> np.ndarray:
        """``[dot(u_k, vs) for k]`` (``absdot`` with ``absolute``) as an array."""
        acc = np.zeros(self.K)
        with np.errstate(invalid="ignore", over="ignore"):
            for r, v in zip(self.abs_rows if absolute else self.rows, vs):
                v = np.asarray(v)
                acc = acc + np.sum(r * (np.abs(v) if absolute else v).reshape(-1), axis=1)
        return acc

    def absdot(self, vs: Sequence[np.ndarray]) -> np.ndarray:
        return self.dot(vs, absolute=True)
