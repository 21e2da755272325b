"""Regimes: input variants derived from the inputs the user gave, where backward bugs like to hide.

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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ._arguments import BOUND, Argument, apply_variant, argument_regimes

__all__ = ["Spec", "Regime", "build_regimes", "REGIME_NAMES", "SENTINEL_KWARGS"]

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
NEAR_CONSTANT_SPREAD = 1e-3


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


def _resize_last(v: np.ndarray, size: int, distinct: bool = False) -> np.ndarray:
    """``v`` with its last dimension cut or cyclically extended to ``size``; ``distinct``: each further copy scaled by
    0.9 (float inputs: a copied column would tie with its original, and ties are kinks for sort, max, top-k)."""
    idx = np.arange(size) % v.shape[-1]
    out = v[..., idx]
    return out * 0.9 ** (np.arange(size) // v.shape[-1]) if distinct else out


def _ties(rounded: np.ndarray, original: np.ndarray) -> bool:
    """Whether some row of ``rounded`` has fewer distinct values than the same row of ``original``."""
    r, o = rounded.reshape(-1, rounded.shape[-1]), original.reshape(-1, original.shape[-1])
    distinct = lambda m: (np.diff(np.sort(m, axis=1), axis=1) != 0).sum(axis=1)  # noqa: E731 (per row, minus one)
    return bool(np.any(distinct(r) < distinct(o)))


def _grow_rows(v: np.ndarray, size: int, distinct: bool) -> np.ndarray:
    """``v`` with its leading dimension cut or cyclically extended to ``size`` (copies scaled as in _resize_last)."""
    idx = np.arange(size) % v.shape[0]
    out = v[idx]
    if distinct:
        out = out * (0.9 ** (np.arange(size) // v.shape[0])).reshape((-1,) + (1,) * (v.ndim - 1))
    return out


def _int_positions(B, args) -> list[int]:
    return [i for i, a in enumerate(args) if B.is_tensor(a) and B.kind(a) == "int" and B.numel(a) >= 1]


def _with(B, args, i, values):
    out = list(args)
    out[i] = B.with_values(args[i], values)
    return out


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
    tensors = [i for i, a in enumerate(args) if B.is_tensor(a)]
    ints = _int_positions(B, args)
    floats = [i for i in wrt if B.numel(args[i]) >= 1]

    def want(name):
        return name in selected

    if want("noncontiguous"):
        cand = [i for i in tensors if B.numel(args[i]) > 1]
        if cand:
            new = list(args)
            for i in cand:
                new[i] = B.noncontiguous_copy(args[i])
            regimes.append(Regime("noncontiguous", "every tensor input copied into strided (non-contiguous) memory, same values", new, Spec(layout=True)))
        else:
            skipped["noncontiguous"] = "no tensor input with more than one element"

    if want("channels_last"):
        cand = [i for i in tensors if B.ndim(args[i]) == 4]
        if cand:
            new = list(args)
            for i in cand:
                new[i] = B.channels_last_copy(args[i])
            regimes.append(Regime("channels_last", "4-D inputs in channels_last memory format, same values", new, Spec(layout=True)))
        else:
            skipped["channels_last"] = "no 4-D input"

    variants, arg_skipped = argument_regimes(B, args, wrt, names, arguments, vary, set(selected))
    sentinels = {v.argument.name: v.value for v in variants if v.strategy == "sentinel_indices"}

    if want("repeated_indices"):
        cand = [i for i in ints if B.numel(args[i]) >= 2]
        if cand:
            new = list(args)
            for i in cand:
                v = B.to_numpy(args[i]).reshape(-1).copy()
                valid = [x for x in v if x not in sentinels.values()]
                if not valid:
                    continue
                v[1::2] = valid[0]
                new = _with(B, new, i, v)
            regimes.append(Regime("repeated_indices", "every second entry of each integer input set to the same index", new, Spec()))
        else:
            skipped["repeated_indices"] = "no integer input with two or more entries"

    if want("kinks"):
        if floats:
            points = kink_points(arguments)
            new = list(args)
            for i in floats:
                v = B.to_numpy(args[i]).reshape(-1).copy()
                v[::3] = np.resize(np.array(points), v[::3].shape)
                new = _with(B, new, i, v)
            pts = ", ".join(f"{p:g}" for p in points)
            regimes.append(Regime("kinks", f"every third entry of each differentiated input set to a kink/boundary value ({pts})", new, Spec(numerical=False, precision=False, convention=True)))

    if want("large_magnitude"):
        if floats:
            new = list(args)
            for i in floats:
                new = _with(B, new, i, B.to_numpy(args[i]) * LARGE_SCALE)
            regime = Regime("large_magnitude", f"differentiated inputs multiplied by {LARGE_SCALE:g}", new, Spec())
            # NOTE [Outside the domain]: where fn's float64 outputs are not finite at x1000 (log-probabilities
            # x1000 are no log-probabilities), the inputs scaled so that the largest is 100 in float32, 12.5 in float16 (or the largest magnitude,
            # when none is positive) still overflow exp in float32 and not in float64, which is the bug this regime
            # is for
            top = max((float(np.max(B.to_numpy(args[i]), initial=0.0)) for i in floats), default=0.0) or \
                max((float(np.max(np.abs(B.to_numpy(args[i])), initial=0.0)) for i in floats), default=0.0)
            largest = 1.13 * np.log(_DTYPE_MAX.get(B.dtype_name(args[floats[0]]), _DTYPE_MAX["float32"]))
            if top > 0 and 1.0 < largest / top < LARGE_SCALE:
                scale = largest / top
                moderate = list(args)
                for i in floats:
                    moderate = _with(B, moderate, i, B.to_numpy(args[i]) * scale)
                regime.fallback = Regime("large_magnitude", f"differentiated inputs multiplied by {scale:.3g} (largest "
                                                            f"{largest:.3g})", moderate, Spec())
            regimes.append(regime)

    if want("near_constant_rows"):
        cand = [i for i in floats if B.ndim(args[i]) >= 2 and B.shape(args[i])[-1] >= 2]
        if not cand:
            cand = [i for i in floats if B.ndim(args[i]) >= 1 and B.shape(args[i])[-1] >= 2][:1]
        if cand:
            new = list(args)
            spreads = []
            for i in cand:
                v = B.to_numpy(args[i])
                mean = v.mean(axis=-1, keepdims=True)
                spread = NEAR_CONSTANT_SPREAD
                # NOTE [No ties made]: squeezed rows rounded to bfloat16/float16 collapse onto a few values, and ties
                # are kinks (sort, max, top-k) where finite differences mean nothing: the spread grows until the row's
                # distinct values stay distinct in the input's dtype
                while spread < 0.25 and _ties(B.round_to(mean + spread * (v - mean), B.dtype_name(args[i])), v):
                    spread *= 2
                spreads.append(spread)
                new = _with(B, new, i, mean + spread * (v - mean))
            spread = max(spreads)
            regimes.append(Regime("near_constant_rows", f"rows (last dim) squeezed to their mean +- {spread:g} x deviation (variance near eps)", new, Spec(precision=False)))
        else:
            skipped["near_constant_rows"] = "no differentiated input with rows of two or more elements"

    if want("batch_size"):
        first = next((i for i in tensors if B.ndim(args[i]) >= 1), None)
        if first is not None:
            b = B.shape(args[first])[0]
            batched = [i for i in tensors if B.ndim(args[i]) >= 1 and B.shape(args[i])[0] == b]
            sizes = ([1] if b > 1 else []) + [b + b // 2 + 1]
            for size in sizes:
                new = list(args)
                for i in batched:
                    new[i] = B.from_numpy(_grow_rows(B.to_numpy(args[i]), size, B.kind(args[i]) == "float"), args[i])
                if size < b:  # NOTE [Shape relations]: indices into the rows (MoE routing: token ids) stay in range
                    for i in ints:
                        v = B.to_numpy(args[i])
                        if i not in batched and v.min(initial=0) >= 0 and v.max(initial=-1) < b <= v.size:
                            new[i] = B.from_numpy(v % size, args[i])
                regimes.append(Regime("batch_size", f"leading dimension {b} -> {size} on every input that has it", new, Spec()))
        else:
            skipped["batch_size"] = "no input with a leading dimension"
    if want("feature_dim"):
        first = next((i for i in floats if B.ndim(args[i]) >= 1 and B.shape(args[i])[-1] >= 1), None)
        if first is not None:
            d = B.shape(args[first])[-1]
            nd = B.ndim(args[first])
            same = [i for i in tensors if B.kind(args[i]) == "float" and B.ndim(args[i]) >= 1 and B.shape(args[i])[-1] == d]
            # NOTE [Shape relations]: tensors that share the dimension grow with it, integer ones too when shaped like
            # the input (gather/scatter indices); integer values are remapped only where they can index into it (they
            # all fit in it, and the tensor is such an index or the input's shape without its last dimension, as
            # class labels are). An embedding's row indices keep their values: the vocabulary did not change.
            grow_ints = [i for i in ints if B.ndim(args[i]) == nd and B.shape(args[i])[-1] == d]
            labels = [i for i in ints if tuple(B.shape(args[i])) == tuple(B.shape(args[first]))[:-1]]
            sizes = [s for s in ([1] if d > 1 else []) + [d + 3 if _is_pow2(d) else 1 << d.bit_length()] if s != d]
            for size in sizes:
                new = list(args)
                for i in same:
                    new[i] = B.from_numpy(_resize_last(B.to_numpy(args[i]), size, distinct=True), args[i])
                for i in grow_ints + [i for i in labels if i not in grow_ints]:
                    v = B.to_numpy(args[i])
                    if i in grow_ints:
                        v = _resize_last(v, size)
                    if B.to_numpy(args[i]).max(initial=-1) < d:  # indices into this dimension (sentinels < 0 kept)
                        v = np.where(v >= 0, v % size, v)
                    new[i] = B.from_numpy(v, args[i])
                kind = "size 1" if size == 1 else ("not a power of two" if not _is_pow2(size) else "a power of two")
                regimes.append(Regime("feature_dim", f"last dimension {d} -> {size} ({kind}) on every float input that has it", new, Spec()))
        else:
            skipped["feature_dim"] = "no differentiated input with a last dimension"

    if want("singleton_dim"):
        # (B, L) -> (B, 1, L): a size-1 dimension before the last on every tensor that has 2+ dimensions
        cand = [i for i in tensors if B.ndim(args[i]) >= 2]
        if any(i in floats for i in cand) and not any(1 in B.shape(args[i])[:-1] for i in cand):
            new = list(args)
            for i in cand:
                v = B.to_numpy(args[i])
                new[i] = B.from_numpy(np.expand_dims(v, axis=v.ndim - 1), args[i])
            regimes.append(Regime("singleton_dim", "a size-1 dimension inserted before the last on every input with 2+ dimensions",
                                  new, Spec(layout=True, reshaped=True)))
        else:
            skipped["singleton_dim"] = "no differentiated input with 2+ dimensions, or one already has a size-1 dimension"

    if want("grad_subset"):
        if len(floats) >= 2:
            for i in floats:
                regimes.append(Regime("grad_subset", f"only {names[i] if i < len(names) else i} requires grad", list(args), Spec(), wrt=[i]))
        else:
            skipped["grad_subset"] = "fewer than two differentiated inputs"

    for v in variants:  # NOTE [Argument regimes]
        try:
            new_args, new_kwargs = apply_variant(B, args, kwargs, arguments, v)
        except ValueError as exc:
            skipped.setdefault(v.strategy, f"{v.description}: {exc}")
            continue
        spec = Spec(numerical=v.numerical, convention=v.convention)
        regimes.append(Regime(v.strategy, v.description, new_args, spec,
                              kwargs=new_kwargs if new_kwargs != kwargs else None,
                              argument=v.needs, new_argument=v.value is not v.argument.value,
                              arg_name=v.argument.name))
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
    new = list(args)
    for i, a in enumerate(args):
        if not (B.is_tensor(a) and B.ndim(a) >= 1):
            continue
        shape = tuple(B.shape(a))
        if shape[0] != b:
            continue
        if i != first and len(shape) < len(batch_shape) and shape == batch_shape[len(batch_shape) - len(shape):]:
            continue  # per-feature: stays whole
        new[i] = B.from_numpy(B.to_numpy(a)[:1], a)
    for i, a in enumerate(args):  # NOTE [Shape relations]: indices into the rows (MoE token ids) stay in range
        if new[i] is a and B.is_tensor(a) and B.kind(a) == "int" and B.ndim(a) >= 1:
            v = B.to_numpy(a)
            if v.min(initial=0) >= 0 and v.max(initial=-1) < b <= v.size:
                new[i] = B.from_numpy(v % 1, a)
    return [new]
