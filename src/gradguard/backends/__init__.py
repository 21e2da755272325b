"""Framework backends. Each produces events and answers framework questions for the core.

The registry below maps a backend name to the module holding its adapter; nothing is imported until a
backend is asked for, so ``import gradguard`` stays framework-free.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Iterable

__all__ = ["KNOWN", "get_adapter", "detect_backend", "resolve_backend", "register"]

# backend name -> (framework module name, adapter module)
KNOWN: dict[str, tuple[str, str]] = {
    "torch": ("torch", "gradguard.backends.torch._adapter"),
    "paddle": ("paddle", "gradguard.backends.paddle._adapter"),
    "mindspore": ("mindspore", "gradguard.backends.mindspore._adapter"),
}

_ADAPTERS: dict[str, Any] = {}


def register(name: str, framework_module: str, adapter_module: str) -> None:
    """Add a backend: ``adapter_module`` must define ``ADAPTER``."""
    KNOWN[name] = (framework_module, adapter_module)
    _ADAPTERS.pop(name, None)


def _invalid(message: str) -> Exception:
    from .._errors import InvalidArgument

    return InvalidArgument(message)


def get_adapter(name: str):
    """The adapter of backend ``name`` (imports the framework)."""
    if name not in KNOWN:
        raise _invalid(f"unknown backend {name!r}; expected one of {', '.join(map(repr, KNOWN))} or 'auto'")
    adapter = _ADAPTERS.get(name)
    if adapter is None:
        adapter = _ADAPTERS[name] = importlib.import_module(KNOWN[name][1]).ADAPTER
    return adapter


def _backend_of(obj: Any) -> str | None:
    module = type(obj).__module__.split(".")[0]
    for name, (framework, _adapter) in KNOWN.items():
        if module == framework:
            return name
    if isinstance(obj, (list, tuple)):
        for item in obj:
            found = _backend_of(item)
            if found:
                return found
    return None


def detect_backend(objects: Iterable[Any] = ()) -> str | None:
    """The backend of the first framework object in ``objects``; else the one framework imported in this process.

    None when nothing decides (no framework imported, or several imported and no object to tell them apart).
    """
    for obj in objects:
        found = _backend_of(obj)
        if found:
            return found
    imported = [name for name, (framework, _a) in KNOWN.items() if framework in sys.modules]
    return imported[0] if len(imported) == 1 else None


def resolve_backend(backend: str, objects: Iterable[Any] = ()) -> str:
    """``backend`` itself, or for ``"auto"`` the detected one (an InvalidArgument when none can be told)."""
    if not isinstance(backend, str):
        raise _invalid(f"backend must be a string; got {backend!r}")
    if backend != "auto":
        if backend not in KNOWN:
            raise _invalid(f"unknown backend {backend!r}; expected one of {', '.join(map(repr, KNOWN))} or 'auto'")
        return backend
    found = detect_backend(objects)
    if found is None:
        imported = [name for name, (framework, _a) in KNOWN.items() if framework in sys.modules]
        if imported:
            raise _invalid(f"backend='auto' cannot choose: {', '.join(imported)} are all imported; "
                           f"pass backend=... explicitly")
        raise _invalid("backend='auto' found no deep-learning framework imported (torch, paddle, mindspore); "
                       "import one first or pass backend=...")
    return found
