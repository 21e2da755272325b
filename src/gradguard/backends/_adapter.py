"""The backend adapter: everything framework-specific the core and the public API need, behind one interface.

# NOTE [One folder per framework]
# A backend lives in ``gradguard/backends/<name>/`` and exposes ``ADAPTER`` (a :class:`BackendAdapter`)
# from its ``_adapter`` module. The registry (``gradguard.backends``) imports that module only when the
# backend is asked for, so importing gradguard never imports a deep-learning framework. The core
# (``gradguard.core``) works on numpy arrays, findings and source locations only.
#
# Adding a framework = one folder with an ``_adapter.py`` and one line in ``backends.KNOWN``.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager, Protocol, Sequence, runtime_checkable

__all__ = ["BackendAdapter", "GuardSession", "CAPABILITIES"]

# What a backend can do; ``BackendAdapter.capabilities`` lists the ones it implements.
CAPABILITIES = (
    "guard",  # saved-tensor hooks with version + fingerprint checks
    "write_provenance",  # names the line that wrote a saved tensor
    "eager_errors",  # explains the framework's own in-place errors
    "check_op",  # numerical gradient audit of custom ops
    "graph_mode",  # check_op also runs the op compiled (graph / jit)
)


@runtime_checkable
class GuardSession(Protocol):
    """What ``gradguard.guard()`` drives: installed between ``enter()`` and ``exit()``."""

    backend: str
    findings: list

    def enter(self) -> None: ...

    def exit(self) -> None: ...


@runtime_checkable
class BackendAdapter(Protocol):
    """Framework-specific operations. Implementations: ``backends/{torch,paddle,mindspore}/_adapter.py``.

    Tensors are the framework's own; arrays are numpy. ``mode()`` says which execution mode results hold for
    (``"eager"`` for torch/paddle dygraph, ``"pynative"`` / ``"graph"`` for MindSpore).
    """

    name: str  # "torch" | "paddle" | "mindspore"
    module_name: str  # the framework's top-level module: "torch" | "paddle" | "mindspore"
    capabilities: tuple[str, ...]

    # -- identity -----------------------------------------------------------------------------
    def is_tensor(self, obj: Any) -> bool: ...

    def mode(self) -> str: ...

    def library_dirs(self) -> list[str]: ...

    # -- saved-tensor checks ------------------------------------------------------------------
    def version(self, t: Any) -> int | None: ...

    def fingerprint(self, t: Any) -> int | None: ...

    def saved_tensors_hooks(self, pack: Callable, unpack: Callable) -> ContextManager: ...

    def memory_range(self, t: Any) -> tuple[int, int, int] | None: ...  # (storage key, start, end) bytes

    # -- naming -------------------------------------------------------------------------------
    def name_tensor(self, t: Any) -> tuple[str | None, str | None]: ...  # (qualified name, role)

    def describe(self, t: Any, name: str | None = None): ...  # -> core TensorInfo

    # -- numerics -----------------------------------------------------------------------------
    def to_numpy(self, t: Any): ...

    def from_numpy(self, a, *, requires_grad: bool = True) -> Any: ...

    def no_grad(self) -> ContextManager: ...

    def vjp(self, fn: Callable, inputs: Sequence[Any], cotangents: Sequence[Any]) -> list: ...

    # -- guard --------------------------------------------------------------------------------
    def new_guard_session(self, *, fingerprint: str, track_writes: bool, bisect: bool = False) -> GuardSession: ...

    def enrich_error(self, error: BaseException, session: GuardSession | None = None): ...


class AdapterBase:
    """Defaults shared by the adapters; a backend overrides what its framework supports."""

    name = "?"
    module_name = "?"
    capabilities: tuple[str, ...] = ()

    def mode(self) -> str:
        return "eager"

    def library_dirs(self) -> list[str]:
        import importlib

        module = importlib.import_module(self.module_name)
        return list(getattr(module, "__path__", []))

    def no_grad(self) -> ContextManager:
        return contextlib.nullcontext()

    def describe(self, t: Any, name: str | None = None):
        from ..core._findings import TensorInfo

        qualified, role = self.name_tensor(t)
        return TensorInfo(shape=tuple(int(s) for s in t.shape), dtype=self.dtype_name(t), name=qualified or name,
                          role=role or "tensor")

    def dtype_name(self, t: Any) -> str:
        return str(t.dtype).split(".")[-1]

    def fingerprint(self, t: Any) -> int | None:
        import numpy as np
        import xxhash

        try:
            a = np.ascontiguousarray(self.to_numpy(t))
        except Exception:
            return None
        return xxhash.xxh3_64_intdigest(memoryview(a).cast("B")) ^ hash((a.dtype.str, a.shape))

    def name_tensor(self, t: Any) -> tuple[str | None, str | None]:
        return None, None

    def enrich_error(self, error: BaseException, session=None):
        return None
