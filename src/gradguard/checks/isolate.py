"""Regimes run in a child process, so that a compiled kernel crashing on derived inputs is a finding, not the end.

# NOTE [Isolated regimes]
# A regime derives inputs (another batch size, another feature dim, indices rewritten); a compiled kernel without
# bounds checks that gets inputs whose relations it assumes (MoE routing indices into the tokens) writes out of
# bounds and the process dies with SIGSEGV, taking the user's test run and the whole report with it. With
# ``isolate=True`` (or ``"auto"`` for an op that looks compiled: a ``torch.library`` op, or code that holds Triton
# kernels) every value regime runs in a forked child; what it found comes back pickled through a pipe, and a child
# killed by a signal becomes a failure of that regime naming the signal. Only on platforms with ``os.fork``.
"""

from __future__ import annotations

import inspect
import os
import pickle
import signal
import sys
from typing import Any, Callable

from ..core.internal import log_fallback

__all__ = ["can_fork", "looks_compiled", "run_forked"]


def can_fork() -> bool:
    return hasattr(os, "fork") and sys.platform != "darwin"


def looks_compiled(fn: Callable) -> bool:
    """A ``torch.library`` op, or a function whose module holds Triton kernels (NOTE [Isolated regimes])."""
    if type(fn).__module__.startswith("torch._ops"):
        return True
    owner = getattr(fn, "__self__", None)
    for obj in (fn, owner if isinstance(owner, type) else None):
        module = inspect.getmodule(obj) if obj is not None else None
        if module is not None and any(type(v).__module__.startswith("triton") for v in vars(module).values()):
            return True
    return False


def run_forked(work: Callable[[], Any]) -> tuple[str, Any]:
    """``work()`` in a forked child: ("ok", its result), ("raised", the exception), or ("crashed", a description)."""
    sys.stdout.flush()
    sys.stderr.flush()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 0
        try:
            os.close(read)
            import faulthandler

            faulthandler.disable()  # the parent reports the crash; no second traceback on the user's stderr
            try:
                payload = pickle.dumps(("ok", work()))
            except BaseException as exc:  # noqa: BLE001 - sent to the parent, which decides
                try:
                    payload = pickle.dumps(("raised", exc))
                except Exception as unpicklable:  # the child's error, as text the parent can read
                    payload = pickle.dumps(("raised", RuntimeError(f"{type(exc).__name__}: {exc} "
                                                                   f"(not picklable: {unpicklable!r})")))
            with os.fdopen(write, "wb") as out:
                out.write(payload)
        except BaseException as error:  # noqa: BLE001 - the child must reach os._exit; the parent reports code 3
            log_fallback("checks.isolate", "sending the child's result", error)
            code = 3
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as inp:
        data = inp.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return "crashed", f"the process running it was killed by {name}"
    if not data:
        return "crashed", f"the process running it exited with status {os.WEXITSTATUS(status)} without a result"
    return pickle.loads(data)
