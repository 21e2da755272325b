"""MindSpore-only checks of ``check_op`` (``framework_checks`` of ``MindSporeCheckAdapter``).

# NOTE [What MindSpore lets through]
# MindSpore accepts a custom ``bprop`` that breaks its contract without an error, and these are the checks
# for it; each is ``(audit, base_run) -> (failures, check_results, notes)`` (see NOTE [One audit engine]):
#   bprop.return_type        bprop must return a tuple (a bare tensor is accepted);
#   bprop.extra_gradients    more gradients than inputs: the extras are silently dropped;
#   bprop.missing_gradients  fewer gradients than inputs;
#   bprop.dtype              a gradient in another dtype than its input is silently cast back (a float32
#                            bprop on float64 inputs then looks float64);
#   weights.missing_gradient a Cell with Parameters and a bprop: MindSpore returns zero weight gradients;
#   weights.gradient         weight gradients against central differences;
#   mode.graph               the gradient must compile under GRAPH_MODE and equal PyNative's for the same
#                            cotangent (and is wrong with it when PyNative's gradient failed).
"""

from __future__ import annotations

import numpy as np
import mindspore as ms
from mindspore import nn

from ...checks.adapter_base import first_line
from ...checks.report import CheckResult, Failure
from ...checks.runs import compare
from ...checks.tolerances import TOLERANCES, gradient_floor, weight_step, written
from ...core.internal import log_fallback

__all__ = ["FRAMEWORK_CHECKS", "has_bprop"]

_GIVEN = "given"


def has_bprop(op) -> bool:
    return isinstance(op, nn.Cell) and callable(getattr(type(op), "bprop", None))


def _cotangents(audit, base) -> tuple[list, list[int] | None]:
    """Cotangent tensors for ``base.U[0]`` and their outputs' top-level positions (None: nested deeper than a tuple)."""
    B, lin = audit.B, base.lin_d
    cots = [B.from_numpy(u, o) for u, o in zip(base.U[0], lin.out_tensors)]
    positions = []
    for name in lin.out_names:
        if name == "output" and len(lin.all_outputs) == 1:
            positions.append(-1)
        elif name.startswith("output[") and name.endswith("]") and name[7:-1].isdigit():
            positions.append(int(name[7:-1]))
        else:
            return cots, None
    return cots, positions


class _Weighted(nn.Cell):
    """L(x) = sum_k <op(x)[p_k], c_k>: a Cell, so graph mode can compile it (it parses source, not lambdas)."""

    def __init__(self, inner, cotangents, positions):
        super().__init__()
        self.inner = inner
        self.cotangents = tuple(cotangents)
        self.positions = tuple(positions)
        self.single = positions == [-1]

    def construct(self, *xs):
        out = self.inner(*xs)
        if self.single:
            return (out * self.cotangents[0]).sum()
        total = (out[self.positions[0]] * self.cotangents[0]).sum()
        for k in range(1, len(self.cotangents)):
            total = total + (out[self.positions[k]] * self.cotangents[k]).sum()
        return total


def _grad_position(wrt):
    return wrt[0] if len(wrt) == 1 else tuple(wrt)


def _as_list(g) -> list:
    return list(g) if isinstance(g, (tuple, list)) else [g]


_BPROP_CHECKS = ("bprop.return_type", "bprop.extra_gradients", "bprop.missing_gradients", "bprop.dtype")


def _call_bprop(audit, base, op, xs):
    """``op.bprop(*xs, out, dout)`` with the forward's output and the base run's cotangent."""
    B = audit.B
    out = op(*xs, **audit.kwargs)
    cots, positions = _cotangents(audit, base)
    if positions is None:
        raise ValueError("outputs nested deeper than one tuple")
    if positions == [-1]:
        dout = cots[0]
    else:
        dout = tuple(cots[positions.index(k)] if k in positions else (ms.ops.zeros_like(o) if B.is_tensor(o) else o)
                     for k, o in enumerate(out))
    return op.bprop(*xs, out, dout)


def check_bprop_contract(audit, base):
    """Call the Cell's ``bprop`` directly with the forward's output and a random cotangent; inspect what it returns."""
    op, B = audit.fn, audit.B
    if not has_bprop(op):
        return [], [], []
    xs = B.prepare(audit.args, ())[0]  # fresh copies of the inputs
    try:
        result = _call_bprop(audit, base, op, xs)
    except Exception as error:
        why = f"calling {type(op).__name__}.bprop(*inputs, out, dout) directly raised {first_line(error)}"
        return ([], [CheckResult(c, _GIVEN, "skip", why) for c in _BPROP_CHECKS],
                [f"{why}; its return value was not inspected"])
    n = len(xs)
    cell = type(op).__name__
    found: list[Failure] = []
    if not isinstance(result, tuple):
        found.append(Failure(
            check="bprop.return_type", regime=_GIVEN,
            message=f"{cell}.bprop returned {type(result).__name__}, not a tuple of {n} gradient(s)",
            why="MindSpore accepts a bare tensor without an error in PyNative mode, but a bprop's result is matched "
                "to the inputs by position: with several inputs, or in graph mode, a non-tuple is misread or rejected.",
            fix="return a tuple with one gradient per input of construct, in order: return "
                f"({', '.join('d' + (m if m.isidentifier() else f'x{k}') for k, m in enumerate(audit.names))}"
                f"{',' if n == 1 else ''})"))
        result = (result,)
    if len(result) > n:
        found.append(Failure(
            check="bprop.extra_gradients", regime=_GIVEN,
            message=f"{cell}.bprop returned {len(result)} gradients for {n} input(s); MindSpore silently ignores the "
                    f"extra {len(result) - n}",
            why="the gradients are matched to the inputs by position, so extra ones usually mean they are in the "
                "wrong order, or meant for inputs construct no longer takes: the input gradients may be wrong with "
                "no error.",
            fix="return exactly one gradient per input of construct (not per Parameter, not for out or dout), in "
                "the order of construct's arguments."))
    elif len(result) < n:
        found.append(Failure(
            check="bprop.missing_gradients", regime=_GIVEN,
            message=f"{cell}.bprop returned {len(result)} gradient(s) for {n} inputs",
            why="MindSpore needs one gradient per input of construct; with fewer, the backward raises or the "
                "gradients land on the wrong inputs.",
            fix="return a gradient for every input (ms.ops.zeros_like(x) for an input that gets none)."))
    for i, (g, x) in enumerate(zip(result, xs)):
        if not (B.is_tensor(g) and B.is_tensor(x) and B.kind(x) == "float") or g.dtype == x.dtype:
            continue
        found.append(Failure(
            check="bprop.dtype", regime=_GIVEN, input=audit.names[i],
            message=f"bprop returned {g.dtype} for {audit.names[i]} of dtype {x.dtype}; MindSpore silently casts it "
                    f"to {x.dtype}, so the result's dtype hides the lower-precision computation",
            why=f"the gradient is computed in {g.dtype} and only cast afterwards: it carries {g.dtype} rounding error "
                f"under a {x.dtype} dtype, which tolerances chosen for {x.dtype} do not expect.",
            fix=f"compute the gradient in the input's dtype (no .astype in bprop), or, if {g.dtype} is intended, "
                f"cast it back explicitly and document the precision."))
    return found, [CheckResult(c, _GIVEN, "fail" if any(f.check == c for f in found) else "pass")
                   for c in _BPROP_CHECKS], []


def _finite_difference(weighted, xs, p, original, v, h) -> float:
    try:
        p.set_data(ms.Tensor(original + h * v).astype(p.dtype))
        plus = float(weighted(*xs).astype(ms.float64).asnumpy())
        p.set_data(ms.Tensor(original - h * v).astype(p.dtype))
        minus = float(weighted(*xs).astype(ms.float64).asnumpy())
    finally:
        p.set_data(ms.Tensor(original).astype(p.dtype))
    return (plus - minus) / (2.0 * h)


def check_weights(audit, base):
    """Weight gradients of a Cell's Parameters (PyNative) against central differences of the same weighted output."""
    op, B = audit.fn, audit.B
    if not isinstance(op, nn.Cell) or not op.trainable_params():
        return [], [], []
    checks = ("weights.missing_gradient", "weights.gradient")
    cots, positions = _cotangents(audit, base)
    if positions is None or audit.kwargs:
        why = ("outputs nested deeper than one tuple" if positions is None else
               "kwargs are not passed to weight gradients")
        return [], [CheckResult(c, _GIVEN, "skip", why) for c in checks], []
    params = op.trainable_params()
    weighted = _Weighted(op, cots, positions)
    xs = B.prepare(audit.args, ())[0]
    try:
        _, wgrads = ms.grad(weighted, grad_position=_grad_position(audit.wrt), weights=params)(*xs)
    except Exception as error:
        why = f"weight gradients could not be computed: {first_line(error)}"
        return [], [CheckResult(c, _GIVEN, "skip", why) for c in checks], [why]
    rng = np.random.default_rng(audit.opts["seed"] + 2000)
    found = []
    for p, gw in zip(params, _as_list(wgrads)):
        analytic_full = B.to_numpy(gw)
        worst = _worst_probe(audit, weighted, xs, p, analytic_full, rng)
        if worst is not None:
            found.append(_weight_failure(p, worst, analytic_full, has_bprop(op)))
    return found, [CheckResult(c, _GIVEN, "fail" if any(f.check == c for f in found) else "pass") for c in checks], []


def _worst_probe(audit, weighted, xs, p, analytic_full, rng):
    """(analytic, numeric, allowed) of the random direction that disagrees most beyond tolerance, or None."""
    B = audit.B
    original = B.to_numpy(p)
    eps = B.eps(B.dtype_name(p))
    h = weight_step(B.dtype_name(p), eps) * max(1.0, float(np.max(np.abs(original), initial=0.0)))
    rounding = TOLERANCES["gradient.numerical.rounding"].of(eps)
    rtol, richardson, tiny = (TOLERANCES[k] for k in
                              ("gradient.numerical.rtol", "gradient.numerical.richardson", "tiny"))
    level = abs(float(weighted(*xs).astype(ms.float64).asnumpy()))
    worst = None
    for _ in range(max(1, audit.opts["probes"] - 1)):
        v = rng.standard_normal(original.shape)
        numeric = _finite_difference(weighted, xs, p, original, v, h)
        half = _finite_difference(weighted, xs, p, original, v, h / 2.0)
        analytic = float(np.sum(analytic_full * v))
        allowed = rounding * level / h + rtol * (abs(numeric) + abs(analytic)) + richardson * abs(numeric - half) + tiny
        if abs(analytic - numeric) > allowed and (worst is None or abs(analytic - numeric) > abs(worst[0] - worst[1])):
            worst = (analytic, numeric, allowed)
    return worst


_WEIGHT_RULE = f"(rounding + {written(TOLERANCES['gradient.numerical.rtol'])} relative + Richardson)"


def _weight_failure(p, worst, analytic_full, with_bprop) -> Failure:
    analytic, numeric, allowed = worst
    if not np.any(analytic_full):
        return Failure(
            check="weights.missing_gradient", regime=_GIVEN, input=p.name,
            message=f"the gradient of Parameter {p.name!r} is all zeros, but the output depends on it "
                    f"(directional derivative by central differences {numeric:.6g})",
            max_abs_err=abs(numeric), tolerance=f"{allowed:.3g} {_WEIGHT_RULE}",
            why=("MindSpore does not differentiate the Parameters of a Cell with a custom bprop: it returns zero "
                 "weight gradients without an error, so the Parameter never trains." if with_bprop else
                 "the weight gradient is lost (a stop_gradient or a detached copy of the Parameter in construct)."),
            fix=("pass the Parameter to the Cell as an input (so bprop returns its gradient), or drop the custom "
                 "bprop and let MindSpore differentiate construct." if with_bprop else
                 "use the Parameter itself in construct, not a copy, and keep it out of stop_gradient."))
    return Failure(
        check="weights.gradient", regime=_GIVEN, input=p.name,
        message=f"the gradient of Parameter {p.name!r} disagrees with central differences along a random direction",
        max_abs_err=abs(analytic - numeric), tolerance=f"{allowed:.3g} {_WEIGHT_RULE}",
        where=f"<dL/d{p.name}, v>: backward {analytic:.6g}, finite differences {numeric:.6g}",
        why="the backward computes a wrong gradient for this Parameter (checked with a random non-unit cotangent).",
        fix="re-derive the Parameter's gradient in bprop (or in the custom kernel's backward).")


def check_graph_mode(audit, base):
    """``mode.graph``: the same cotangent's gradient under GRAPH_MODE compiles and equals PyNative's."""
    B = audit.B
    if "graph" not in getattr(B, "modes", ()):
        return [], [CheckResult("mode.graph", _GIVEN, "skip", "modes=('pynative',)")], []
    cots, positions = _cotangents(audit, base)
    if positions is None or audit.kwargs:
        why = "outputs nested deeper than one tuple" if positions is None else "kwargs are not passed in graph mode"
        return [], [CheckResult("mode.graph", _GIVEN, "skip", why)], [f"mode.graph not run: {why}"]
    weighted = _Weighted(audit.fn, cots, positions)
    xs = B.prepare(audit.args, ())[0]
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        grads = [B.to_numpy(g) for g in _as_list(ms.grad(weighted, grad_position=_grad_position(audit.wrt))(*xs))]
    except Exception as error:
        return [_graph_compile_failure(error)], [CheckResult("mode.graph", _GIVEN, "fail", type(error).__name__)], []
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    gradient_failed = {f.input for f in audit.findings
                       if f.regime == _GIVEN and f.check in ("gradient.numerical", "gradient.reference")}
    found = [f for f in (_compare_modes(audit, base, grads, i, pos, gradient_failed) for i, pos in enumerate(audit.wrt))
             if f is not None]
    return found, [CheckResult("mode.graph", _GIVEN, "fail" if found else "pass")], []


def _graph_compile_failure(error) -> Failure:
    return Failure(
        check="mode.graph", regime=_GIVEN,
        message=f"the op's gradient does not compile or run under GRAPH_MODE: {first_line(error)}",
        why="graph mode (ms.jit, and the default on Ascend) compiles construct and bprop from their source: what "
            "PyNative runs line by line (a Parameter used in bprop, Python the graph parser does not support, a "
            "lambda) can fail there, so the op breaks as soon as a model runs in graph mode.",
        fix="run ms.set_context(mode=ms.GRAPH_MODE) and the op's gradient to see the full error (the analyze_fail.ir "
            "it writes); keep construct and bprop within MindSpore's graph syntax, or pass modes=('pynative',) if "
            "the op is meant for PyNative only.")


def _compare_modes(audit, base, grads, i, pos, gradient_failed):
    """The ``mode.graph`` failure of the i-th differentiated input, or None when graph mode agrees and is right."""
    B = audit.B
    name = audit.names[pos]
    dt = B.dtype_name(audit.args[pos])
    pynative = np.asarray(base.g_d[0][i], dtype=np.float64)
    got = np.asarray(grads[i], dtype=np.float64) if i < len(grads) else None
    if got is None or got.shape != pynative.shape:
        return Failure(
            check="mode.graph", regime=_GIVEN, input=name,
            message=f"the gradient of {name} under GRAPH_MODE has shape "
                    f"{list(got.shape) if got is not None else 'none'}, PyNative's has {list(pynative.shape)}",
            why="PyNative sums a gradient that bprop returns in a broadcast shape down to the input's shape; graph "
                "mode does not, so the op's gradient depends on the mode.",
            fix=f"return the gradient of {name} in {name}'s own shape from bprop (sum over the broadcast axes).")
    scale = float(np.max(np.abs(pynative[np.isfinite(pynative)]), initial=0.0))
    tol = TOLERANCES["mode.graph"]
    allowed = tol.at(dt, B.eps(dt)) * scale + gradient_floor(B.eps(dt), *audit.floor_scales(i, base))
    m = compare(got, pynative, allowed)
    if not m.ok:
        idx = ", ".join(map(str, m.index or ()))
        return Failure(
            check="mode.graph", regime=_GIVEN, input=name,
            message=f"the gradient of {name} under GRAPH_MODE differs from PyNative's for the same cotangent",
            max_abs_err=m.max_abs, max_rel_err=m.max_rel,
            tolerance=f"{tol.float64:g} x max|PyNative gradient|" if dt == "float64" else
            f"{tol.ulps:g} ulp x max|PyNative gradient| ({dt})",
            where=f"{name}[{idx}]: graph {m.got:.6g}, PyNative {m.expected:.6g}",
            why="graph mode compiles construct and bprop differently from PyNative's line-by-line run (a Python "
                "branch or global read once at compile time, a bprop graph mode does not use): the op trains "
                "differently depending on the mode.",
            fix="make construct and bprop pure functions of their inputs (no Python state, no data-dependent "
                "Python control flow), then re-run check_op.")
    if name in gradient_failed:
        return Failure(
            check="mode.graph", regime=_GIVEN, input=name,
            message=f"the gradient of {name} under GRAPH_MODE is wrong too: it equals PyNative's, which fails the "
                    f"gradient check above",
            why="graph mode uses the same bprop, so the same mistake is in both modes.",
            fix="fix the gradient (see the first failure); graph mode follows.")
    return None


def _guarded(check, names):
    """A framework check that cannot crash the audit: an unexpected error skips its checks, with the reason."""

    def run(audit, base):
        try:
            return check(audit, base)
        except Exception as error:
            log_fallback("backends.mindspore", f"check_op's {check.__name__}", error)
            why = f"not run: the check itself failed ({first_line(error)})"
            return [], [CheckResult(c, _GIVEN, "skip", why) for c in names], [f"{', '.join(names)} {why}"]

    run.__name__ = check.__name__
    return run


FRAMEWORK_CHECKS = (
    _guarded(check_bprop_contract, _BPROP_CHECKS),
    _guarded(check_weights, ("weights.missing_gradient", "weights.gradient")),
    _guarded(check_graph_mode, ("mode.graph",)),
)
