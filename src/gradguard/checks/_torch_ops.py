"""Everything ``check_op`` needs from PyTorch, behind a handful of small functions.

# NOTE [Backend adapter]
# The audit itself (``_audit``, ``_numerical``, ``_regimes``, ``_mutation``, ``_composition``) does its
# arithmetic in float64 numpy and talks to the framework only through an object with the methods below.
# A Paddle or MindSpore ``check_op`` needs one more class with the same methods (``linearize``,
# ``forward64``, ``to_numpy``, ``from_numpy``, ``fingerprint``, ``version``, layout copies, producers) and
# nothing else. Keep framework calls out of the other modules.
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch
import xxhash

from ._op_raised import NO_GRAD_FORWARD, OpRaised

__all__ = ["TorchBackend", "Linearization", "TORCH", "SMALL_INPUT_NUMEL"]

SMALL_INPUT_NUMEL = 1 << 16

_FLOAT_EPS = {
    "float64": float(torch.finfo(torch.float64).eps),
    "float32": float(torch.finfo(torch.float32).eps),
    "float16": float(torch.finfo(torch.float16).eps),
    "bfloat16": float(torch.finfo(torch.bfloat16).eps),
}


def _np_tensor(arr) -> torch.Tensor:
    """A tensor holding a private copy of ``arr`` (0-d stays 0-d).

    # NOTE [Fresh copies]
    # ``torch.from_numpy`` shares memory, and ``.to(float64)`` of a float64 tensor is a no-op, so an op
    # whose backward writes into ``grad_output`` (``g.mul_(2)``) or whose forward writes into its input
    # would otherwise corrupt the audit's own cotangents and probe points. Every tensor handed to the op
    # is a fresh copy; every comparison uses numpy copies taken before the call.
    """
    arr = np.array(arr, copy=True, order="C")
    return torch.from_numpy(arr).reshape(arr.shape)


def _flatten(obj: Any, path: str, out: list[tuple[str, Any]]) -> None:
    if isinstance(obj, torch.Tensor):
        out.append((path, obj))
    elif isinstance(obj, (tuple, list)):
        fields = getattr(obj, "_fields", None)
        for i, item in enumerate(obj):
            _flatten(item, f"{path}.{fields[i]}" if fields else f"{path}[{i}]", out)
    elif isinstance(obj, dict):
        for key, item in obj.items():
            _flatten(item, f"{path}[{key!r}]", out)
    elif hasattr(obj, "__dataclass_fields__"):
        for key in obj.__dataclass_fields__:
            _flatten(getattr(obj, key), f"{path}.{key}", out)


@dataclass
class Linearization:
    """One forward pass with its graph kept alive: outputs as float64 numpy, and a pullback (VJP)."""

    outputs: list[np.ndarray]  # differentiable outputs, float64 copies
    out_names: list[str]
    out_dtypes: list[str]
    out_tensors: list[torch.Tensor]
    all_outputs: list[tuple[str, torch.Tensor]]
    leaves: list[torch.Tensor]  # the differentiable inputs as fed to fn (fresh copies)
    args: list[Any]  # every argument as fed to fn

    def pullback(self, cotangents: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Gradients of the differentiable inputs for one cotangent per differentiable output (float64 numpy)."""
        grads = self.pullback_tensors(cotangents)
        return [TORCH.to_numpy(g) for g in grads]

    def pullback_tensors(self, cotangents: Sequence[np.ndarray], cot_tensors: list | None = None) -> list[torch.Tensor]:
        cots = cot_tensors if cot_tensors is not None else self.cotangent_tensors(cotangents)
        try:
            with torch.enable_grad():
                grads = torch.autograd.grad(self.out_tensors, self.leaves, cots, retain_graph=True, allow_unused=True)
        except Exception as exc:
            raise OpRaised("backward", exc, self.out_dtypes[0] if self.out_dtypes else None) from exc
        return [torch.zeros_like(leaf) if g is None else g for leaf, g in zip(self.leaves, grads)]

    def cotangent_tensors(self, cotangents: Sequence[np.ndarray]) -> list[torch.Tensor]:
        return [
            _np_tensor(c).to(dtype=o.dtype, device=o.device)
            for c, o in zip(cotangents, self.out_tensors)
        ]


class TorchBackend:
    """The PyTorch side of ``check_op``."""

    name = "torch"
    tensor_type = torch.Tensor
    tensor_type_name = "torch.Tensor"

    # ---- describing tensors -------------------------------------------------------------------------
    def is_tensor(self, x: Any) -> bool:
        return isinstance(x, torch.Tensor)

    def kind(self, t: torch.Tensor) -> str:
        """float | complex | int | bool."""
        if t.dtype.is_complex:
            return "complex"
        if t.dtype.is_floating_point:
            return "float"
        if t.dtype == torch.bool:
            return "bool"
        return "int"

    def dtype_name(self, t: torch.Tensor) -> str:
        return str(t.dtype).replace("torch.", "")

    def shape(self, t: torch.Tensor) -> tuple[int, ...]:
        return tuple(t.shape)

    def numel(self, t: torch.Tensor) -> int:
        return int(t.numel())

    def ndim(self, t: torch.Tensor) -> int:
        return int(t.dim())

    def eps(self, dtype_name: str) -> float:
        return _FLOAT_EPS.get(dtype_name, _FLOAT_EPS["float32"])

    def requires_grad(self, t: torch.Tensor) -> bool:
        return bool(t.requires_grad)

    def describe(self, t: Any) -> str:
        if not isinstance(t, torch.Tensor):  # a pass-through argument (scalar, None, tuple ...)
            text = repr(t)
            return f"{type(t).__name__} {text if len(text) <= 40 else text[:37] + '...'}"
        return f"{self.dtype_name(t)}[{', '.join(map(str, t.shape))}]"

    def code_dtype(self, dtype_name: str) -> str:
        return f"torch.{dtype_name}"

    # ---- numpy conversion ---------------------------------------------------------------------------
    def to_numpy(self, t: torch.Tensor) -> np.ndarray:
        """float64 (or int64 for integer tensors) numpy copy."""
        t = t.detach()
        if t.dtype.is_floating_point:
            return t.to(device="cpu", dtype=torch.float64).numpy().copy()
        return t.to(device="cpu", dtype=torch.int64).numpy().copy()

    def from_numpy(self, arr: np.ndarray, like: torch.Tensor, dtype_name: str | None = None) -> torch.Tensor:
        dtype = getattr(torch, dtype_name) if dtype_name else like.dtype
        return _np_tensor(arr).to(dtype=dtype, device=like.device)

    def round_to(self, arr: np.ndarray, dtype_name: str) -> np.ndarray:
        """``arr`` rounded to ``dtype_name`` and back to float64: the exact values a run in that dtype sees."""
        t = _np_tensor(np.asarray(arr, dtype=np.float64)).to(getattr(torch, dtype_name))
        return t.to(torch.float64).numpy().copy()

    def to_float64(self, t: torch.Tensor) -> torch.Tensor:
        return t.detach().to(torch.float64)

    def clone(self, t: torch.Tensor) -> torch.Tensor:
        """A private copy with the same strides (non-contiguous stays non-contiguous), detached."""
        t = t.detach()
        if t.numel() > 1 and min(t.stride(), default=1) > 0 and not t.is_contiguous():
            out = torch.empty_strided(tuple(t.shape), t.stride(), dtype=t.dtype, device=t.device)
            return out.copy_(t)
        return t.clone(memory_format=torch.preserve_format)

    # ---- running the op -----------------------------------------------------------------------------
    def outputs(self, result: Any) -> list[tuple[str, torch.Tensor]]:
        out: list[tuple[str, torch.Tensor]] = []
        _flatten(result, "output", out)
        if len(out) == 1:
            out = [("output", out[0][1])]
        return out

    def prepare(self, args: Sequence[Any], wrt: Sequence[int]) -> tuple[list[Any], list[torch.Tensor]]:
        """Fresh copies of ``args`` (the user's tensors are never fed to the op) and the leaves among them."""
        fed = [self.clone(a) if isinstance(a, torch.Tensor) else a for a in args]
        leaves = []
        for i in wrt:
            fed[i] = fed[i].requires_grad_(True)
            leaves.append(fed[i])
        return fed, leaves

    def linearize(
        self, fn: Callable, args: Sequence[Any], kwargs: dict, wrt: Sequence[int], prepared: tuple | None = None
    ) -> Linearization:
        """Run ``fn`` on fresh copies of ``args`` with the ``wrt`` positions as leaves requiring grad."""
        fed, leaves = prepared if prepared is not None else self.prepare(args, wrt)
        try:
            with torch.enable_grad():
                result = fn(*fed, **kwargs)
        except Exception as exc:
            raise OpRaised("forward", exc, self._float_dtypes(fed)) from exc
        all_outs = self.outputs(result)
        diff = [(n, o) for n, o in all_outs if o.requires_grad and (o.dtype.is_floating_point or o.dtype.is_complex)]
        return Linearization(
            outputs=[self.to_numpy(o) for _, o in diff],
            out_names=[n for n, _ in diff],
            out_dtypes=[self.dtype_name(o) for _, o in diff],
            out_tensors=[o for _, o in diff],
            all_outputs=all_outs,
            leaves=leaves,
            args=fed,
        )

    def forward64(self, fn: Callable, args: Sequence[Any], kwargs: dict, out_names: Sequence[str]) -> list[np.ndarray]:
        """Outputs named ``out_names`` of ``fn(*args)`` without autograd, as float64 numpy."""
        fed = [self.clone(a) if isinstance(a, torch.Tensor) else a for a in args]
        try:
            with torch.no_grad():
                outs = dict(self.outputs(fn(*fed, **kwargs)))
        except Exception as exc:  # an op that only runs with autograd on is a finding (Liger-Kernel#930), not a crash
            raise OpRaised(NO_GRAD_FORWARD, exc, self._float_dtypes(fed)) from exc
        return [self.to_numpy(outs[n]) for n in out_names]

    def _float_dtypes(self, fed) -> str | None:
        """The floating dtypes fn was fed, for an OpRaised message ("float32, float64")."""
        return ", ".join(sorted({self.dtype_name(a) for a in fed if isinstance(a, torch.Tensor) and a.is_floating_point()})) or None

    def with_values(self, t: torch.Tensor, values: np.ndarray, dtype_name: str | None = None) -> torch.Tensor:
        """A tensor like ``t`` (dtype, device) holding ``values``."""
        return self.from_numpy(values.reshape(tuple(t.shape)) if values.size == t.numel() else values, t, dtype_name)

    # ---- mutation and aliasing ----------------------------------------------------------------------
    def version(self, t: torch.Tensor) -> int:
        return int(t._version)

    def fingerprint(self, t: torch.Tensor) -> int:
        """xxh3-64 of the tensor's bytes in logical order (non-dense tensors are copied first)."""
        with torch.no_grad():
            raw = t.detach().contiguous().reshape(-1).view(torch.uint8).cpu()
            return xxhash.xxh3_64_intdigest(memoryview(raw.numpy()))

    def memory_span(self, t: torch.Tensor) -> tuple[int, int] | None:
        """[start, end) byte addresses ``t`` can touch, or None for an empty tensor."""
        if t.numel() == 0:
            return None
        start = t.data_ptr()
        extent = sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride())) + 1
        return start, start + extent * t.element_size()

    def autograd_view_of(self, out: torch.Tensor, inp: torch.Tensor) -> bool:
        """True when autograd knows ``out`` is a view of ``inp`` (a declared alias, not a hidden one)."""
        if not out._is_view():
            return False
        base = out._base
        return base is inp or (inp._is_view() and base is inp._base) or base is getattr(inp, "_base", None)

    # ---- regime helpers -----------------------------------------------------------------------------
    def noncontiguous_copy(self, t: torch.Tensor) -> torch.Tensor:
        """Same values, every dimension strided (a slice of a wider buffer)."""
        wide = torch.empty(tuple(t.shape) + (2,), dtype=t.dtype, device=t.device)
        view = wide[..., 0]
        view.copy_(t.detach())
        return view

    def channels_last_copy(self, t: torch.Tensor) -> torch.Tensor:
        return t.detach().contiguous(memory_format=torch.channels_last)

    def is_contiguous(self, t: torch.Tensor) -> bool:
        return t.is_contiguous()

    def producers(self) -> dict[str, Callable]:
        """Ops whose backward reads their saved *output*: an op that writes into its input corrupts them."""
        return {
            "exp": torch.exp,
            "sigmoid": torch.sigmoid,
            "softmax": lambda a: torch.softmax(a, dim=-1),
            "relu": torch.relu,
        }

    def call_producer(self, producer: Callable, base: torch.Tensor, isolate: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(leaf, producer(leaf)); with ``isolate`` the op gets a clone, so it cannot corrupt the producer."""
        leaf = self.clone(base).requires_grad_(True)
        with torch.enable_grad():
            y = producer(leaf)
            if isolate:
                y = y.clone()
        return leaf, y

    def run_graph(self, fn: Callable, fed: Sequence[Any], kwargs: dict) -> list[tuple[str, torch.Tensor]]:
        """Differentiable outputs of ``fn(*fed)``, fed exactly as given (no copies)."""
        with torch.enable_grad():
            outs = self.outputs(fn(*fed, **kwargs))
        return [(n, o) for n, o in outs if o.requires_grad]

    def literal(self, t: torch.Tensor) -> str:
        """Python source that rebuilds ``t`` exactly (for small tensors)."""
        values = self.to_numpy(t)
        if self.kind(t) == "float":
            if t.dtype == torch.float64:
                fmt = lambda v: repr(float(v))
            else:  # shortest float32 text that round-trips (exact for float16/bfloat16 values too)
                fmt = lambda v: np.format_float_positional(np.float32(v), unique=True, trim="0")
        else:
            fmt = lambda v: str(int(v))
        body = np.array2string(values, separator=", ", threshold=10**6, max_line_width=96,
                               formatter={"all": fmt})
        return f"torch.tensor({body}, dtype=torch.{self.dtype_name(t)})"

    def grad_of(self, outputs: list[torch.Tensor], leaf: torch.Tensor, cot_tensors: list[torch.Tensor]) -> np.ndarray:
        with torch.enable_grad():
            (g,) = torch.autograd.grad(outputs, [leaf], cot_tensors, allow_unused=True)
        return np.zeros(tuple(leaf.shape)) if g is None else self.to_numpy(g)

    @contextlib.contextmanager
    def audit_threads(self, args: Sequence[Any]):
        """One intra-op thread while auditing small inputs.

        # NOTE [Threads]
        # The audit runs hundreds of tiny forward/backward calls. With several OpenMP threads on a busy
        # machine each tiny op can wait milliseconds at thread barriers (measured: 7 s vs 0.3 s for a
        # 6x5 cross entropy audit on a loaded 2-core box), and tiny ops gain nothing from threads.
        """
        numel = sum(a.numel() for a in args if isinstance(a, torch.Tensor))
        before = torch.get_num_threads()
        if numel <= SMALL_INPUT_NUMEL and before > 1:
            torch.set_num_threads(1)
        try:
            yield
        finally:
            if torch.get_num_threads() != before:
                torch.set_num_threads(before)

    # ---- introspection ------------------------------------------------------------------------------
    def signature_defaults(self, fn: Callable) -> dict[str, Any]:
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            return {}
        return {k: p.default for k, p in sig.parameters.items() if p.default is not inspect.Parameter.empty}

    def parameter_names(self, fn: Callable, n: int) -> list[str]:
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):
            params = []
        names = []
        for i in range(n):
            if i < len(params) and params[i].kind in (params[i].POSITIONAL_ONLY, params[i].POSITIONAL_OR_KEYWORD):
                names.append(params[i].name)
            else:
                names.append(f"inputs[{i}]")
        if len(set(names)) != len(names):
            names = [f"inputs[{i}]" for i in range(n)]
        return names

    def op_name(self, fn: Callable) -> str:
        owner = getattr(fn, "__self__", None)
        if isinstance(owner, type) and issubclass(owner, torch.autograd.Function):
            return f"{owner.__name__}.apply"
        if isinstance(fn, torch.nn.Module):
            return type(fn).__name__
        qualname = getattr(fn, "_qualname", None)  # torch.library.custom_op's CustomOpDef: "ns::name"
        if isinstance(qualname, str):
            return qualname
        for attr in ("__qualname__", "__name__"):
            name = getattr(fn, attr, None)
            if isinstance(name, str):
                return name
        return type(fn).__name__


TORCH = TorchBackend()
