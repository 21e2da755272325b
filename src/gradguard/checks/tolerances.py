"""Every numeric tolerance and threshold ``check_op`` uses, in one table (as torch keeps its comparison tolerances in
``torch/testing/_comparison.py``'s one ``_DTYPE_PRECISIONS``).

``TOLERANCES`` is keyed by what a value is for: the check it belongs to (the names reports use), then the part of
that check's rule. Most checks compare in some dtype relative to the largest magnitude compared, so a value is often
per dtype: ``Rel(float64=..., ulps=...)`` is a fixed relative tolerance for float64 comparisons and a number of ulps
(the machine epsilon of the dtype, ``AdapterBase.eps``) for every other dtype; ``Ulps(n)`` is n ulps in any dtype; a
``{dtype: value}`` dict lists dtypes one by one. The checks read values from here and the report text is written from
the same entries, so a value changed here changes the verdicts and the text together.

# NOTE [Tolerances]
# Finite-difference error has two parts: rounding, about eps64 x |f| / h per component, and
# truncation, relative O(h^2). The allowed error for <u, Jw> is
#     rounding_ulps x eps x sum|u||f(x)| / h  +  rtol x (sum|u||Jw| + sum|g||w|)
# (``gradient.numerical.*`` below) i.e. rounding plus ``rtol`` relative to the magnitude of the terms summed, so
# cancellation in the dot product cannot cause false alarms. Low-precision comparisons use tolerances derived from a
# reference's own error against float64 (see ``audit``), never fixed per-dtype constants alone.
#
# NOTE [Tolerance floor]
# Tolerances relative to max|gradient| vanish when the gradient does (saturated softmax: 5e-10 x 1e-9).
# Every gradient comparison adds an absolute floor in gradient units from the scales of the problem:
# 64 ulp (1e-9 in float64) x max|u| x max(max|f|, max|inputs|) / max(1, max|x|): rounding a correct implementation
# makes anyway. The inputs count too: outputs that cancel to exactly 0 (layer norm over one feature) leave the
# gradient at rounding noise of the inputs' scale, which a floor of 0 would call a 100% error. ``gradient_floor``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["TOLERANCES", "Rel", "Ulps", "gradient_floor", "difference_step", "difference_rtol", "weight_step", "written"]


@dataclass(frozen=True)
class Rel:
    """Relative to the largest magnitude compared: ``float64`` in float64, ``ulps`` x the dtype's eps in any other."""

    float64: float
    ulps: float

    def at(self, dtype: str, eps: float) -> float:
        """The relative tolerance for a comparison made in ``dtype``, whose machine epsilon is ``eps``."""
        return self.float64 if dtype == "float64" else self.ulps * eps


@dataclass(frozen=True)
class Ulps:
    """``n`` units in the last place of whatever dtype the comparison is made in."""

    n: float

    def of(self, eps: float) -> float:
        """``n`` ulps of a dtype whose machine epsilon is ``eps``."""
        return self.n * eps


TOLERANCES: dict[str, Any] = {
    # ---- gradient.numerical: central differences (NOTE [Tolerances]; also MindSpore's weights.gradient) ----------------
    # default ``rtol=``: truncation at the float64 step is ~1e-12 and rounding ~1e-8, a wrong backward is off by O(1)
    "gradient.numerical.rtol": 1e-4,
    # float64 step, relative to max(1, max|x|): rounding (eps64 / h ~ 2e-10) and truncation (h^2) both far below rtol
    "gradient.numerical.step": 1e-6,
    # rounding of f(x +- h), per unit of sum|u||f| / h: a correct op's own rounding (reductions) with room to spare
    "gradient.numerical.rounding": Ulps(64),
    # below float64 the step is eps^(1/2): rounding noise eps / h stays at sqrt(eps), Richardson bounds the truncation
    "gradient.numerical.low_step_exponent": 0.5,
    # below float64 rtol is at least this x eps^(1/2), 10 times the relative error a step of eps^(1/2) leaves
    "gradient.numerical.low_rtol_factor": 10,
    # below float64, this x |D(h) - D(h/2)| is added: the two steps' disagreement bounds the truncation, with margin
    "gradient.numerical.richardson": 4.0,
    # ---- NOTE [Effective precision]: does the float64 op see a 2^-40 step of its inputs? ---------------------------
    # rounding of the two float64 output sets subtracted, per unit of sum|u||f|
    "effective_precision.rounding": Ulps(64),
    # a float64 op follows the short step to ~1e-4 relative (rounding, curvature); one blind to it misses O(1) of it
    "effective_precision.missed": 1e-2,
    # below this the long step moved the outputs by nothing measurable (constant or underflowed): no verdict
    "effective_precision.min_scale": 1e-200,
    # ---- NOTE [Tolerance floor] ---------------------------------------------------------------------------------------
    # 64 ulp of the dtype, at least float64 comparisons' 1e-9: rounding amplified inside a correct op (1/sqrt(var + eps)
    # with var = 0) is not a failure
    "floor": Rel(float64=1e-9, ulps=64),
    # ---- forward.reference and gradient.reference ---------------------------------------------------------------------
    # float64 op vs float64 reference: two correct formulas round differently, amplified by the op's conditioning;
    # a reference with no float64 run: 64 ulp of the dtype
    "reference": Rel(float64=1e-9, ulps=64),
    # default ``reference_factor=``: the op may be 5 times less accurate than the reference in its dtype (other
    # blocking and summation order), not more
    "reference.factor": 5.0,
    # added to the factor x the reference's own error: a reference exact in the dtype must not demand bit equality
    "reference.ulps": Ulps(8),
    # the float64 op vs the float64 reference once the dtype run passed: below float32's eps (1.2e-7), so a float64
    # gradient that is only float32-accurate fails; far above float64 rounding
    "reference.float64_op": 1e-7,
    # is the op's float64 gradient the reference's (finite differences disagree with both)? as reference.float64_op
    # in float64; in a lower precision 64 ulp of it
    "reference.vs_differences": Rel(float64=1e-7, ulps=64),
    # ---- gradient.precision: no reference, the op in its dtype vs its own float64 run -----------------------------------
    # about 800 ulp in float32 and complex64, 20 in float16, 13 in bfloat16: accumulated rounding of long reductions,
    # not a missing upcast or an overflow (which are off by far more); the keys are the lower float dtypes cotangents
    # are rounded to
    "gradient.precision": {"float32": 1e-4, "float16": 2e-2, "bfloat16": 1e-1, "complex64": 1e-4},
    # any other dtype is judged like float32
    "gradient.precision.other": 1e-4,
    # ---- gradient.surrogate: the backward vs the declared surrogate's float64 VJP ---------------------------------------
    # the same gradient by another formula: float64 rounding amplified by conditioning; 64 ulp in a lower precision
    "gradient.surrogate": Rel(float64=1e-7, ulps=64),
    # ---- NOTE [Kink conventions]: one-sided derivatives at the elements that differ from the reference -------------------
    # step relative to max(1, |x_j|): small enough to stay on one side of a kink, float64 rounding eps / h ~ 2e-9
    "kink.step": 1e-7,
    # relative slack on the one-sided derivatives: their own error at that step
    "kink.slack": 1e-6,
    # ---- gradient.cotangent_linearity: g(a u) = a g(u) ----------------------------------------------------------------
    # scaling u scales every product by the same factor: only rounding differs (16 ulp); float64: the float64 reference
    # level (a float64 gradient within float32's 16 ulp but not this is reported as only float32-accurate)
    "gradient.cotangent_linearity": Rel(float64=1e-9, ulps=16),
    # ---- layout regimes (noncontiguous, channels_last, reshaped): the same values in another layout -------------------
    # only the summation order changes: 16 ulp; float64 1e-12, a few thousand ulp for kernels that block differently
    "regime.layout": Rel(float64=1e-12, ulps=16),
    # ---- composition.* and mutation.backward_not_repeatable ------------------------------------------------------------
    # the op's gradient through a producer's output vs through a private copy: the same math on the same values
    "composition": Ulps(4),
    # a second backward through the same graph with the same cotangent: the same math, up to atomics' order
    "mutation.backward_not_repeatable": Ulps(4),
    # ---- MindSpore: weights.gradient (with gradient.numerical's rtol, rounding and richardson) and mode.graph ----------
    # below float64 the step is eps^(1/3), a central difference's best (rounding eps / h against truncation h^2)
    "weights.gradient.low_step_exponent": 1.0 / 3.0,
    # the same bprop compiled instead of run line by line: rounding only
    "mode.graph": Rel(float64=1e-9, ulps=64),
    # ---- regime inputs -------------------------------------------------------------------------------------------------
    # near_constant_rows: rows squeezed to their mean +- 1e-3 x deviation, a variance near a normalization's eps
    "regime.near_constant_rows.spread": 1e-3,
    # ... widened (doubling) while rows tie in a low precision, up to this
    "regime.near_constant_rows.max_spread": 0.25,
    # ---- guards -----------------------------------------------------------------------------------------------------------
    # added to allowed errors that can be exactly 0, and the scale of an all-zero array (so dividing by it cannot fail):
    # differences at the bottom of float64's range are not errors
    "tiny": 1e-300,
}


def gradient_floor(eps: float, cotangent_scale: float, output_scale: float, input_scale: float,
                   largest_input_scale: float) -> float:
    """Absolute tolerance floor in gradient units (NOTE [Tolerance floor]) for a gradient compared in a dtype with
    machine epsilon ``eps``: ``max|u|`` of the cotangent, ``max|f|`` of the outputs, ``max|x|`` of the input the
    gradient is of, and the largest ``max|x|`` of the differentiated inputs (``runs.Subject.floor_scales``)."""
    floor = TOLERANCES["floor"]
    # outputs that cancel to 0 (layer norm over one feature) say nothing of the scale the gradient was built at:
    # the inputs do (a weight's gradient there is rounding noise of x - mean(x), about eps x max|x|)
    f = max(output_scale, largest_input_scale)
    # float64 comparisons are made at 1e-9 relative (not at 64 ulp): the floor matches that level, so
    # rounding amplified inside a correct op (1/sqrt(var + eps) with var = 0) is not a failure
    rel = max(floor.ulps * eps, floor.float64)
    return rel * cotangent_scale * f / max(input_scale, 1.0)


def difference_step(low: bool, eps: float) -> float:
    """``gradient.numerical``'s step relative to max(1, max|x|): in float64, or in a lower precision with eps ``eps``."""
    return eps ** TOLERANCES["gradient.numerical.low_step_exponent"] if low else TOLERANCES["gradient.numerical.step"]


def difference_rtol(rtol: float, low: bool, eps: float) -> float:
    """``gradient.numerical``'s rtol: the ``rtol=`` option, raised in a lower precision to what its step allows."""
    if not low:
        return rtol
    return max(rtol, TOLERANCES["gradient.numerical.low_rtol_factor"] * eps ** TOLERANCES["gradient.numerical.low_step_exponent"])


def weight_step(dtype: str, eps: float) -> float:
    """MindSpore ``weights.gradient``'s step, relative to max(1, max|parameter|)."""
    if dtype == "float64":
        return TOLERANCES["gradient.numerical.step"]
    return eps ** TOLERANCES["weights.gradient.low_step_exponent"]


def written(value: float) -> str:
    """A tolerance as report text writes it in prose: ``1e-9``, ``1e-4``, ``2.5e-3`` (no exponent padding)."""
    mantissa, _, exponent = f"{value:.6e}".partition("e")
    return f"{float(mantissa):g}e{int(exponent)}"
