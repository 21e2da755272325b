"""What every framework's ``check_op`` adapter shares: the linearization record and framework-free helpers.

# NOTE [One audit engine]
# ``audit.run_check_op`` is the only numerical engine, for torch, Paddle and MindSpore. A framework gives it
# one adapter object (``checks.torch_ops.TorchBackend``, ``backends.paddle.check.PaddleCheckAdapter``,
# ``backends.mindspore.check.MindSporeCheckAdapter``) that answers framework questions: describe a tensor,
# convert to and from float64 numpy, run the op with autograd on (``linearize``) and pull a cotangent back
# (``vjp``), version and fingerprint for the mutation audit. ``unsupported`` names the check groups and regimes
# the framework has no means for (reported as skipped, with the reason); ``framework_checks`` are callables
# ``(audit, base_run) -> (failures, check_results, notes)`` for checks only one framework needs (Paddle's
# unchecked PyLayer saved tensors, MindSpore's bprop contract and graph mode).
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np


__all__ = ["Linearization", "AdapterBase", "VjpAdapter", "FLOAT_EPS", "OpRaised"]

FLOAT_EPS = {
    "float64": float(np.finfo(np.float64).eps),
    "float32": float(np.finfo(np.float32).eps),
    "float16": float(np.finfo(np.float16).eps),
    "bfloat16": 2.0**-7,
}


class OpRaised(Exception):
    """``fn`` (or its backward) raised ``error`` during ``phase``: a finding of ``check_op``, not a crash."""

    def __init__(self, phase: str, error: BaseException, dtype: str | None = None, autograd_off: bool = False):
        super().__init__(f"{phase} raised {type(error).__name__}: {error}")
        self.phase = phase  # as the framework's user says it: "forward under paddle.no_grad()"
        self.error = error
        self.dtype = dtype
        self.autograd_off = autograd_off  # the forward with autograd off, as finite differences run it


@dataclass
class Linearization:
    """One forward pass with its graph kept alive: outputs as float64 numpy, and a pullback (VJP)."""

    outputs: list[np.ndarray]  # differentiable outputs, float64 copies
    out_names: list[str]
    out_dtypes: list[str]
    out_tensors: list[Any]
    all_outputs: list[tuple[str, Any]]
    leaves: list[Any]  # the differentiable inputs as fed to fn (fresh copies)
    args: list[Any]  # every argument as fed to fn
    backend: Any = None  # the adapter that made it (answers vjp_tensors / cotangent_tensors)
    state: Any = None  # whatever the adapter needs to pull back (MindSpore: its vjp function)

    def pullback(self, cotangents: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Gradients of the differentiable inputs for one cotangent per differentiable output (float64 numpy)."""
        return [self.backend.to_numpy(g) for g in self.backend.vjp_tensors(self, self.cotangent_tensors(cotangents))]

    def release(self) -> None:
        """Let the graph go (no pullback afterwards); outputs stay, detached, as templates for dtype and shape."""
        detached = self.backend.detached
        self.out_tensors = [detached(o) for o in self.out_tensors]
        self.all_outputs = [(n, detached(o)) for n, o in self.all_outputs]
        self.leaves, self.args, self.state = [], [], None

    def cotangent_tensors(self, cotangents: Sequence[np.ndarray]) -> list[Any]:
        return [self.backend.from_numpy(c, o) for c, o in zip(cotangents, self.out_tensors)]


def flatten_outputs(obj: Any, is_tensor: Callable[[Any], bool], path: str = "output") -> list[tuple[str, Any]]:
    """(name, tensor) for every tensor in a (nested) result; a single tensor is named ``output``."""
    out: list[tuple[str, Any]] = []
    _flatten(obj, path, out, is_tensor)
    if len(out) == 1:
        out = [("output", out[0][1])]
    return out


def _flatten(obj: Any, path: str, out: list, is_tensor) -> None:
    if is_tensor(obj):
        out.append((path, obj))
    elif isinstance(obj, (tuple, list)):
        fields = getattr(obj, "_fields", None)
        for i, item in enumerate(obj):
            _flatten(item, f"{path}.{fields[i]}" if fields else f"{path}[{i}]", out, is_tensor)
    elif isinstance(obj, dict):
        for key, item in obj.items():
            _flatten(item, f"{path}[{key!r}]", out, is_tensor)
    elif hasattr(obj, "__dataclass_fields__"):
        for key in obj.__dataclass_fields__:
            _flatten(getattr(obj, key), f"{path}.{key}", out, is_tensor)


def _parameters(fn: Callable) -> list[inspect.Parameter]:
    try:
        return list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return []


def call_parameters(fn: Callable) -> tuple[list[inspect.Parameter], bool]:
    """fn's parameters and whether they go by keyword (Function/PyLayer.apply: forward's but ctx, positional only)."""
    params = _parameters(fn)
    owner = getattr(fn, "__self__", None)
    forward = getattr(owner, "forward", None) if isinstance(owner, type) else None
    if forward is None or [p for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]:
        return params, True
    inner = _parameters(forward)
    return (inner[1:] if inner and inner[0].name in ("ctx", "context") else inner), False


def first_line(error: BaseException) -> str:
    """``Type: first line of the message`` (at most 300 characters), for a skip reason or a note."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


class AdapterBase:
    """Framework-free answers shared by every adapter (signature reading, names, tolerances)."""

    name = "?"
    unsupported: dict[str, str] = {}
    framework_checks: tuple = ()
    opcheck = False  # the framework's own operator-registration checker (torch.library.opcheck) runs with "mutation"
    no_grad_hint = "a no-grad context"

    def eps(self, dtype_name: str) -> float:
        return FLOAT_EPS.get(dtype_name, FLOAT_EPS["float32"])

    def round_to(self, arr: np.ndarray, dtype_name: str) -> np.ndarray:
        """``arr`` rounded to ``dtype_name`` (round to nearest even) and back to float64, without a framework."""
        arr = np.asarray(arr, dtype=np.float64)
        if dtype_name == "bfloat16":
            bits = arr.astype(np.float32).view(np.uint32)
            finite = np.isfinite(arr)
            rounded = ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000))
            out = rounded.view(np.float32).astype(np.float64)
            return np.where(finite, out, arr.astype(np.float32).astype(np.float64))
        if dtype_name in ("float16", "float32"):
            return arr.astype(dtype_name).astype(np.float64)
        return arr.copy()

    def from_numpy(self, arr: np.ndarray, like: Any, dtype_name: str | None = None):
        """A framework tensor holding a private copy of ``arr`` in ``dtype_name`` (``like``'s dtype when None).
        Floating values go through float64 first (NOTE [Fresh copies] in ``torch_ops``: a framework's tensor made
        from numpy may share its memory, and an op writing into it would corrupt the audit's own arrays)."""
        dtype_name = dtype_name or self.dtype_name(like)
        arr = np.array(np.asarray(arr), copy=True, order="C")
        return self.tensor_from(arr.astype(np.float64) if dtype_name in FLOAT_EPS else arr, dtype_name)

    def tensor_from(self, arr: np.ndarray, dtype_name: str):
        """The framework's tensor of a private numpy array, cast to ``dtype_name`` (for the base ``from_numpy``)."""
        raise NotImplementedError

    def fingerprint(self, t: Any) -> int:
        """xxh3-64 of the tensor's values: the core hash of a host copy in logical order (``host_values``)."""
        from ..core.engine import fingerprint_bytes

        return fingerprint_bytes(np.ascontiguousarray(self.host_values(t)), "full")

    def host_values(self, t: Any) -> np.ndarray:
        """A numpy copy of the values in the tensor's own dtype (adapters without their own ``fingerprint``)."""
        raise NotImplementedError

    def memory_span(self, t: Any) -> tuple[int, int] | None:
        return None  # the framework's tensors do not say which memory they view: aliasing is ``unsupported``

    def autograd_view_of(self, out: Any, inp: Any) -> bool:
        return False

    def kind(self, t: Any) -> str:
        """float | complex | int | bool, from the dtype's name."""
        dt = self.dtype_name(t)
        if dt in FLOAT_EPS:
            return "float"
        if dt.startswith("complex"):
            return "complex"
        return "bool" if dt == "bool" else "int"

    tensor_type: type = object  # the framework's tensor class

    def is_tensor(self, x: Any) -> bool:
        return isinstance(x, self.tensor_type)

    def dtype_name(self, t: Any) -> str:
        return str(t.dtype).split(".")[-1]  # torch.float32, paddle.float32

    def shape(self, t: Any) -> tuple[int, ...]:
        return tuple(int(s) for s in t.shape)

    def detached(self, t: Any) -> Any:
        """``t`` without its autograd history (frameworks whose tensors hold no graph return it as is)."""
        return t

    def ndim(self, t: Any) -> int:
        return len(self.shape(t))

    def numel(self, t: Any) -> int:
        return int(np.prod(self.shape(t), dtype=np.int64))

    def describe(self, t: Any) -> str:
        if not self.is_tensor(t):  # a pass-through argument (scalar, None, tuple ...)
            text = repr(t)
            return f"{type(t).__name__} {text if len(text) <= 40 else text[:37] + '...'}"
        return f"{self.dtype_name(t)}[{', '.join(map(str, self.shape(t)))}]"

    def outputs(self, result: Any) -> list[tuple[str, Any]]:
        return flatten_outputs(result, self.is_tensor)

    def linearization(self, fed: list, leaves: list, all_outs: list[tuple[str, Any]],
                      differentiable: Callable[[Any], bool], state: Any = None) -> Linearization:
        """The record of one forward: every tensor output, and the differentiable ones as float64 copies."""
        diff = [(n, o) for n, o in all_outs if self.kind(o) in ("float", "complex") and differentiable(o)]
        return Linearization(outputs=[self.to_numpy(o) for _, o in diff], out_names=[n for n, _ in diff],
                             out_dtypes=[self.dtype_name(o) for _, o in diff], out_tensors=[o for _, o in diff],
                             all_outputs=all_outs, leaves=leaves, args=fed, backend=self, state=state)

    def with_values(self, t: Any, values: np.ndarray, dtype_name: str | None = None) -> Any:
        """A tensor like ``t`` (dtype, device) holding ``values``."""
        return self.from_numpy(values.reshape(self.shape(t)) if values.size == self.numel(t) else values, t, dtype_name)

    def prepare(self, args: Sequence[Any], wrt: Sequence[int]) -> tuple[list[Any], list[Any]]:
        """Fresh copies of ``args`` (the user's tensors are never fed to the op) and the leaves among them."""
        fed = [self.clone(a) if self.is_tensor(a) else a for a in args]
        for i in wrt:
            fed[i] = self.leaf(fed[i])
        return fed, [fed[i] for i in wrt]

    def leaf(self, t: Any) -> Any:
        return t  # ``t`` marked as an input autograd differentiates (by position, as MindSpore does: as is)

    def clone(self, t: Any) -> Any:
        """A private copy; a non-contiguous tensor stays non-contiguous (the ``noncontiguous`` regime)."""
        if self.numel(t) > 1 and not self.is_contiguous(t):
            return self.noncontiguous_copy(t)
        return self.copy(t)

    # frameworks that record only inside their own vjp call need no context to turn autograd off, or on
    def autograd_off(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def grad_mode(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    # the framework's ``grad`` (torch.autograd.grad, paddle.grad): the gradients of ``inputs`` (None where unused) for
    # cotangents ``cots`` of ``outputs``
    grad: Callable = NotImplemented

    def linearize(self, fn: Callable, args: Sequence[Any], kwargs: dict, wrt: Sequence[int],
                  prepared: tuple | None = None) -> Linearization:
        """Run ``fn`` on fresh copies of ``args`` (or the ``prepared`` ones) with the ``wrt`` positions as leaves."""
        fed, leaves = prepared if prepared is not None else self.prepare(args, wrt)
        try:
            with self.grad_mode():
                result = fn(*fed, **kwargs)
        except Exception as exc:
            raise OpRaised("forward", exc, self._float_dtypes(fed)) from exc
        return self.linearization(fed, leaves, self.outputs(result), self.requires_grad)

    def pull(self, lin: Linearization, cots: list) -> Sequence[Any]:
        """The leaves' gradients (None where unused) for the cotangent tensors ``cots`` of ``lin.out_tensors``."""
        return self.grad(lin.out_tensors, lin.leaves, cots, retain_graph=True, allow_unused=True)

    def vjp_tensors(self, lin: Linearization, cots: list) -> list:
        try:
            with self.grad_mode():
                grads = self.pull(lin, cots)
        except Exception as exc:
            raise OpRaised("backward", exc, lin.out_dtypes[0] if lin.out_dtypes else None) from exc
        return [self.zeros_like(leaf) if g is None else g for leaf, g in zip(lin.leaves, grads)]

    # ---- composition (NOTE [Composition] in ``audit``) through the framework's ``grad``
    def call_producer(self, producer: Callable, base: Any, isolate: bool) -> tuple[Any, Any]:
        """(leaf, producer(leaf)); with ``isolate`` the op gets a clone, so it cannot corrupt the producer."""
        leaf = self.leaf(self.clone(base))
        with self.grad_mode():
            y = producer(leaf)
            if isolate:
                y = y.clone()
        return leaf, y

    def run_graph(self, fn: Callable, fed: Sequence[Any], kwargs: dict) -> list[tuple[str, Any]]:
        """Differentiable outputs of ``fn(*fed)``, fed exactly as given (no copies)."""
        with self.grad_mode():
            outs = self.outputs(fn(*fed, **kwargs))
        return [(n, o) for n, o in outs if self.requires_grad(o)]

    def grad_of(self, outputs: list, leaf: Any, cot_tensors: list) -> np.ndarray:
        with self.grad_mode():
            (g,) = self.grad(outputs, [leaf], cot_tensors, retain_graph=None, allow_unused=True)
        return np.zeros(self.shape(leaf)) if g is None else self.to_numpy(g)

    autograd_off_phase = "forward with autograd off"  # OpRaised's phase for a forward64 that raised

    def forward64(self, fn: Callable, args: Sequence[Any], kwargs: dict, out_names: Sequence[str]) -> list[np.ndarray]:
        """Outputs named ``out_names`` of ``fn(*args)`` with autograd off, as float64 numpy."""
        fed = [self.clone(a) if self.is_tensor(a) else a for a in args]
        try:
            with self.autograd_off():
                outs = dict(self.outputs(fn(*fed, **kwargs)))
        except Exception as exc:  # an op that only runs with autograd on is a finding (Liger-Kernel#930), not a crash
            raise OpRaised(self.autograd_off_phase, exc, self._float_dtypes(fed), autograd_off=True) from exc
        return [self.to_numpy(outs[n]) for n in out_names]

    def _float_dtypes(self, fed) -> str | None:
        """The floating dtypes fn was fed, for an OpRaised message ("float32, float64")."""
        names = {self.dtype_name(a) for a in fed if self.is_tensor(a) and self.kind(a) == "float"}
        return ", ".join(sorted(names)) or None

    literal_call = ""  # Python source of a tensor, with its values at {values} and its dtype's name at {dtype}
    literal_dtypes: dict[str, str] = {}  # a dtype's name in that source where it is not the dtype's own

    def literal(self, t: Any) -> str:
        """Python source that rebuilds ``t`` exactly (for small tensors; repr for float64 values)."""
        dt = self.dtype_name(t)
        if self.kind(t) != "float":
            fmt = lambda v: str(int(v))
        elif dt == "float64":
            fmt = lambda v: repr(float(v))
        else:  # shortest float32 text that round-trips (exact for float16/bfloat16 values too)
            fmt = lambda v: np.format_float_positional(np.float32(v), unique=True, trim="0")
        values = np.array2string(self.to_numpy(t), separator=", ", threshold=10**6, max_line_width=96,
                                 formatter={"all": fmt})
        return self.literal_call.format(values=values, dtype=self.literal_dtypes.get(dt, dt))

    # check -> {finding field: this framework's text}: the engine's torch-worded advice restated (a phrasebook)
    phrasebook: dict[str, dict[str, str]] = {}
    # (check, torch's phrase, this framework's phrase) replaced inside a finding's message
    message_phrases: tuple[tuple[str, str, str], ...] = ()
    # a framework whose producers are differentiated by a vjp call: that call on ``a``, the producer's name at {}
    composition_vjp = ""

    def reword(self, report: Any) -> None:
        """Restate the engine's torch-worded advice in this framework's terms (verdicts never change)."""
        for f in report.findings:
            for field, text in self.phrasebook.get(f.check, {}).items():
                setattr(f, field, text)
            for check, old, new in self.message_phrases:
                if f.check == check:
                    f.message = f.message.replace(old, new)
            if self.composition_vjp and f.check.startswith("composition."):
                f.fix = f.fix.replace(".clone()", ".copy()")
                f.repro = (f"a = {f.input}.copy()\n{self.composition_vjp.format(f.check.split('.', 1)[1])}\n"
                           f"# the gradient of a through op(y) differs from the one through op(y.copy())")

    @contextlib.contextmanager
    def audit_threads(self, args: Sequence[Any]):
        yield

    def signature_defaults(self, fn: Callable) -> dict[str, Any]:
        return {p.name: p.default for p in _parameters(fn) if p.default is not p.empty}

    def parameter_names(self, fn: Callable, n: int) -> list[str]:
        # the positional parameters come first (a signature's order)
        positional = [p.name for p in call_parameters(fn)[0] if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        names = [positional[i] if i < len(positional) else f"inputs[{i}]" for i in range(n)]
        if len(set(names)) != len(names):
            names = [f"inputs[{i}]" for i in range(n)]
        return names

    apply_owner: type | None = None  # Function / PyLayer: ``fn`` is its ``apply``, named "<class>.apply"
    module_type: type | None = None  # Module / Layer / Cell: named by its class
    name_attrs = ("__qualname__", "__name__")

    def op_name(self, fn: Callable) -> str:
        owner = getattr(fn, "__self__", None)
        if self.apply_owner is not None and isinstance(owner, type) and issubclass(owner, self.apply_owner):
            return f"{owner.__name__}.apply"
        if self.module_type is not None and isinstance(fn, self.module_type):
            return type(fn).__name__
        for attr in self.name_attrs:
            name = getattr(fn, attr, None)
            if isinstance(name, str):
                return name
        return type(fn).__name__


class VjpAdapter(AdapterBase):
    """An adapter for a framework that records only inside its vjp call (``ms.vjp``, autograd's ``make_vjp``). It
    answers ``_closure(fn, fed, kwargs, positions, seen)`` (fn of the arguments at ``positions``, the others closed
    over; ``seen`` gets its outputs, "all", and the differentiable ones, "diff"), ``_vjp(f, xs)`` (f's value at ``xs``
    and its pullback) and ``_chained_cotangents`` (one per output of a closure: the engine's, else zeros). Composition
    (NOTE [Composition] in ``audit``) chains two vjps by hand, the op fed the producer's own output (what the
    producer's vjp closed over), so a write into it corrupts what the producer saved, as it would in a model."""

    def _vjp_one(self, f: Callable, x: Any) -> tuple[Any, Callable]:
        return self._vjp(f, [x])

    def pull(self, lin: Linearization, cots: list) -> Sequence[Any]:
        pullback, diff = lin.state
        return pullback(tuple(self._chained_cotangents(diff, lin.out_tensors, cots)))  # a tuple's cotangent: a tuple

    def linearize(self, fn: Callable, args: Sequence[Any], kwargs: dict, wrt: Sequence[int],
                  prepared: tuple | None = None) -> Linearization:
        """The vjp of ``fn`` in its ``wrt`` inputs (fresh copies; the other inputs closed over)."""
        fed, leaves = prepared if prepared is not None else self.prepare(args, wrt)
        seen: dict[str, Any] = {}
        closure = self._closure(fn, fed, kwargs, wrt, seen)
        try:
            _, pullback = self._vjp(closure, leaves)
        except Exception as exc:
            raise OpRaised("forward", exc, self._float_dtypes(fed)) from exc
        diff_ids = {id(o) for _, o in seen["diff"]}
        return self.linearization(fed, leaves, seen["all"], lambda o: id(o) in diff_ids, state=(pullback, seen["diff"]))

    def call_producer(self, producer: Callable, base: Any, isolate: bool) -> tuple[Any, Any]:
        """(leaf, y): y is the producer's own output, or with ``isolate`` a private copy."""
        leaf = self.clone(base)
        y, producer_pullback = self._vjp_one(producer, leaf)
        fed_y = self.copy(y) if isolate else y
        self._chain = {"leaf": leaf, "y": fed_y, "producer": producer_pullback}
        return leaf, fed_y

    def run_graph(self, fn: Callable, fed: Sequence[Any], kwargs: dict) -> list[tuple[str, Any]]:
        """Differentiable outputs of ``fn(*fed)``, fed exactly as given; differentiated in the producer's output."""
        chain = self._chain
        k = next(j for j, a in enumerate(fed) if a is chain["y"])  # call_producer's output, fed by the audit
        seen: dict[str, Any] = {}
        chain["op"] = self._vjp(self._closure(fn, fed, kwargs, [k], seen), [fed[k]])[1]
        chain["outs"] = seen["diff"]
        return seen["diff"]

    def grad_of(self, outputs: list, leaf: Any, cot_tensors: list) -> np.ndarray:
        chain = self._chain  # call_producer's and run_graph's, for this leaf (``audit._grad_through``)
        (g_y,) = chain["op"](tuple(self._chained_cotangents(chain["outs"], outputs, cot_tensors)))
        g = chain["producer"](g_y)
        g = g[0] if isinstance(g, (tuple, list)) else g
        self._chain = {}
        return np.zeros(self.shape(leaf)) if g is None else self.to_numpy(g)
