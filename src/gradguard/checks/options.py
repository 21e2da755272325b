"""``check_op``'s options: their defaults, and the errors for an unknown or malformed one, a non-callable fn and
inputs with nothing to differentiate."""

from __future__ import annotations

from typing import Any

from .._errors import InvalidArgument
from .regimes import REGIME_NAMES
from .tolerances import TOLERANCES

__all__ = ["CHECK_GROUPS", "DEFAULT_OPTIONS", "check_options", "check_callables", "check_values", "choose_wrt"]

CHECK_GROUPS = ("gradient", "regime", "mutation", "aliasing", "composition")
DEFAULT_OPTIONS: dict[str, Any] = {
    "kwargs": None,  # keyword arguments passed to fn and reference
    "wrt": None,  # positions of the inputs to differentiate (default: see NOTE [Which inputs])
    "checks": CHECK_GROUPS,
    "regimes": REGIME_NAMES,
    "seed": 0,
    "probes": 3,  # random cotangents, and random tangents per input
    "full_jacobian_max": 32,  # inputs with at most this many elements get the full Jacobian
    "rtol": TOLERANCES["gradient.numerical.rtol"],  # finite-difference comparison, relative to the magnitude of the terms
    "reference_factor": TOLERANCES["reference.factor"],  # the op may be this many times less accurate than the reference
    "shrink": True,  # look for a smaller reproducing input for failures
    "name": None,  # name shown in the report
    "vary": None,  # {argument name: False | list of values}: NOTE [Argument regimes]
    "budget": None,  # seconds, or "quick": NOTE [Budget] in ``audit``
    "surrogate": None,  # a function whose gradient fn's backward declares to compute: NOTE [Surrogate gradients]
    "isolate": "auto",  # value regimes in a child process: True, False, "auto" (compiled ops): NOTE [Isolated regimes]
}


def _type_name(x: Any) -> str:
    t = type(x)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def check_options(options: dict, extra: tuple = ()) -> None:
    """Unknown option names are an error naming the known ones (``extra``: a framework's own, already taken out)."""
    unknown = sorted(set(options) - set(DEFAULT_OPTIONS))
    if unknown:
        raise InvalidArgument(
            f"check_op: unknown option {unknown[0]!r}; known options: {', '.join(sorted([*DEFAULT_OPTIONS, *extra]))}. "
            f"Keyword arguments for fn itself go in kwargs={{...}}."
        )


def check_callables(fn, inputs: tuple, reference, opts: dict) -> None:
    if not callable(fn):
        raise InvalidArgument(
            f"check_op: fn must be callable (a function, autograd.Function.apply, a torch.library op or a module); got {_type_name(fn)}."
        )
    if reference is not None and not callable(reference):
        raise InvalidArgument(f"check_op: reference must be callable or None; got {_type_name(reference)}.")
    if opts["surrogate"] is not None and not callable(opts["surrogate"]):
        raise InvalidArgument(f"check_op: surrogate must be callable (a function with fn's signature whose gradient is the "
                              f"intended one) or None; got {_type_name(opts['surrogate'])}.")
    if not inputs:
        raise InvalidArgument("check_op: no inputs given; pass the op's tensor inputs after fn: check_op(fn, x, ...).")
    # Like gradcheck, non-tensor positional inputs (Python scalars, None, tuples ...) are passed through unchanged.
    if opts["kwargs"] is not None and not isinstance(opts["kwargs"], dict):
        raise InvalidArgument(f"check_op: kwargs must be a dict of keyword arguments for fn; got {_type_name(opts['kwargs'])}.")


def _outside(chosen, known) -> list:
    """The names in ``chosen`` that ``known`` does not have (a string is one name, never a sequence of letters)."""
    return sorted(set(chosen) - set(known)) if not isinstance(chosen, str) else [chosen]


def check_values(opts: dict) -> None:
    bad_groups = _outside(opts["checks"], CHECK_GROUPS)
    if bad_groups:
        raise InvalidArgument(f"check_op: checks contains {bad_groups[0]!r}; expected a sequence drawn from {list(CHECK_GROUPS)}.")
    bad_regimes = _outside(opts["regimes"], REGIME_NAMES)
    if bad_regimes:
        raise InvalidArgument(f"check_op: regimes contains {bad_regimes[0]!r}; expected a sequence drawn from {list(REGIME_NAMES)}.")
    if opts["isolate"] not in (True, False, "auto"):
        raise InvalidArgument(f"check_op: isolate must be True, False or 'auto'; got {opts['isolate']!r}.")
    budget = opts["budget"]
    if budget is not None and budget != "quick" and (isinstance(budget, bool) or not isinstance(budget, (int, float))
                                                     or not budget > 0):
        raise InvalidArgument(f"check_op: budget must be a positive number of seconds or 'quick'; got {budget!r}.")
    if not isinstance(opts["probes"], int) or opts["probes"] < 1:
        raise InvalidArgument(f"check_op: probes must be a positive int; got {opts['probes']!r}.")


# NOTE [Which inputs]
# Floating-point tensor inputs are differentiated. If some of them have requires_grad=True, only those
# are (so an input can be excluded by passing it with requires_grad=False next to ones with True);
# ``wrt=`` overrides both.
def choose_wrt(B, args: list, names: list[str], wrt) -> list[int]:
    """The positions of the inputs to differentiate (NOTE [Which inputs]); ``wrt`` is the option as given."""
    floats = [i for i, a in enumerate(args) if B.is_tensor(a) and B.kind(a) == "float"]
    if not floats:
        got = ", ".join(f"{n}: {B.describe(a)}" for n, a in zip(names, args))
        raise InvalidArgument(
            f"check_op: inputs has no floating-point tensor (got {got}), so there is no gradient to check. "
            f"Pass at least one floating-point tensor input (for example x.float())."
        )
    if wrt is None:
        # NOTE [Which inputs]: inputs marked requires_grad (when some are) are the ones differentiated, so a
        # bias-only audit is check_op(fn, x, w, b.requires_grad_()); 0-dim floats such as a temperature are
        # differentiated like any other unless excluded that way.
        marked = [i for i in floats if B.requires_grad(args[i])]
        return marked or floats
    if isinstance(wrt, int):
        wrt = [wrt]
    try:
        wrt = [int(i) for i in wrt]
    except TypeError:
        raise InvalidArgument(f"check_op: wrt must be an int or a sequence of input positions; got {_type_name(wrt)}.") from None
    for i in wrt:
        if not 0 <= i < len(args) or i not in floats:
            raise InvalidArgument(
                f"check_op: wrt contains {i}, which is not the position of a floating-point input; "
                f"floating-point inputs are at {floats}."
            )
    return wrt
