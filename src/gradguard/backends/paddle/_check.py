"""``check_op`` for Paddle: PyLayer subclasses and plain functions of tensors, audited in float64.

Checks (each failure names its check):
  * ``forward_dtype``   the op returns float64 for float64 inputs (otherwise no gradient check is meaningful);
  * ``input_modified``  the forward pass changed an input's values;
  * ``saved_tensor_modified``  a tensor the op saved for backward changed before backward read it (Paddle does
    not version-check PyLayer ``ctx.save_for_backward``);
  * ``gradient_shape``  a returned gradient has the wrong shape;
  * ``missing_gradient`` no gradient for an input the output depends on;
  * ``gradient``        vjp vs float64 central differences, with a random non-unit cotangent;
  * ``precision``       the gradient is right only to float32 level (a backward computing in lower precision);
  * ``forward.reference`` / ``gradient.reference``  with ``reference=`` (a trusted function of the same inputs):
    outputs and the vjp of the same random cotangent must match the reference's in float64.
"""

from __future__ import annotations

import numpy as np
import paddle

from ..._errors import InvalidArgument
from ...core._numeric import CheckFailure, OpCheckReport, check_gradients, random_cotangents
from ._session import _active, fingerprint

__all__ = ["check_op"]


def _callable(op):
    if isinstance(op, type) and issubclass(op, paddle.autograd.PyLayer):
        return op.apply, op.__name__
    return op, getattr(op, "__qualname__", getattr(op, "__name__", type(op).__name__))


def _as_array(x) -> np.ndarray:
    if isinstance(x, paddle.Tensor):
        x = x.numpy()
    return np.array(x, dtype=np.float64, copy=True)


def _outputs(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


_REFERENCE_RTOL = 1e-9


def check_op(op, *inputs, eps: float = 1e-6, atol: float = 1e-5, rtol: float = 1e-3, probes: int = 3,
             seed: int = 0, precision: bool = True, name: str | None = None, reference=None,
             **unsupported) -> OpCheckReport:
    """Audit ``op``'s gradients at ``inputs`` (arrays or tensors, converted to float64).

    ``op`` is a ``paddle.autograd.PyLayer`` subclass (``.apply`` is called) or a function of tensors;
    ``reference`` a trusted function of the same inputs (outputs and gradients are compared with it).
    Returns an :class:`OpCheckReport`; ``report.passed`` / ``report.failures``.
    """
    if unsupported:
        key = sorted(unsupported)[0]
        raise InvalidArgument(
            f"check_op: option {key!r} is not supported by the Paddle check_op yet (it is a torch check_op option); "
            f"Paddle's check_op takes eps, atol, rtol, probes, seed, precision, name and reference. Remove {key}=..."
        )
    if reference is not None and not callable(reference):
        raise InvalidArgument(f"check_op: reference must be callable or None; got {type(reference).__name__}.")
    fn, label = _callable(op)
    report = OpCheckReport(op=name or label, backend=f"paddle {paddle.__version__}", modes=["eager (dygraph)"])
    arrays = [_as_array(x) for x in inputs]
    rng = np.random.default_rng(seed)

    # forward with gradient recording, under our own saved-tensor hooks (when no guard holds Paddle's one pair)
    saved: list[list] = []

    def pack(t):
        saved.append([t, int(t.inplace_version), fingerprint(t), None])
        return _Box(len(saved) - 1)

    def unpack(box):
        entry = saved[box.index]
        t = entry[0]
        entry[3] = (int(t.inplace_version), fingerprint(t))
        return t

    xs = [paddle.to_tensor(a, dtype="float64", stop_gradient=False) for a in arrays]
    before = [fingerprint(x) for x in xs]
    hooks = None if _active else paddle.autograd.saved_tensors_hooks(pack, unpack)
    if hooks is None:
        report.notes.append("a gradguard.guard() holds Paddle's saved-tensor hooks: saved_tensor_modified not checked")
    else:
        report.checks.append("saved_tensor_modified")
        hooks.__enter__()
    try:
        outs = _outputs(fn(*xs))
    finally:
        if hooks is not None:
            hooks.__exit__(None, None, None)
    report.checks += ["forward_dtype", "input_modified"]
    bad = [str(o.dtype).replace("paddle.", "") for o in outs if isinstance(o, paddle.Tensor) and o.dtype != paddle.float64]
    if bad:
        report.failures.append(CheckFailure("forward_dtype", f"for float64 inputs the op returned {', '.join(bad)}; "
                                            "a float64 reference gradient cannot be formed",
                                            {"dtypes": bad}))
        return report
    changed = [i for i, (x, fp) in enumerate(zip(xs, before)) if fingerprint(x) != fp]
    if changed:
        report.failures.append(CheckFailure("input_modified", f"the forward pass changed input(s) {changed} in place",
                                            {"inputs": changed}))
    cotangents = random_cotangents([tuple(o.shape) for o in outs], rng)
    live = [(o, c) for o, c in zip(outs, cotangents) if isinstance(o, paddle.Tensor) and not o.stop_gradient]
    if not live:
        report.failures.append(CheckFailure("missing_gradient", "no output of the op records a gradient "
                                            "(all outputs stop_gradient)"))
        return report
    total = None
    for o, c in live:
        term = (o * paddle.to_tensor(c, dtype="float64")).sum()
        total = term if total is None else total + term
    grads = paddle.grad([total], xs, allow_unused=True)
    for i, entry in enumerate(saved):
        if entry[3] is not None and (entry[3][0] != entry[1] or entry[3][1] != entry[2]):
            how = "version moved" if entry[3][0] != entry[1] else "values changed without a version bump"
            report.failures.append(CheckFailure(
                "saved_tensor_modified",
                f"saved tensor #{i} (shape {list(entry[0].shape)}) changed between forward and backward ({how}); "
                "Paddle does not check PyLayer saved tensors, so its gradient is computed from the new values",
                {"index": i, "version_saved": entry[1], "version_now": entry[3][0]}))
    analytic = []
    report.checks.append("gradient_shape")
    for i, (g, a) in enumerate(zip(grads, arrays)):
        if g is None:
            analytic.append(None)
            continue
        g = g.numpy()
        if tuple(g.shape) != a.shape:
            report.failures.append(CheckFailure("gradient_shape", f"gradient of input {i} has shape {list(g.shape)}, "
                                                f"input has {list(a.shape)}", {"input": i}))
            return report
        analytic.append(g)

    def forward(arrs):
        with paddle.no_grad():
            out = _outputs(fn(*[paddle.to_tensor(a, dtype="float64") for a in arrs]))
        return [o.numpy() for o in out]

    if reference is not None:
        _compare_with_reference(report, fn, reference, arrays, cotangents, [o.numpy() for o in outs], analytic)
    result = check_gradients(forward, analytic, arrays, cotangents, eps=eps, atol=atol, rtol=rtol, probes=probes,
                             rng=rng)
    report.max_abs_err = result.max_abs_err
    report.checks += ["missing_gradient", "gradient"] + (["precision"] if precision else [])
    missing = [i for i, g in enumerate(analytic) if g is None and result.numeric[i] is not None
               and np.max(np.abs(result.numeric[i])) > atol]
    if missing:
        report.failures.append(CheckFailure("missing_gradient", f"no gradient for input(s) {missing}, but the "
                                            "output depends on them", {"inputs": missing}))
    elif not result.passed:
        report.failures.append(CheckFailure("gradient", _gradient_message(result, atol, rtol), {"worst": result.worst}))
    elif precision and not result.precise:
        report.failures.append(CheckFailure(
            "precision", f"gradient agrees only to {result.max_abs_err:.1e} in float64 (expected ~1e-10): the backward "
            "computes in lower precision (float32?) and is cast back", {"worst": result.worst}))
    return report


def _compare_with_reference(report, fn, reference, arrays, cotangents, op_outputs, analytic) -> None:
    """forward.reference and gradient.reference in float64: same inputs, same cotangents."""
    ref_fn, _ = _callable(reference)
    xs = [paddle.to_tensor(a, dtype="float64", stop_gradient=False) for a in arrays]
    outs = [o for o in _outputs(ref_fn(*xs)) if isinstance(o, paddle.Tensor)]
    report.checks += ["forward.reference", "gradient.reference"]
    if [tuple(o.shape) for o in outs] != [tuple(np.shape(o)) for o in op_outputs]:
        raise InvalidArgument(
            f"check_op: reference returned outputs of shapes {[list(o.shape) for o in outs]} but the op returned "
            f"{[list(np.shape(o)) for o in op_outputs]}; the reference must compute the same function as the op.")
    for k, (mine, theirs) in enumerate(zip(op_outputs, outs)):
        truth = theirs.numpy().astype(np.float64)
        err = float(np.max(np.abs(mine - truth), initial=0.0))
        if err > _REFERENCE_RTOL * max(float(np.max(np.abs(truth), initial=0.0)), 1e-300):
            report.failures.append(CheckFailure(
                "forward.reference", f"output {k} differs from the reference's (max abs err {err:.3e}); gradient "
                "checks against the op's own finite differences cannot see a forward that is wrong", {"output": k}))
            return
    total = None
    for o, c in zip(outs, cotangents):
        term = (o * paddle.to_tensor(c, dtype="float64")).sum()
        total = term if total is None else total + term
    grads = paddle.grad([total], xs, allow_unused=True)
    for i, (g, mine) in enumerate(zip(grads, analytic)):
        truth = np.zeros_like(arrays[i]) if g is None else g.numpy()
        mine = np.zeros_like(arrays[i]) if mine is None else mine
        err = float(np.max(np.abs(mine - truth), initial=0.0))
        if err > _REFERENCE_RTOL * max(float(np.max(np.abs(truth), initial=0.0)), 1e-300) + 1e-12:
            report.failures.append(CheckFailure(
                "gradient.reference", f"gradient of input {i} differs from the reference's (max abs err {err:.3e})",
                {"input": i, "max_abs_err": err}))


def _gradient_message(result, atol, rtol) -> str:
    w = result.worst or {}
    where = f"input {w['input']} at {list(w['index'])}" if "input" in w else f"random direction probe {w.get('probe')}"
    return (f"analytic and numerical gradients differ (max abs err {result.max_abs_err:.3e} > atol {atol:g} + rtol "
            f"{rtol:g}*|numeric|); worst: {where}: analytic {w.get('analytic', float('nan')):.6g}, numeric "
            f"{w.get('numeric', float('nan')):.6g}")


class _Box:
    __slots__ = ("index",)

    def __init__(self, index):
        self.index = index
