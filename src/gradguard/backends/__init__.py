"""Framework backends. Each produces events and answers framework questions for the core.

The registry below maps a backend name to the module holding its adapter and to what the backend can do;
nothing is imported until a backend is asked for, so ``import gradguard`` stays framework-free.

# NOTE [A framework is chosen in one place]
# ``choose()`` is the only place that turns ``backend=`` (or ``"auto"``) into a framework: ``guard``, ``check_op``,
# ``gradguard run`` and ``advise`` all call it and then ask the object it returns (its ``capabilities``,
# ``new_guard_session``, ``check_op``, ``enrich_error``), never compare the framework's name.
# tests/fast/test_framework_choice.py fails on a framework-name comparison outside ``backends/``.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Iterable, NamedTuple

__all__ = ["KNOWN", "INSTALL", "choose", "get_adapter", "detect_backend", "resolve_backend", "install_hint",
           "FrameworkImportWatch"]


class Backend(NamedTuple):
    framework: str  # the framework's top-level module
    adapter: str  # the module defining ``ADAPTER``
    # what the backend supports, known before its framework is imported: "guard", "check_op", "advise" (advise()),
    # "sample_steps" (guard(sample_steps=N)), "coverage" (`gradguard fix`'s record of the gradients used)
    capabilities: frozenset = frozenset()


KNOWN: dict[str, Backend] = {
    "torch": Backend("torch", "gradguard.backends.torch.adapter",
                     frozenset({"guard", "check_op", "sample_steps", "coverage", "advise"})),
    "paddle": Backend("paddle", "gradguard.backends.paddle.adapter", frozenset({"guard", "check_op", "advise"})),
    "mindspore": Backend("mindspore", "gradguard.backends.mindspore.adapter", frozenset({"guard", "check_op"})),
    # HIPS autograd: check_op only (NOTE [A framework without a guard] in backends/autograd/adapter.py)
    "autograd": Backend("autograd", "gradguard.backends.autograd.adapter", frozenset({"check_op"})),
}

# framework module -> the command that installs it (named in "not installed" messages)
INSTALL: dict[str, str] = {
    "torch": "python -m pip install torch",
    "paddle": "python -m pip install paddlepaddle",
    "mindspore": "python -m pip install mindspore",
    "autograd": "python -m pip install autograd",
}

_ADAPTERS: dict[str, Any] = {}


def install_hint(framework: str) -> str:
    """One line: ``framework`` is missing from this Python, and the command that installs it."""
    command = INSTALL.get(framework, f"python -m pip install {framework}")
    return (f"gradguard: {framework} is not installed in this Python ({sys.executable}); "
            f"install it with: {command}")


def _invalid(message: str) -> Exception:
    from .._errors import InvalidArgument

    return InvalidArgument(message)


def get_adapter(name: str):
    """The adapter of backend ``name`` (imports the framework), with the backend's ``capabilities``."""
    if name not in KNOWN:
        raise _invalid(f"unknown backend {name!r}; expected one of {', '.join(map(repr, KNOWN))} or 'auto'")
    adapter = _ADAPTERS.get(name)
    if adapter is None:
        framework = KNOWN[name].framework
        try:
            module = importlib.import_module(KNOWN[name].adapter)
        except ModuleNotFoundError as error:
            if error.name != framework:
                raise
            raise ModuleNotFoundError(f"gradguard's {name} backend needs {framework}: "
                                      + install_hint(framework).removeprefix("gradguard: "),
                                      name=framework) from error
        adapter = _ADAPTERS[name] = module.ADAPTER
        adapter.capabilities = KNOWN[name].capabilities
    return adapter


def _backend_of(obj: Any) -> str | None:
    module = type(obj).__module__.split(".")[0]
    found = next((name for name, entry in KNOWN.items() if module == entry.framework), None)
    if found is None and isinstance(obj, (list, tuple)):
        found = next(filter(None, map(_backend_of, obj)), None)
    return found


def detect_backend(objects: Iterable[Any] = ()) -> str | None:
    """The backend of the first framework object in ``objects``; else the one framework imported in this process.

    None when nothing decides (no framework imported, or several imported and no object to tell them apart).
    """
    for obj in objects:
        found = _backend_of(obj)
        if found:
            return found
    imported = [name for name, entry in KNOWN.items() if entry.framework in sys.modules]
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
        imported = [name for name, entry in KNOWN.items() if entry.framework in sys.modules]
        if imported:
            raise _invalid(f"backend='auto' cannot choose: {', '.join(imported)} are all imported; "
                           f"pass backend=... explicitly")
        raise _invalid(f"backend='auto' found no deep-learning framework imported ({', '.join(KNOWN)}); "
                       "import one first or pass backend=...")
    return found


def choose(backend: str = "auto", objects: Iterable[Any] = (), *, fallback: str | None = "torch",
           needs: str | None = None):
    """The framework every entry point runs on (NOTE [A framework is chosen in one place]): the adapter of
    ``backend``, or for ``"auto"`` of the framework of the first framework object in ``objects``, else of the one
    framework imported in this process, else of ``fallback`` (None: an InvalidArgument says why nothing decides).
    ``needs``: a capability the caller needs (an InvalidArgument, before the framework is imported, when the chosen
    backend lacks it). Imports the framework."""
    objects = list(objects)
    if backend == "auto":
        name = detect_backend(objects) or fallback or resolve_backend(backend, objects)
    else:
        name = resolve_backend(backend)
    if needs is not None and needs not in KNOWN[name].capabilities:
        able = " and ".join(n for n, entry in KNOWN.items() if needs in entry.capabilities)
        raise _invalid(f"{needs}(..., backend={backend!r}): supported by the {able} backends, not {name}")
    return get_adapter(name)


# NOTE [Choosing the backend when the script imports its framework]
# `gradguard run` cannot know the script's framework before it runs, and importing one to find out breaks a
# venv that has only another (Paddle-only: "No module named 'torch'"). So the guard is entered the moment the
# script's first framework import finishes: a meta-path finder sees `import torch` / `paddle` / `mindspore`,
# and wraps *that one loader instance's* ``exec_module`` (the module keeps its real loader and spec) to call
# back once the framework module has fully executed. The watch removes itself after the first framework.
# Only frameworks with the "guard" capability are watched: a script that imports autograd (check_op only) before
# torch is guarded from its torch import on.
class FrameworkImportWatch:
    """Calls ``callback(backend_name)`` once, right after the first known framework with a guard finishes
    importing."""

    def __init__(self, callback):
        self._callback = callback
        self._frameworks = {entry.framework: name for name, entry in KNOWN.items() if "guard" in entry.capabilities}
        self._searching = False
        self.fired: str | None = None

    def start(self) -> "FrameworkImportWatch":
        sys.meta_path.insert(0, self)
        return self

    def stop(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self._frameworks or self._searching or self.fired:
            return None
        import importlib.util

        self._searching = True  # find the real spec with the other finders (we decline while searching)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._searching = False
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original = loader.exec_module

        def exec_module(module):
            try:
                original(module)
            finally:
                try:
                    del loader.exec_module  # back to the class's method
                except AttributeError:
                    pass
            self._fire(self._frameworks[fullname])

        loader.exec_module = exec_module
        return spec

    def _fire(self, backend: str) -> None:
        if self.fired:
            return
        self.fired = backend
        self.stop()
        self._callback(backend)
