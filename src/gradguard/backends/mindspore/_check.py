"""``check_op`` for MindSpore: Cells with a custom ``bprop`` (and plain Cells / functions), in PyNative and graph mode.

Checks (each failure names its check; ``details["mode"]`` says where it held):
  * ``forward_dtype``            float64 in, float64 out;
  * ``bprop_return_type``        bprop must return a tuple (MindSpore accepts anything);
  * ``bprop_extra_gradients``    more gradients than inputs: MindSpore silently ignores the extras;
  * ``bprop_missing_gradients``  fewer gradients than inputs;
  * ``bprop_dtype``              a gradient's dtype differs from its input's: MindSpore silently casts it back
                                 (a float32 bprop on float64 input passes any dtype check after the cast);
  * ``gradient``                 vjp (``ms.grad``) vs float64 central differences, random non-unit cotangent;
  * ``precision``                right only to float32 level;
  * ``missing_weight_gradient``  a Cell with Parameters and a bprop: MindSpore returns zero weight gradients
                                 without an error;
  * ``weight_gradient``          weight gradients disagree with central differences;
  * ``graph_mode``               the op fails to compile, or its gradient differs, under GRAPH_MODE.
"""

from __future__ import annotations

import numpy as np
import mindspore as ms
from mindspore import nn

from ..._errors import InvalidArgument
from ...core._numeric import CheckFailure, OpCheckReport, check_gradients, random_cotangents
from ...core._internal import log_fallback

__all__ = ["check_op"]


class _Weighted(nn.Cell):
    """L(x) = sum_k <op(x)_k, c_k>: a Cell so that graph mode can compile it (lambdas cannot be parsed)."""

    def __init__(self, inner, cotangents, multi):
        super().__init__()
        self.inner = inner
        self.cotangents = cotangents
        self.multi = multi

    def construct(self, *xs):
        out = self.inner(*xs)
        if self.multi:
            total = (out[0] * self.cotangents[0]).sum()
            for i in range(1, len(self.cotangents)):
                total = total + (out[i] * self.cotangents[i]).sum()
            return total
        return (out * self.cotangents[0]).sum()


def _setup() -> None:
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        ms.runtime.launch_blocking()  # kernel errors at the right line, and ~10x less sync latency on CPU
    except Exception as error:
        log_fallback("backends.mindspore", "ms.runtime.launch_blocking()", error)


def _outs(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _grad_tuple(g, n) -> list:
    return list(g) if isinstance(g, (tuple, list)) else [g]


def check_op(op, *inputs, modes=("pynative", "graph"), eps: float = 1e-6, atol: float = 1e-5, rtol: float = 1e-3,
             probes: int = 3, seed: int = 0, precision: bool = True, name: str | None = None, reference=None,
             **unsupported) -> OpCheckReport:
    """Audit ``op`` (an ``nn.Cell``, typically with a custom ``bprop``, or a function) at ``inputs`` in float64.

    ``reference``: a trusted Cell or function of the same inputs; outputs and the vjp of the same random
    cotangent must match it in float64 (``forward.reference``, ``gradient.reference``, PyNative).
    """
    if unsupported:
        key = sorted(unsupported)[0]
        raise InvalidArgument(
            f"check_op: option {key!r} is not supported by the MindSpore check_op yet (it is a torch check_op option); "
            f"MindSpore's check_op takes modes, eps, atol, rtol, probes, seed, precision, name and reference. "
            f"Remove {key}=...")
    if reference is not None and not callable(reference):
        raise InvalidArgument(f"check_op: reference must be callable or None; got {type(reference).__name__}.")
    previous = ms.get_context("mode")
    _setup()
    label = name or (type(op).__name__ if isinstance(op, nn.Cell) else getattr(op, "__qualname__", repr(op)))
    report = OpCheckReport(op=label, backend=f"mindspore {ms.__version__} ({ms.get_context('device_target')})",
                           modes=list(modes))
    try:
        _run(op, inputs, modes, eps, atol, rtol, probes, seed, precision, report, reference)
    finally:
        ms.set_context(mode=previous)
    return report


def _run(op, inputs, modes, eps, atol, rtol, probes, seed, precision, report, reference=None) -> None:
    rng = np.random.default_rng(seed)
    arrays = [np.array(x.asnumpy() if isinstance(x, ms.Tensor) else x, dtype=np.float64, copy=True) for x in inputs]
    xs = [ms.Tensor(a, ms.float64) for a in arrays]
    n = len(xs)
    out = op(*xs)
    outs = _outs(out)
    report.checks.append("forward_dtype")
    bad = [str(o.dtype) for o in outs if o.dtype != ms.float64]
    if bad:
        report.failures.append(CheckFailure("forward_dtype", f"for float64 inputs the op returned {', '.join(bad)}",
                                            {"dtypes": bad, "mode": "pynative"}))
        return
    cot_arrays = random_cotangents([tuple(o.shape) for o in outs], rng)
    cots = tuple(ms.Tensor(c, ms.float64) for c in cot_arrays)
    has_bprop = isinstance(op, nn.Cell) and callable(getattr(type(op), "bprop", None))
    if has_bprop:
        _check_bprop(op, xs, out, cots, report)

    def forward(arrs):
        return [o.asnumpy() for o in _outs(op(*[ms.Tensor(a, ms.float64) for a in arrs]))]

    weighted = _Weighted(op, cots, len(outs) > 1 or isinstance(out, (tuple, list)))
    position = 0 if n == 1 else tuple(range(n))
    analytic: dict[str, list] = {}
    for mode in modes:
        ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
        try:
            analytic[mode] = [g.asnumpy() for g in _grad_tuple(ms.grad(weighted, grad_position=position)(*xs), n)]
        except Exception as error:
            report.failures.append(CheckFailure("graph_mode" if mode == "graph" else "gradient",
                                                f"ms.grad failed in {mode} mode: {type(error).__name__}: "
                                                f"{str(error).splitlines()[0] if str(error) else ''}",
                                                {"mode": mode}))
        finally:
            ms.set_context(mode=ms.PYNATIVE_MODE)
    if "gradient" not in report.checks:
        report.checks += ["gradient"] + (["precision"] if precision else [])
    for mode, grads in analytic.items():
        shapes = [tuple(g.shape) for g in grads]
        if shapes != [a.shape for a in arrays]:
            report.failures.append(CheckFailure("gradient", f"{mode}: gradient shapes {shapes} differ from input "
                                                f"shapes {[a.shape for a in arrays]}", {"mode": mode}))
            continue
        result = check_gradients(forward, grads, arrays, cot_arrays, eps=eps, atol=atol, rtol=rtol, probes=probes,
                                 rng=np.random.default_rng(seed + 1))
        report.max_abs_err = max(report.max_abs_err or 0.0, result.max_abs_err)
        check = "gradient" if mode == "pynative" else "graph_mode"
        if not result.passed:
            w = result.worst or {}
            where = f"input {w['input']} at {list(w['index'])}" if "input" in w else f"probe {w.get('probe')}"
            report.failures.append(CheckFailure(
                check, f"{mode}: analytic and numerical gradients differ (max abs err {result.max_abs_err:.3e}); "
                f"worst: {where}: analytic {w.get('analytic', 0):.6g}, numeric {w.get('numeric', 0):.6g}",
                {"mode": mode, "worst": w}))
        elif precision and not result.precise:
            report.failures.append(CheckFailure(
                "precision", f"{mode}: gradient agrees only to {result.max_abs_err:.1e} in float64 (expected ~1e-10): "
                "the backward computes in lower precision and MindSpore casts the result back to float64 silently",
                {"mode": mode, "worst": result.worst}))
    if "pynative" in analytic and "graph" in analytic:
        report.checks.append("graph_mode")
    if reference is not None and "pynative" in analytic:
        _compare_with_reference(report, reference, xs, outs, cots, analytic["pynative"], len(outs) > 1 or isinstance(out, (tuple, list)), position)
    if isinstance(op, nn.Cell) and op.trainable_params():
        _check_weights(op, xs, weighted, position, report, eps, rng, has_bprop)


_REFERENCE_RTOL = 1e-9


def _compare_with_reference(report, reference, xs, outs, cots, analytic, multi, position) -> None:
    report.checks += ["forward.reference", "gradient.reference"]
    ref_outs = _outs(reference(*xs))
    if [tuple(o.shape) for o in ref_outs] != [tuple(o.shape) for o in outs]:
        raise InvalidArgument(
            f"check_op: reference returned outputs of shapes {[list(o.shape) for o in ref_outs]} but the op returned "
            f"{[list(o.shape) for o in outs]}; the reference must compute the same function as the op.")
    for k, (mine, theirs) in enumerate(zip(outs, ref_outs)):
        a, b = mine.asnumpy().astype(np.float64), theirs.asnumpy().astype(np.float64)
        err = float(np.max(np.abs(a - b), initial=0.0))
        if err > _REFERENCE_RTOL * max(float(np.max(np.abs(b), initial=0.0)), 1e-300):
            report.failures.append(CheckFailure(
                "forward.reference", f"output {k} differs from the reference's (max abs err {err:.3e}); gradient "
                "checks against the op's own finite differences cannot see a forward that is wrong",
                {"output": k, "mode": "pynative"}))
            return
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ref_grads = [g.asnumpy() for g in _grad_tuple(ms.grad(_Weighted(reference if isinstance(reference, nn.Cell)
                                                                    else _AsCell(reference), cots, multi),
                                                          grad_position=position)(*xs), len(xs))]
    for i, (mine, truth) in enumerate(zip(analytic, ref_grads)):
        err = float(np.max(np.abs(mine - truth), initial=0.0))
        if err > _REFERENCE_RTOL * max(float(np.max(np.abs(truth), initial=0.0)), 1e-300) + 1e-12:
            report.failures.append(CheckFailure(
                "gradient.reference", f"gradient of input {i} differs from the reference's (max abs err {err:.3e})",
                {"input": i, "max_abs_err": err, "mode": "pynative"}))


class _AsCell(nn.Cell):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def construct(self, *xs):
        return self.fn(*xs)


def _check_bprop(op, xs, out, cots, report) -> None:
    report.checks += ["bprop_return_type", "bprop_extra_gradients", "bprop_missing_gradients", "bprop_dtype"]
    dout = cots[0] if not isinstance(out, (tuple, list)) else cots
    try:
        result = op.bprop(*xs, out, dout)
    except Exception as error:
        report.notes.append(f"calling bprop directly failed ({type(error).__name__}); its return value was not "
                            "inspected")
        return
    n = len(xs)
    if not isinstance(result, tuple):
        report.failures.append(CheckFailure(
            "bprop_return_type", f"bprop returned {type(result).__name__}, not a tuple of {n} gradient(s); "
            "MindSpore accepts it without an error", {"mode": "pynative"}))
        result = (result,)
    if len(result) > n:
        report.failures.append(CheckFailure(
            "bprop_extra_gradients", f"bprop returned {len(result)} gradients for {n} input(s); MindSpore silently "
            f"ignores the extra {len(result) - n}: the gradients may be in the wrong order or meant for other inputs",
            {"returned": len(result), "inputs": n, "mode": "pynative"}))
    elif len(result) < n:
        report.failures.append(CheckFailure(
            "bprop_missing_gradients", f"bprop returned {len(result)} gradients for {n} input(s)",
            {"returned": len(result), "inputs": n, "mode": "pynative"}))
    for i, (g, x) in enumerate(zip(result, xs)):
        if isinstance(g, ms.Tensor) and g.dtype != x.dtype:
            report.failures.append(CheckFailure(
                "bprop_dtype", f"bprop returned {g.dtype} for input {i} of dtype {x.dtype}; MindSpore silently casts "
                f"it to {x.dtype}, so the result's dtype hides the lower-precision computation",
                {"input": i, "returned": str(g.dtype), "expected": str(x.dtype), "mode": "pynative"}))


def _check_weights(op, xs, weighted, position, report, eps, rng, has_bprop) -> None:
    params = op.trainable_params()
    report.checks += ["missing_weight_gradient", "weight_gradient"]
    try:
        _g, wgrads = ms.grad(weighted, grad_position=position, weights=params)(*xs)
    except Exception as error:
        report.notes.append(f"weight gradients could not be computed: {type(error).__name__}")
        return
    for p, gw in zip(params, wgrads):
        original = p.asnumpy().copy()
        step = eps if original.dtype == np.float64 else 1e-3
        v = rng.standard_normal(original.shape)
        try:
            p.set_data(ms.Tensor((original + step * v).astype(original.dtype)))
            plus = float(weighted(*xs).asnumpy())
            p.set_data(ms.Tensor((original - step * v).astype(original.dtype)))
            minus = float(weighted(*xs).asnumpy())
        finally:
            p.set_data(ms.Tensor(original))
        numeric = (plus - minus) / (2 * step)
        analytic = float(np.sum(gw.asnumpy() * v))
        tol = 1e-5 + 1e-3 * abs(numeric) if original.dtype == np.float64 else 1e-2 + 1e-2 * abs(numeric)
        if not np.any(gw.asnumpy()) and abs(numeric) > tol:
            why = (" MindSpore does not differentiate Parameters through a custom bprop: it returns zeros without "
                   "an error" if has_bprop else "")
            report.failures.append(CheckFailure(
                "missing_weight_gradient", f"weight gradient of Parameter {p.name!r} is all zeros, but the output "
                f"depends on it (directional derivative {numeric:.6g}).{why}",
                {"parameter": p.name, "numeric": numeric, "mode": "pynative"}))
        elif abs(analytic - numeric) > tol:
            report.failures.append(CheckFailure(
                "weight_gradient", f"weight gradient of Parameter {p.name!r} differs from central differences "
                f"(analytic {analytic:.6g}, numeric {numeric:.6g})", {"parameter": p.name, "mode": "pynative"}))
