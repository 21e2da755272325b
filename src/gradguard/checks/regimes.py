"""Regimes: input variants derived from the inputs the user gave, where backward bugs like to hide, and argument
regimes: the op's own non-tensor arguments, varied the way its bugs need.

# NOTE [Regimes]
# Each regime is (name, description, inputs, spec). ``spec`` says how the variant is judged:
# - layout regimes (non-contiguous, channels_last) hold the same values, so outputs and gradients
#   must match the run on the given inputs (a kernel that assumes contiguous memory fails here);
# - value regimes (repeated indices, sentinels, large magnitudes, near-constant rows, other batch
#   sizes) rerun the full gradient suite: float64 finite differences and the reference;
# - the kink regime puts values exactly on non-differentiable points (0, clamp limits, thresholds).
#   There the finite difference is meaningless, so only the reference's convention is used (and,
#   without a reference, only finiteness).
# Values are built in float64 numpy and rounded to each input's dtype by the backend.
#
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

import re
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .._errors import InvalidArgument
from .adapter_base import call_parameters
from .tolerances import TOLERANCES

__all__ = ["Spec", "Regime", "build_regimes", "REGIME_NAMES", "SENTINEL_KWARGS", "Argument", "discover_arguments",
           "argument_regimes", "check_vary", "STRATEGIES"]

REGIME_NAMES = (
    "noncontiguous",
    "channels_last",
    "repeated_indices",
    "sentinel_indices",
    "kinks",
    "large_magnitude",
    "near_constant_rows",
    "batch_size",
    "feature_dim",
    "singleton_dim",
    "reduction_dim",
    "grad_subset",
    "flags",
    "thresholds",
    "offsets",
    "arguments",
)
SENTINEL_KWARGS = ("ignore_index", "padding_idx")
LARGE_SCALE = 1e3
# past 1.13 x log(largest finite value) exp overflows the dtype (float32: 100), and float64 not
_DTYPE_MAX = {"float16": 65504.0, "bfloat16": 3.39e38, "float32": 3.4e38, "float64": 1.79e308}
NEAR_CONSTANT_SPREAD = TOLERANCES["regime.near_constant_rows.spread"]


@dataclass(frozen=True)
class Spec:
    layout: bool = False  # same values as the given inputs: compare with that run
    numerical: bool = True  # float64 finite differences are valid here
    precision: bool = True  # compare the op's dtype run with its float64 run when there is no reference
    convention: bool = False  # non-differentiable points: judge by the reference only
    reshaped: bool = False  # same values in another shape: compare after reshaping back, if fn agrees on the forward


@dataclass
class Regime:
    name: str
    description: str
    args: list[Any]
    spec: Spec
    kwargs: dict[str, Any] | None = None  # replaces the call's keyword arguments (a different ``dim``)
    wrt: list[int] | None = None  # differentiate only these inputs (the others do not require grad)
    argument: str | None = None  # an argument regime: the argument value it needs ("`causal=True`")
    new_argument: bool = False  # it passes fn an argument value the caller did not (fn may reject it: skipped)
    arg_name: str | None = None  # an argument regime: the argument it varies
    fallback: "Regime | None" = None  # run instead when these inputs are outside fn's domain (NOTE [Outside the domain])


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _resize(v: np.ndarray, size: int, axis: int, distinct: bool = False) -> np.ndarray:
    """``v`` with dimension ``axis`` cut or cyclically extended to ``size``; ``distinct``: each further copy scaled by
    0.9 (float inputs: a copied column would tie with its original, and ties are kinks for sort, max, top-k)."""
    out = np.take(v, np.arange(size) % v.shape[axis], axis=axis)
    if not distinct:
        return out
    shape = [1] * v.ndim
    shape[axis] = size
    return out * (0.9 ** (np.arange(size) // v.shape[axis])).reshape(shape)


def _ties(rounded: np.ndarray, original: np.ndarray) -> bool:
    """Whether some row of ``rounded`` has fewer distinct values than the same row of ``original``."""
    r, o = rounded.reshape(-1, rounded.shape[-1]), original.reshape(-1, original.shape[-1])
    distinct = lambda m: (np.diff(np.sort(m, axis=1), axis=1) != 0).sum(axis=1)  # noqa: E731 (per row, minus one)
    return bool(np.any(distinct(r) < distinct(o)))


def kink_points(arguments: list[Argument]) -> list[float]:
    points = {0.0}
    for a in arguments:
        key, value = a.name, a.value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or key in SENTINEL_KWARGS:
            continue
        if BOUND.search(key):
            points.add(float(value))
            if key in ("lambd", "beta", "threshold"):
                points.add(-float(value))
    return sorted(points)


@dataclass
class _Inputs:
    """What every regime strategy reads: the backend, the given call and the positions of its kinds of input."""

    B: Any
    args: list[Any]
    arguments: list[Argument]
    names: list[str]
    floats: list[int]  # differentiated inputs with an element
    sentinels: dict = None  # argument name -> sentinel value (the sentinel_indices argument regimes)
    tensors: list[int] = field(init=False)  # tensor inputs
    ints: list[int] = field(init=False)  # integer tensors with an element

    def __post_init__(self):
        B, args = self.B, self.args
        self.tensors = [i for i, a in enumerate(args) if B.is_tensor(a)]
        self.ints = [i for i, a in enumerate(args) if B.is_tensor(a) and B.kind(a) == "int" and B.numel(a) >= 1]


# A strategy returns the regimes it built from the given inputs, or a string: why it does not apply (None: it does not
# apply and says nothing). The table's order is the order the regimes run in (NOTE [Regimes]).
def _copied(c: _Inputs, cand: list[int], copy: Callable[[Any], Any]) -> list[Any]:
    """The given inputs with ``copy`` applied to those at ``cand``."""
    new = list(c.args)
    for i in cand:
        new[i] = copy(c.args[i])
    return new


def _noncontiguous(c: _Inputs):
    cand = [i for i in c.tensors if c.B.numel(c.args[i]) > 1]
    if not cand:
        return "no tensor input with more than one element"
    return [Regime("noncontiguous", "every tensor input copied into strided (non-contiguous) memory, same values",
                   _copied(c, cand, c.B.noncontiguous_copy), Spec(layout=True))]


def _channels_last(c: _Inputs):
    cand = [i for i in c.tensors if c.B.ndim(c.args[i]) == 4]
    if not cand:
        return "no 4-D input"
    return [Regime("channels_last", "4-D inputs in channels_last memory format, same values",
                   _copied(c, cand, c.B.channels_last_copy), Spec(layout=True))]


def _repeated_indices(c: _Inputs):
    B, args = c.B, c.args
    cand = [i for i in c.ints if B.numel(args[i]) >= 2]
    if not cand:
        return "no integer input with two or more entries"
    new = list(args)
    for i in cand:
        v = B.to_numpy(args[i]).reshape(-1).copy()
        valid = [x for x in v if x not in c.sentinels.values()]
        if not valid:
            continue
        v[1::2] = valid[0]
        new[i] = B.with_values(args[i], v)
    return [Regime("repeated_indices", "every second entry of each integer input set to the same index", new, Spec())]


def _kinks(c: _Inputs):
    B, args = c.B, c.args
    if not c.floats:
        return None
    points = kink_points(c.arguments)
    new = list(args)
    for i in c.floats:
        v = B.to_numpy(args[i]).reshape(-1).copy()
        v[::3] = np.resize(np.array(points), v[::3].shape)
        new[i] = B.with_values(args[i], v)
    pts = ", ".join(f"{p:g}" for p in points)
    return [Regime("kinks", f"every third entry of each differentiated input set to a kink/boundary value ({pts})", new, Spec(numerical=False, precision=False, convention=True))]


def _scaled(c: _Inputs, scale: float) -> list[Any]:
    return _copied(c, c.floats, lambda a: c.B.with_values(a, c.B.to_numpy(a) * scale))


def _largest(c: _Inputs, values) -> float:
    return max((float(np.max(values(c.B.to_numpy(c.args[i])), initial=0.0)) for i in c.floats), default=0.0)


def _large_magnitude(c: _Inputs):
    B, args, floats = c.B, c.args, c.floats
    if not floats:
        return None
    regime = Regime("large_magnitude", f"differentiated inputs multiplied by {LARGE_SCALE:g}", _scaled(c, LARGE_SCALE), Spec())
    # NOTE [Outside the domain]: where fn's float64 outputs are not finite at x1000 (log-probabilities
    # x1000 are no log-probabilities), the inputs scaled so that the largest is 100 in float32, 12.5 in float16 (or the largest magnitude,
    # when none is positive) still overflow exp in float32 and not in float64, which is the bug this regime
    # is for
    top = _largest(c, lambda v: v) or _largest(c, np.abs)
    largest = 1.13 * np.log(_DTYPE_MAX.get(B.dtype_name(args[floats[0]]), _DTYPE_MAX["float32"]))
    if top > 0 and 1.0 < largest / top < LARGE_SCALE:
        scale = largest / top
        regime.fallback = Regime("large_magnitude", f"differentiated inputs multiplied by {scale:.3g} (largest "
                                                    f"{largest:.3g})", _scaled(c, scale), Spec())
    return [regime]


def _untied_spread(B, v, mean, dtype: str) -> float:
    spread = NEAR_CONSTANT_SPREAD
    # NOTE [No ties made]: squeezed rows rounded to bfloat16/float16 collapse onto a few values, and ties
    # are kinks (sort, max, top-k) where finite differences mean nothing: the spread grows until the row's
    # distinct values stay distinct in the input's dtype
    while spread < TOLERANCES["regime.near_constant_rows.max_spread"] and _ties(B.round_to(mean + spread * (v - mean), dtype), v):
        spread *= 2
    return spread


def _near_constant_rows(c: _Inputs):
    B, args, floats = c.B, c.args, c.floats
    cand = [i for i in floats if B.ndim(args[i]) >= 2 and B.shape(args[i])[-1] >= 2]
    if not cand:
        cand = [i for i in floats if B.ndim(args[i]) >= 1 and B.shape(args[i])[-1] >= 2][:1]
    if not cand:
        return "no differentiated input with rows of two or more elements"
    new = list(args)
    spreads = []
    for i in cand:
        v = B.to_numpy(args[i])
        mean = v.mean(axis=-1, keepdims=True)
        spread = _untied_spread(B, v, mean, B.dtype_name(args[i]))
        spreads.append(spread)
        new[i] = B.with_values(args[i], mean + spread * (v - mean))
    spread = max(spreads)
    return [Regime("near_constant_rows", f"rows (last dim) squeezed to their mean +- {spread:g} x deviation (variance near eps)", new, Spec(precision=False))]


def _batch_regime(c: _Inputs, b: int, batched: list[int], size: int) -> Regime:
    B, args = c.B, c.args
    new = _copied(c, batched, lambda a: B.from_numpy(_resize(B.to_numpy(a), size, 0, B.kind(a) == "float"), a))
    if size < b:  # NOTE [Shape relations]: indices into the rows (MoE routing: token ids) stay in range
        for i in c.ints:
            v = B.to_numpy(args[i])
            if i not in batched and v.min(initial=0) >= 0 and v.max(initial=-1) < b <= v.size:
                new[i] = B.from_numpy(v % size, args[i])
    return Regime("batch_size", f"leading dimension {b} -> {size} on every input that has it", new, Spec())


def _batch_size(c: _Inputs):
    B, args = c.B, c.args
    first = next((i for i in c.tensors if B.ndim(args[i]) >= 1), None)
    if first is None:
        return "no input with a leading dimension"
    b = B.shape(args[first])[0]
    batched = [i for i in c.tensors if B.ndim(args[i]) >= 1 and B.shape(args[i])[0] == b]
    sizes = ([1] if b > 1 else []) + [b + b // 2 + 1]
    return [_batch_regime(c, b, batched, size) for size in sizes]


def _feature_regime(c: _Inputs, d: int, same: list[int], grow_ints: list[int], labels: list[int], size: int) -> Regime:
    B, args = c.B, c.args
    new = _copied(c, same, lambda a: B.from_numpy(_resize(B.to_numpy(a), size, -1, distinct=True), a))
    for i in grow_ints + [i for i in labels if i not in grow_ints]:
        v = B.to_numpy(args[i])
        if i in grow_ints:
            v = _resize(v, size, -1)
        if B.to_numpy(args[i]).max(initial=-1) < d:  # indices into this dimension (sentinels < 0 kept)
            v = np.where(v >= 0, v % size, v)
        new[i] = B.from_numpy(v, args[i])
    kind = "size 1" if size == 1 else ("not a power of two" if not _is_pow2(size) else "a power of two")
    return Regime("feature_dim", f"last dimension {d} -> {size} ({kind}) on every float input that has it", new, Spec())


def _feature_dim(c: _Inputs):
    B, args = c.B, c.args
    first = next((i for i in c.floats if B.ndim(args[i]) >= 1 and B.shape(args[i])[-1] >= 1), None)
    if first is None:
        return "no differentiated input with a last dimension"
    d = B.shape(args[first])[-1]
    nd = B.ndim(args[first])
    same = [i for i in c.tensors if B.kind(args[i]) == "float" and B.ndim(args[i]) >= 1 and B.shape(args[i])[-1] == d]
    # NOTE [Shape relations]: tensors that share the dimension grow with it, integer ones too when shaped like
    # the input (gather/scatter indices); integer values are remapped only where they can index into it (they
    # all fit in it, and the tensor is such an index or the input's shape without its last dimension, as
    # class labels are). An embedding's row indices keep their values: the vocabulary did not change.
    grow_ints = [i for i in c.ints if B.ndim(args[i]) == nd and B.shape(args[i])[-1] == d]
    labels = [i for i in c.ints if tuple(B.shape(args[i])) == tuple(B.shape(args[first]))[:-1]]
    sizes = [s for s in ([1] if d > 1 else []) + [d + 3 if _is_pow2(d) else 1 << d.bit_length()] if s != d]
    return [_feature_regime(c, d, same, grow_ints, labels, size) for size in sizes]


def _singleton_dim(c: _Inputs):
    B, args = c.B, c.args
    # (B, L) -> (B, 1, L): a size-1 dimension before the last on every tensor that has 2+ dimensions
    cand = [i for i in c.tensors if B.ndim(args[i]) >= 2]
    if not any(i in c.floats for i in cand) or any(1 in B.shape(args[i])[:-1] for i in cand):
        return "no differentiated input with 2+ dimensions, or one already has a size-1 dimension"
    new = _copied(c, cand, lambda a: B.from_numpy(np.expand_dims(B.to_numpy(a), axis=B.ndim(a) - 1), a))
    return [Regime("singleton_dim", "a size-1 dimension inserted before the last on every input with 2+ dimensions",
                   new, Spec(layout=True, reshaped=True))]


def _grad_subset(c: _Inputs):
    if len(c.floats) < 2:
        return "fewer than two differentiated inputs"
    names = c.names
    return [Regime("grad_subset", f"only {names[i] if i < len(names) else i} requires grad", list(c.args), Spec(), wrt=[i])
            for i in c.floats]


# the regimes built before the argument regimes are derived (the layout ones), and after; each strategy is named
# ``_<the regime it builds>``
_LAYOUT_STRATEGIES = (_noncontiguous, _channels_last)
_VALUE_STRATEGIES = (_repeated_indices, _kinks, _large_magnitude, _near_constant_rows, _batch_size, _feature_dim,
                     _singleton_dim, _grad_subset)


def _apply(strategies, c: _Inputs, selected, regimes: list[Regime], skipped: dict[str, str]) -> None:
    for strategy in strategies:
        name = strategy.__name__[1:]
        if name not in selected:
            continue
        built = strategy(c)
        if isinstance(built, str):
            skipped[name] = built
        elif built:
            regimes.extend(built)


def _argument_regime(B, args, kwargs, arguments, v, skipped: dict[str, str]) -> Regime | None:
    """An argument regime (NOTE [Argument regimes]), or None with why in ``skipped`` when its value cannot be passed."""
    try:
        new_args, new_kwargs = apply_variant(B, args, kwargs, arguments, v)
    except ValueError as exc:
        skipped.setdefault(v.strategy, f"{v.description}: {exc}")
        return None
    spec = Spec(numerical=v.numerical, convention=v.convention)
    return Regime(v.strategy, v.description, new_args, spec,
                  kwargs=new_kwargs if new_kwargs != kwargs else None,
                  argument=v.needs, new_argument=v.value is not v.argument.value,
                  arg_name=v.argument.name)


def build_regimes(B, args, wrt, kwargs, arguments: list[Argument], vary: dict, selected, names=None
                  ) -> tuple[list[Regime], dict[str, str]]:
    """Applicable regimes and, for the others, why they do not apply.

    # NOTE [Regimes real bugs needed]
    # Published kernel bugs hid in: feature/hidden sizes that are not a power of two or are 1 (Triton block
    # masks), a ``dim`` other than the last, only some inputs requiring grad (``ctx.needs_input_grad``
    # paths), ignore/padding values passed positionally, and a size-1 dimension among the others (a
    # ``squeeze()`` that drops it: entmax's sparsemax on attention scores shaped (B, 1, L)). ``feature_dim``,
    # ``singleton_dim``, ``grad_subset`` and the argument regimes (NOTE [Argument regimes]) cover them.
    """
    regimes: list[Regime] = []
    skipped: dict[str, str] = {}
    names = list(names or [])
    c = _Inputs(B, args, arguments, names, floats=[i for i in wrt if B.numel(args[i]) >= 1])
    _apply(_LAYOUT_STRATEGIES, c, selected, regimes, skipped)
    variants, arg_skipped = argument_regimes(B, args, wrt, names, arguments, vary, set(selected))
    skipped.update(arg_skipped)  # a selected argument strategy with no variant is listed, as the layout ones are
    c.sentinels = {v.argument.name: v.value for v in variants if v.strategy == "sentinel_indices"}
    _apply(_VALUE_STRATEGIES, c, selected, regimes, skipped)
    for v in variants:  # NOTE [Argument regimes]
        regime = _argument_regime(B, args, kwargs, arguments, v, skipped)
        if regime is not None:
            regimes.append(regime)
    return regimes, skipped


def shrink_candidates(B, args) -> list[list[Any]]:
    """Smaller versions of ``args`` (leading dimension 1) for minimal reproducers.

    # NOTE [Shrinking never mismatches shapes]
    # The first tensor input sets the batch; when its leading size is already 1 there is nothing to shrink. Another
    # input is cut with it only when its leading size is the batch's and it is not shaped like the batch tensor's
    # trailing dimensions (a per-feature weight or bias, whose size may equal the batch's). A candidate that pairs
    # x (1, 12) with a weight cut to (1,) is not a smaller case of the same call: a kernel without shape checks
    # writes 12 values into a 1-element gradient buffer (measured: heap corruption under the Triton interpreter,
    # FlagGems layer_norm, benchmarks/kernelbugs k04).
    """
    first = next((i for i, a in enumerate(args) if B.is_tensor(a) and B.ndim(a) >= 1), None)
    if first is None:
        return []
    batch_shape = tuple(B.shape(args[first]))
    b = batch_shape[0]
    if b <= 1:
        return []
    c = _Inputs(B, args, [], [], floats=[])
    shapes = {i: tuple(B.shape(args[i])) for i in c.tensors if B.ndim(args[i]) >= 1}
    per_feature = {i for i, s in shapes.items() if i != first and len(s) < len(batch_shape) and
                   s == batch_shape[len(batch_shape) - len(s):]}  # stays whole
    return [_batch_regime(c, b, [i for i, s in shapes.items() if s[0] == b and i not in per_feature], 1).args]


# ---- argument regimes (NOTE [Argument regimes])
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


def discover_arguments(B, fn: Callable, args: list, kwargs: dict) -> list[Argument]:
    """The non-tensor arguments of this call: positional scalars, ``kwargs`` and the signature's defaults."""
    params, by_keyword = call_parameters(fn)
    found: list[Argument] = []
    seen = set()
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    for pos, p in enumerate(positional):
        if pos < len(args):
            if not B.is_tensor(args[pos]) and args[pos] is not None:
                found.append(Argument(p.name, args[pos], pos, "positional", False))
        elif p.name in kwargs:
            found.append(Argument(p.name, kwargs[p.name], pos, "kwargs", True))
        elif p.default is not p.empty:  # None too: a positional call past it needs its value
            found.append(Argument(p.name, p.default, pos, "default", by_keyword and p.kind is not p.POSITIONAL_ONLY))
        else:
            continue
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
        norms = np.sort(np.sqrt((x.reshape(-1, x.shape[-1]) ** 2).sum(-1)) if x.ndim >= 1 and x.shape[-1] else
                        np.abs(x.reshape(-1)))
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


# strategy -> (its variants of one argument, why a selected strategy has none)
STRATEGIES: dict[str, tuple[Callable, str]] = {
    "reduction_dim": (_dims, "fn takes no dim/axis argument in range for the differentiated inputs"),
    "flags": (_flags, "fn takes no bool argument"),
    "offsets": (_offsets, "fn takes no offset/position argument"),
    "sentinel_indices": (_sentinels,
                         "fn takes no ignore_index/padding_idx-like argument, or there is no integer input"),
    "thresholds": (_thresholds, "fn takes no float bound/threshold/eps argument"),
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
        made = STRATEGIES[strategy][0](B, args, wrt, names, arg)
        variants += made
        if made:
            used.add(strategy)
    skipped = {s: why for s, (_, why) in STRATEGIES.items() if s in selected and s not in used}
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
