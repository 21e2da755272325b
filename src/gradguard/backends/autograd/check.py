"""``check_op`` for HIPS autograd: the one audit engine (``checks.audit``) with autograd's answers to its questions.

# NOTE [autograd in the audit engine]
# autograd differentiates plain numpy code; its users write custom primitives with a hand-written backward
# (``@autograd.extend.primitive`` + ``defvjp``), which nothing checks. Such a primitive, or any function of numpy
# arrays autograd can differentiate, gets the same checks as a torch op (float64 finite differences with random
# non-unit cotangents, the reference, cotangent linearity, precision, regimes, mutation, composition). How the
# engine's questions are answered:
#   * tensors are numpy arrays (and numpy scalars) of a numeric dtype; nothing marks one as requiring grad, so
#     every floating-point input is differentiated unless ``wrt=`` says otherwise;
#   * ``linearize`` runs ``autograd.core.make_vjp`` on a closure of the differentiated inputs (the others closed
#     over) and keeps autograd's vjp in ``Linearization.state``; an output is differentiable when it comes back
#     boxed (it depends on a differentiated input). autograd can call one vjp any number of times, so
#     ``mutation.backward_not_repeatable`` sees a backward that changes what it closed over;
#   * versions: numpy arrays have none (``version`` is always 0), so every write the mutation audit sees is a
#     silent one, which is what it is: autograd's vjps close over the very arrays the forward computed with, and a
#     primitive writing into its input changes them under autograd's feet;
#   * composition: ``exp``, ``sigmoid``, ``softmax`` and ``relu`` of ``autograd.numpy`` (exp's and maximum's vjps
#     read their saved output), the producer and the op two ``make_vjp`` calls chained by hand, the op fed the
#     producer's own output array;
#   * layout: numpy arrays are strided, so the ``noncontiguous`` regime runs (a slice of a wider buffer); there is no
#     channels_last memory format, and no view tracking to tell a declared view from a hidden alias (``unsupported``).
# autograd does not check the shape of what a hand-written vjp returns; a gradient whose shape is not its input's
# (a transposed matrix) is an ``op.raised`` finding in the backward naming the input, not a crash of the audit.
"""

from __future__ import annotations

import functools
import re
import warnings
from typing import Any, Callable, Sequence

import numpy as np
from autograd.builtins import tuple as boxed_tuple
from autograd.core import make_vjp
from autograd.extend import defvjp, primitive
from autograd.tracer import getval, isbox

from ..._errors import InvalidArgument
from ...checks.adapter_base import VjpAdapter, flatten_outputs

__all__ = ["check_op", "AutogradCheckAdapter", "AUTOGRAD", "is_array"]

_NUMERIC = "biufc"  # numpy dtype kinds gradguard treats as tensors: bool, int, uint, float, complex
_INDEPENDENT = "Output seems independent of input"  # autograd's warning for a function of no differentiated input


def is_array(x: Any) -> bool:
    """A numpy array or numpy scalar of a numeric dtype: what autograd differentiates."""
    return isinstance(x, (np.ndarray, np.generic)) and x.dtype.kind in _NUMERIC


class AutogradCheckAdapter(VjpAdapter):
    """The autograd side of ``check_op``: numpy arrays in, numpy arrays out."""

    name = "autograd"
    # "did it detach its result or run under {no_grad_hint}?": how autograd code loses the trace
    no_grad_hint = "plain numpy (the numpy module instead of autograd.numpy, or np.asarray of a traced array)"
    unsupported = {
        "channels_last": "not run on autograd: numpy arrays carry no channels_last memory format",
        "aliasing": "not checked on autograd: autograd has no view tracking, and numpy's reshape, transpose and "
                    "slicing return arrays that legitimately share the input's memory, so a hidden alias cannot be "
                    "told from a view",
    }
    phrasebook = {
        "mutation.silent_input_write": {
            "why": "autograd cannot see this write (numpy arrays have no version counter): the vjps autograd "
                   "recorded close over the arrays the forward computed with (exp's vjp multiplies by its saved "
                   "output), so any of them that holds this array now computes wrong gradients silently.",
            "fix": "return a new array from the primitive (work on np.copy(x), or write into np.empty_like(x)) "
                   "instead of writing into its input; autograd has no in-place operations to declare.",
        },
        "mutation.grad_output_write": {
            "fix": "compute into a new array (g * x instead of g *= x): autograd may hand the same gradient array to "
                   "several vjps.",
        },
        "mutation.backward_not_repeatable": {
            "why": "the vjp changed an array it closed over (the forward's saved values), or state kept across "
                   "calls: every later call of the same vjp (autograd's hessians, a second grad) is wrong.",
            "fix": "keep the vjp free of side effects: compute g * saved into a new array, never in place.",
        },
    }
    message_phrases = (
        ("mutation.silent_input_write", "without bumping its version (0)", "(numpy arrays have no version counter)"),
        ("mutation.backward_not_repeatable", "(retain_graph=True)", "(a second call of the same autograd vjp)"),
    )
    composition_vjp = "producer_vjp, y = autograd.core.make_vjp({}, a)"

    @property
    def label(self) -> str:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return f"autograd {version('autograd')}"
        except PackageNotFoundError:
            return "autograd ?"

    def is_tensor(self, x: Any) -> bool:
        return is_array(x)

    def dtype_name(self, t) -> str:
        return str(np.asarray(t).dtype)

    def shape(self, t) -> tuple[int, ...]:
        return tuple(int(s) for s in np.shape(t))

    def requires_grad(self, t) -> bool:
        return False  # numpy arrays carry no such flag: every floating-point input is differentiated

    def to_numpy(self, t) -> np.ndarray:
        """float64 (int64 for integer arrays) copy."""
        return np.array(t, dtype={"float": np.float64, "complex": None}.get(self.kind(t), np.int64), copy=True)

    @staticmethod
    def tensor_from(arr: np.ndarray, dtype_name: str) -> np.ndarray:
        return np.asarray(arr).astype(dtype_name)  # astype copies: the array is the op's own

    def to_float64(self, t) -> np.ndarray:
        return np.array(t, dtype=np.float64, copy=True)

    def copy(self, t) -> np.ndarray:
        return np.array(t, copy=True)

    def host_values(self, t) -> np.ndarray:
        return np.asarray(t)

    def noncontiguous_copy(self, t) -> np.ndarray:
        """Same values, every dimension strided: the even slots of a buffer twice as wide. The odd slots hold NaN
        (0 for integers), so code that ignores the strides (a C extension through ctypes) shows it."""
        values = np.asarray(t)
        wide = np.zeros(values.shape + (2,), dtype=values.dtype)
        if values.dtype.kind in "fc":
            wide[..., 1] = np.nan
        wide[..., 0] = values
        return wide[..., 0]

    def is_contiguous(self, t) -> bool:
        return bool(np.asarray(t).flags.c_contiguous)

    def _closure(self, fn: Callable, fed: Sequence[Any], kwargs: dict, positions: Sequence[int], seen: dict):
        """``fn`` as a function of the arrays at ``positions`` (a tuple, as ``make_vjp`` boxes it) returning its
        boxed outputs; ``seen`` gets every output and the boxed ones (raw values). Each differentiated input reaches
        fn through ``_input`` (NOTE [Gradient shapes])."""
        every_name = self.parameter_names(fn, len(fed))
        names = [every_name[i] for i in positions]

        def closure(xs):
            call = list(fed)
            for k, (i, name) in enumerate(zip(positions, names)):
                call[i] = _input(xs[k], name)
            result = fn(*call, **kwargs)
            if isbox(result) and isinstance(getval(result), (tuple, list)):  # fn returned autograd.builtins.tuple
                result = tuple(result[k] for k in range(len(getval(result))))
            pairs = self.outputs_of(result)
            diff = [(n, o) for n, o in pairs if isbox(o) and self.kind(getval(o)) in ("float", "complex")]
            seen["all"] = [(n, getval(o)) for n, o in pairs]
            seen["diff"] = [(n, getval(o)) for n, o in diff]
            return boxed_tuple([o for _, o in diff])  # no boxed output: autograd gives a vjp of zeros

        return closure

    def outputs_of(self, result: Any) -> list[tuple[str, Any]]:
        return flatten_outputs(result, lambda x: isbox(x) or is_array(x))

    def outputs(self, result: Any) -> list[tuple[str, Any]]:
        return [(n, getval(o)) for n, o in self.outputs_of(result)]

    def _vjp(self, f: Callable, xs: Sequence[Any]):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_INDEPENDENT)
            vjp, y = make_vjp(f, tuple(xs))
        return y, vjp

    def _vjp_one(self, f: Callable, x):
        vjp, y = make_vjp(f, x)
        return y, vjp

    zeros_like = staticmethod(np.zeros_like)

    autograd_off_phase = "forward on plain numpy arrays (outside autograd's tracing)"  # forward64: plain numpy

    def version(self, t) -> int:
        return 0  # numpy arrays have no version counter (NOTE [autograd in the audit engine])

    # ---- composition (two make_vjp calls chained by hand) -------------------------------------------
    def producers(self) -> dict[str, Callable]:
        import autograd.numpy as anp

        def sigmoid(a):
            return 1.0 / (1.0 + anp.exp(-a))

        def softmax(a):
            e = anp.exp(a - anp.max(a, axis=-1, keepdims=True))
            return e / anp.sum(e, axis=-1, keepdims=True)

        return {"exp": anp.exp, "sigmoid": sigmoid, "softmax": softmax, "relu": lambda a: anp.maximum(a, 0.0)}

    def _chained_cotangents(self, outs: list[tuple[str, Any]], chosen: list, cots: list) -> list:
        return _cotangents_for([o for _, o in outs], chosen, cots)

    literal_call = "np.array({values}, dtype=np.{dtype})"

    def reword(self, report) -> None:
        super().reword(report)
        for f in report.findings:
            misshapen = _MISSHAPEN.search(f.message) if f.check == "op.raised" else None
            if misshapen:  # NOTE [Gradient shapes]: the input is known; where it raised is our check, not the user's
                name = f.input = misshapen.group(1)
                f.where = None
                f.fix = (f"make the vjp for {name} return an array of {name}'s shape: sum over the axes the forward "
                         f"broadcast {name} along, or undo a transpose; then re-run check_op.")
            # numpy inputs name no framework: the reproducer's call says which one (backends.choose would not know)
            f.repro = "\n".join(line[:-1] + ", backend='autograd')" if line.startswith("gradguard.check_op(")
                                 and line.endswith(")") else line for line in f.repro.splitlines())


_MISSHAPEN = re.compile(r"the gradient arriving at input (\S+) has shape")


# NOTE [Gradient shapes]
# autograd does not check what a hand-written vjp returns: a gradient of the wrong shape (a transposed matrix,
# a gradient not summed over a broadcast axis) either broadcasts into a wrong value silently or fails later inside
# autograd with a broadcasting error that names no input. Each differentiated input reaches fn through the identity
# primitive ``_input``, whose vjp is the first to see the gradient arriving at that input: of another shape, it is an
# error there naming the input (an ``op.raised`` finding in the backward).
@primitive
def _input(x, name):
    return x


def _arriving(ans, x, name):
    def check(g):
        if np.shape(g) != np.shape(x):
            raise ValueError(f"the gradient arriving at input {name} has shape {list(np.shape(g))} but {name} has "
                             f"shape {list(np.shape(x))}: a hand-written vjp returned a transposed, unreduced or "
                             f"otherwise misshapen gradient (autograd does not check gradient shapes)")
        return g

    return check


defvjp(_input, _arriving, None)


def _cotangents_for(produced: list, chosen: list, cots: list) -> list:
    """One cotangent per output the closure returned (``produced``, raw values): the engine's for the outputs it
    chose (matched by identity, in order, so an output returned twice gets both), zeros for the others."""
    used: set[int] = set()
    full = []
    for value in produced:
        j = next((j for j, o in enumerate(chosen) if o is value and j not in used), None)
        if j is None:
            full.append(np.zeros_like(value))
        else:
            used.add(j)
            full.append(cots[j])
    return full


def _unwrapped(fn: Any) -> Any:
    """A primitive (``@autograd.extend.primitive``) as a function with its raw function's name and signature.

    A primitive's wrapper takes ``(*args, called_by_autograd_dispatcher=False, **kwargs)``: read as it is, the
    report would call the inputs ``inputs[0]`` and the audit would vary ``called_by_autograd_dispatcher`` as a flag
    (the engine reads fn's signature). ``functools.wraps`` gives the raw function's (``__wrapped__``)."""
    raw = getattr(fn, "fun", None)
    if not getattr(fn, "_is_autograd_primitive", False) or not callable(raw):
        return fn

    @functools.wraps(raw)
    def primitive_call(*args, **kwargs):
        return fn(*args, **kwargs)

    return primitive_call


def _check_inputs(names: list[str], inputs: tuple) -> None:
    from .. import KNOWN

    others = {entry.framework for entry in KNOWN.values()} - {"autograd"}  # a torch.Tensor given to check_op
    for name, x in zip(names, inputs):
        framework = type(x).__module__.split(".")[0]
        if framework in others:
            how = f" ({name}.detach().numpy())" if framework == "torch" else ""
            raise InvalidArgument(
                f"check_op: input {name} is a {type(x).__module__}.{type(x).__name__}, but backend='autograd' "
                f"differentiates numpy arrays; pass a numpy array{how} or check the op with backend={framework!r}.")
        if isinstance(x, np.ndarray) and not is_array(x):
            raise InvalidArgument(
                f"check_op: input {name} is a numpy array of dtype {x.dtype}, which autograd cannot differentiate; "
                f"pass a numeric array, or pass {name} to fn through kwargs={{...}}.")
    if not any(is_array(x) and x.dtype.kind == "f" for x in inputs):
        got = ", ".join(f"{n}: {type(x).__name__}" + (f" of {x.dtype}" if is_array(x) else "")
                        for n, x in zip(names, inputs))
        raise InvalidArgument(
            f"check_op: no input is a floating-point numpy array (got {got}), so there is nothing for autograd to "
            f"differentiate; pass the differentiated inputs as float arrays, e.g. np.asarray(x, dtype=np.float64) "
            f"(a Python list or float is passed to fn unchanged, as an argument).")


AUTOGRAD = AutogradCheckAdapter()  # for questions outside an audit (argument names; the conformance contract)


def check_op(op: Any, *inputs: Any, reference: Any = None, **options: Any):
    """Audit a function of numpy arrays that autograd differentiates: the same engine, options and report as the
    torch ``check_op``.

    ``op`` is a custom primitive (``@autograd.extend.primitive`` with a hand-written ``defvjp``) or any function of
    numpy arrays written with ``autograd.numpy`` (primitives inside it or not); ``inputs`` are numpy arrays (the
    floating-point ones are differentiated unless ``wrt=`` says otherwise) or pass-through values; ``reference`` a
    trusted function of the same inputs. Reached through ``gradguard.check_op(op, *inputs, backend="autograd")``.
    Returns an ``OpReport`` (``.passed``, ``.failures``, ``.failed_checks()``).
    """
    from ...checks.audit import run_check_op

    fn = _unwrapped(op)
    if callable(fn) and inputs:
        _check_inputs(AUTOGRAD.parameter_names(fn, len(inputs)), inputs)
    if options.get("surrogate") is not None:
        options = {**options, "surrogate": _unwrapped(options["surrogate"])}
    # the regimes push inputs to overflow on purpose (large_magnitude) and judge the inf/NaN they give themselves:
    # numpy's RuntimeWarnings about it would only be noise (torch ops give none)
    with np.errstate(over="ignore", under="ignore", divide="ignore", invalid="ignore"):
        # a fresh adapter per audit: the composition checks keep their chained vjps on it
        return run_check_op(AutogradCheckAdapter(), fn, inputs, _unwrapped(reference), options)
