"""Argument regimes: the op's own non-tensor arguments, varied the way its bugs need.

# NOTE [Argument regimes]
# gradcheck checks only the arguments it is given, and so did check_op: a backward that reduces over the last
# dimension whatever ``dim`` says, a mask that is off by one only when ``causal=True``, a RoPE backward that
# forgets ``offset``, a clamp whose backward ignores ``max``: all pass on the defaults a test happens to use.
# Each argument of fn (positional scalars, ``kwargs``, or signature defaults the caller never passed) is
# classified by its name and value, and each class is one strategy (``STRATEGIES``) that makes variants:
#   reduction_dim     an int dim/axis: every other valid dim, negative ones too
#   flags             a bool: the other value
#   sentinel_indices  an int that indexes into an integer input (ignore_index, padding_idx, by name, or because its
#                     value occurs in an integer input): every third entry of the integer inputs set to it
#   thresholds        a float bound (min/max/threshold/clip...): the first differentiated input placed on both sides
#                     of it; an eps: moved between the inputs' row norms, so some rows fall under it
#   offsets           an int offset/position/start: a non-zero value
# (exactly *at* a bound is the ``kinks`` regime's job: finite differences mean nothing there.) Arguments are varied
# one at a time, the others kept as given; the reference gets the same arguments. A variant fn rejects (it raises)
# is skipped and listed, never failed: an argument value outside what the op supports says nothing about its
# gradients. ``vary={"dim": False}`` leaves an argument alone, ``vary={"dim": [0, 1]}`` gives the values to try.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .._errors import InvalidArgument
from .adapter_base import apply_parameters

__all__ = ["Argument", "discover_arguments", "argument_regimes", "check_vary", "STRATEGIES"]

_DIM = re.compile(r"^(dim|axis|dimension)$|_(dim|axis)$")
_SENTINEL = re.compile(r"^(ignore|pad|padding|blank|sentinel)(_?(index|idx|id|token|label|value))?$|^(ignore|padding)_")
_OFFSET = re.compile(r"(^|_)(offset|offsets|position|pos|start|shift|shifts|diagonal|past_len|cache_len)($|_)")
_EPS = re.compile(r"(^|_)(eps|epsilon)($|_)")
_NOT_FLAGS = {"training", "train", "inplace", "in_place", "sparse", "sparse_grad", "deterministic", "use_reentrant",
              "benchmark", "verbose"}
BOUND = re.compile(r"(^|_)(min|max|threshold|lambd|limit|clip|bound|beta|cutoff|lower|upper)($|_)")


@dataclass(frozen=True)
class Argument:
    """One non-tensor argument of fn as this call passes it."""

    name: str
    value: Any
    position: int | None  # its position among fn's positional parameters (None: keyword-only)
    source: str  # "positional" (in the inputs), "kwargs", or "default" (fn's signature, not passed)
    keyword: bool  # fn takes it by keyword (``Function.apply`` takes only positional arguments)


def _parameters(fn: Callable) -> tuple[list[inspect.Parameter], bool]:
    """fn's parameters, and whether they can be passed by keyword (``Function.apply``: forward's, positional only)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return [], False
    inner = apply_parameters(fn, params)
    return (params, True) if inner is None else (inner, False)


def discover_arguments(B, fn: Callable, args: list, kwargs: dict) -> list[Argument]:
    """The non-tensor arguments of this call: positional scalars, ``kwargs`` and the signature's defaults."""
    params, by_keyword = _parameters(fn)
    found: list[Argument] = []
    seen = set()
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    for pos, p in enumerate(positional):
        if pos < len(args):
            if not B.is_tensor(args[pos]) and args[pos] is not None:
                found.append(Argument(p.name, args[pos], pos, "positional", False))
            seen.add(p.name)
        elif p.name in kwargs:
            found.append(Argument(p.name, kwargs[p.name], pos, "kwargs", True))
            seen.add(p.name)
        elif p.default is not p.empty:  # None too: a positional call past it needs its value
            found.append(Argument(p.name, p.default, pos, "default", by_keyword and p.kind is not p.POSITIONAL_ONLY))
            seen.add(p.name)
    for p in params:
        if p.kind is p.KEYWORD_ONLY and p.name not in seen:
            if p.name in kwargs:
                found.append(Argument(p.name, kwargs[p.name], None, "kwargs", True))
            elif p.default is not p.empty and p.default is not None:
                found.append(Argument(p.name, p.default, None, "default", True))
            seen.add(p.name)
    for k, v in kwargs.items():  # **kwargs of fn
        if k not in seen:
            found.append(Argument(k, v, None, "kwargs", True))
    return [a for a in found if not B.is_tensor(a.value)]


def check_vary(vary: Any, arguments: list[Argument], fn_name: str) -> dict[str, Any]:
    """``vary=`` validated: {argument name: False | True | list of values}."""
    if vary is None:
        return {}
    if not isinstance(vary, dict):
        raise InvalidArgument(f"check_op: vary must be a dict {{argument name: False or a list of values}}; got "
                              f"{type(vary).__name__}.")
    known = {a.name for a in arguments}
    for name, value in vary.items():
        if name not in known:
            raise InvalidArgument(
                f"check_op: vary names {name!r}, which is not a non-tensor argument of {fn_name} in this call; "
                f"its arguments are: {', '.join(sorted(known)) or 'none'}.")
        if not isinstance(value, (bool, list, tuple)):
            raise InvalidArgument(
                f"check_op: vary[{name!r}] must be False (leave it as given), True (explore it) or a list of values to "
                f"try; got {type(value).__name__} {value!r}.")
    return dict(vary)


@dataclass
class Variant:
    """One argument regime before it becomes a ``Regime``: which argument, which value, which inputs."""

    strategy: str
    argument: Argument
    value: Any  # the argument's new value (the same as given when only the inputs move)
    description: str
    values: dict[int, np.ndarray] | None = None  # new float64 values for some inputs (position -> array)
    numerical: bool = True
    convention: bool = False

    @property
    def needs(self) -> str:
        """What a failure in this variant needs, for the report ("`causal=True`", "rows hitting `ignore_index=-100`")."""
        if self.strategy == "sentinel_indices":
            return f"rows hitting {_fmt(self.argument.name, self.value)}"
        if self.values:
            return f"inputs on both sides of {_fmt(self.argument.name, self.value)}"
        return _fmt(self.argument.name, self.value)


def _fmt(name: str, value: Any) -> str:
    return f"`{name}={value!r}`"


def _dims(B, args, wrt, names, arg: Argument) -> list[Variant]:
    nd = max((B.ndim(args[i]) for i in wrt), default=0)
    v = arg.value
    if not (isinstance(v, int) and not isinstance(v, bool)) or nd < 1 or not -nd <= v < nd:
        return []
    if arg.name not in ("dim", "axis", "dimension") and nd < 2:
        return []
    others = [d for d in list(range(nd)) + list(range(-nd, 0)) if d != v]
    return [Variant("reduction_dim", arg, d, f"{arg.name}={v} -> {arg.name}={d}") for d in others]


def _flags(B, args, wrt, names, arg: Argument) -> list[Variant]:
    return [Variant("flags", arg, not arg.value, f"{_fmt(arg.name, not arg.value)} (given {arg.value!r})")]


def _offsets(B, args, wrt, names, arg: Argument) -> list[Variant]:
    new = (3 if arg.value == 0 else 0) if isinstance(arg.value, (int, np.integer)) else (1.0 if arg.value == 0 else 0.0)
    return [Variant("offsets", arg, new, f"{_fmt(arg.name, new)} (given {arg.value!r})")]


def _sentinels(B, args, wrt, names, arg: Argument) -> list[Variant]:
    ints = [i for i, a in enumerate(args) if B.is_tensor(a) and B.kind(a) == "int" and B.numel(a) >= 1]
    if not ints:
        return []
    padding = "pad" in arg.name
    if padding and arg.value < 0:
        return []
    values = {}
    for i in ints:
        v = B.to_numpy(args[i]).reshape(-1).copy()
        v[::3] = arg.value
        values[i] = v
    # padding_idx is a convention (the padding row gets no gradient although the forward reads it): finite
    # differences disagree with it by design.
    return [Variant("sentinel_indices", arg, arg.value,
                    f"every third entry of each integer input set to {arg.name}={arg.value}", values,
                    numerical=not padding, convention=padding)]


def _row_norms(x: np.ndarray) -> np.ndarray:
    return np.sqrt((x.reshape(-1, x.shape[-1]) ** 2).sum(-1)) if x.ndim >= 1 and x.shape[-1] else np.abs(x.reshape(-1))


def _thresholds(B, args, wrt, names, arg: Argument) -> list[Variant]:
    v = arg.value
    if not wrt or isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v):
        return []
    first = wrt[0]
    x = B.to_numpy(args[first])
    if x.size < 2:
        return []
    if _EPS.search(arg.name):
        # rows (last dim) on both sides of eps: eps moved half-way between the two middle row norms
        norms = np.sort(_row_norms(x))
        if norms.size >= 2:
            new = float(0.5 * (norms[norms.size // 2 - 1] + norms[norms.size // 2]))
        else:
            new = float(2.0 * norms[0])
        if not new > 0 or new == v:
            return []
        return [Variant("thresholds", arg, new, f"{_fmt(arg.name, round(new, 6))} (given {v!r}): some rows of "
                                                f"{names[first]} under it, some above")]
    if not BOUND.search(arg.name):
        return []
    # the first differentiated input on both sides of the bound, a quarter of its scale away (never at it)
    delta = 0.25 * max(abs(float(v)), 1.0)
    pattern = np.array([-1.5, -0.5, 0.5, 1.5]) * delta
    placed = float(v) + np.resize(pattern, x.size) * np.linspace(1.0, 1.1, x.size)  # distinct values
    return [Variant("thresholds", arg, v, f"{names[first]} placed on both sides of {_fmt(arg.name, v)} "
                                          f"(within {1.65 * delta:.3g} of it, never at it)",
                    {first: placed.reshape(x.shape)})]


def classify(B, arg: Argument, args, int_values: set) -> str | None:
    """The strategy an argument gets, from its name and value (None: left as given)."""
    v = arg.value
    if v is None:
        return None
    if isinstance(v, bool):
        # randomness (dropout's training), in-place writes on the caller's tensors and sparse gradients change what
        # the op is, not where its gradient may be wrong
        return None if arg.name in _NOT_FLAGS else "flags"
    if isinstance(v, (int, np.integer)):
        if _DIM.search(arg.name):
            return "reduction_dim"
        if _OFFSET.search(arg.name):
            return "offsets"
        if _SENTINEL.search(arg.name) or (int(v) < 0 and int(v) in int_values):
            return "sentinel_indices"
        return None
    if isinstance(v, float) and _OFFSET.search(arg.name):
        return "offsets"
    if isinstance(v, float) and (_EPS.search(arg.name) or BOUND.search(arg.name)):
        return "thresholds"
    return None


STRATEGIES: dict[str, Callable] = {
    "reduction_dim": _dims,
    "flags": _flags,
    "offsets": _offsets,
    "sentinel_indices": _sentinels,
    "thresholds": _thresholds,
}


def argument_regimes(B, args: list, wrt: list[int], names: list[str], arguments: list[Argument], vary: dict,
                     selected: set) -> tuple[list[Variant], dict[str, str]]:
    """The argument variants to run, per selected strategy, and why a selected strategy has none."""
    int_values = set()
    for a in args:
        if B.is_tensor(a) and B.kind(a) == "int" and 0 < B.numel(a) <= 1 << 16:
            int_values.update(int(x) for x in np.unique(B.to_numpy(a)))
    variants: list[Variant] = []
    used = set()
    for arg in arguments:
        choice = vary.get(arg.name, True)
        if choice is False:
            continue
        strategy = classify(B, arg, args, int_values)
        if isinstance(choice, (list, tuple)):  # values asked for: tried whatever the regime selection
            strategy = strategy or "arguments"
            variants += [Variant(strategy, arg, value, f"{_fmt(arg.name, value)} (given {arg.value!r})")
                         for value in choice if value != arg.value or type(value) is not type(arg.value)]
            used.add(strategy)
            continue
        if strategy is None or strategy not in selected:
            continue
        made = STRATEGIES[strategy](B, args, wrt, names, arg)
        variants += made
        if made:
            used.add(strategy)
    why = {
        "reduction_dim": "fn takes no dim/axis argument in range for the differentiated inputs",
        "flags": "fn takes no bool argument",
        "offsets": "fn takes no offset/position argument",
        "sentinel_indices": "fn takes no ignore_index/padding_idx-like argument, or there is no integer input",
        "thresholds": "fn takes no float bound/threshold/eps argument",
    }
    skipped = {s: why[s] for s in STRATEGIES if s in selected and s not in used}
    return variants, skipped


def apply_variant(B, args: list, kwargs: dict, arguments: list[Argument], variant: Variant) -> tuple[list, dict]:
    """The call's (args, kwargs) with the variant applied: the argument where the call passes it (a default that
    was not passed goes by keyword, or positionally after the defaults before it when fn takes no keywords)."""
    new_args, new_kwargs = list(args), dict(kwargs)
    arg = variant.argument
    if variant.values:
        for i, v in variant.values.items():
            new_args[i] = B.with_values(args[i], v)
    if variant.value is arg.value and type(variant.value) is type(arg.value):
        return new_args, new_kwargs
    if arg.source == "positional":
        new_args[arg.position] = variant.value
    elif arg.source == "kwargs" or arg.keyword:
        new_kwargs[arg.name] = variant.value
    else:  # a default of Function.apply's forward: every positional argument up to it, defaults included
        by_pos = {a.position: a for a in arguments if a.position is not None}
        for pos in range(len(new_args), arg.position + 1):
            if pos not in by_pos:
                raise ValueError(f"no default for positional parameter {pos}")
            new_args.append(by_pos[pos].value)
        new_args[arg.position] = variant.value
    return new_args, new_kwargs
