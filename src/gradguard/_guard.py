"""``gradguard.guard()``: the context manager / decorator users put around training code."""

from __future__ import annotations

import contextlib
import threading

from ._errors import GradguardError, InvalidArgument

__all__ = ["guard"]

_FINGERPRINT_MODES = ("full", "sample", "off")


class guard(contextlib.ContextDecorator):
    """Run code with every in-place hazard on tensors saved for backward turned into a precise diagnosis.

    Inside the block gradguard:
      * redoes PyTorch's version check (installing saved-tensor hooks switches PyTorch's own check off)
        and raises :class:`InplaceModificationError` naming the tensor, the saver, every write since, why,
        and the fix;
      * fingerprints saved tensors and raises :class:`SilentModificationError` when their bytes change
        without a version bump (``.data``, NumPy views, Triton/CUDA kernels, fused optimizers);
      * explains PyTorch's eager errors (in-place on a leaf, on a multi-output or no_grad view, backward
        through a freed graph).

    Args:
        fingerprint: ``"full"`` hashes every byte of every saved tensor (catches any silent write);
            ``"sample"`` hashes at most 64 KiB per tensor (catches writes touching the sample: whole-tensor
            kernel writes, not single elements); ``"off"`` relies on versions and the write log only.
        track_writes: record in-place writes into saved memory (names the writer's line). Costs a few
            microseconds per op; with it off (the cheap "sentinel" configuration) the finding still names
            the tensor, the saver and the versions, and ``gradguard run`` re-runs the script with writes
            tracked to name the writer.
        bisect: check every saved tensor's fingerprint after every op, to pin a silent write that no
            boundary saw (NumPy, ctypes, extensions) to one op or to the interval between two user lines.
            Slow: for re-runs that diagnose, not for training.

        sample_steps: ``None`` (default) checks every backward pass. ``N`` (an int >= 1) checks one backward
            cycle in N (the forward that saves and the backward that unpacks) and removes the saved-tensor hooks
            for the others, so those steps cost what they cost without gradguard. A write that happens on every
            step (a fused kernel, an optimizer, an offload hook) is still caught within N steps; a write that
            happens on one step only is caught only if that step is sampled. PyTorch's own check still raises
            loud in-place errors on every step. The count runs across guards, so a guard entered around each
            step samples the same way. torch backend only.

        backend: ``"auto"`` (default) uses the one deep-learning framework imported in this process
            (torch when none or several are, as before); or name it: ``"torch"``, ``"paddle"``,
            ``"mindspore"``. Findings say which backend (``Finding.backend``) and mode (``Finding.facts.mode``)
            they hold for.

    Gradients are bit-identical with the guard on: it never changes what autograd computes.
    """

    def __init__(self, *, fingerprint: str = "full", track_writes: bool = True, backend: str = "auto",
                 bisect: bool = False, sample_steps: int | None = None):
        if fingerprint not in _FINGERPRINT_MODES:
            raise InvalidArgument(
                f"guard(fingerprint=...) must be one of {', '.join(map(repr, _FINGERPRINT_MODES))}; "
                f"got {fingerprint!r}"
            )
        for name, flag in (("track_writes", track_writes), ("bisect", bisect)):
            if not isinstance(flag, bool):
                raise InvalidArgument(f"guard({name}=...) must be True or False; got {flag!r}")
        if sample_steps is not None and (isinstance(sample_steps, bool) or not isinstance(sample_steps, int)
                                         or sample_steps < 1):
            raise InvalidArgument(f"guard(sample_steps=...) must be None (check every backward pass) or an int >= 1 "
                                  f"(check one backward cycle in N); got {sample_steps!r}")
        from .backends import KNOWN

        if sample_steps is not None and backend != "auto" and (
                backend not in KNOWN or "sample_steps" not in KNOWN[backend].capabilities):
            raise InvalidArgument(f"guard(sample_steps=...) needs the torch backend; got backend={backend!r}")

        if backend != "auto" and backend not in KNOWN:
            raise InvalidArgument(
                f"guard(backend=...) must be 'auto' or one of {', '.join(map(repr, KNOWN))}; got {backend!r}"
            )
        self.fingerprint = fingerprint
        self.track_writes = track_writes
        self.backend = backend
        self.bisect = bisect
        self.sample_steps = sample_steps
        self._local = threading.local()
        self.findings: list = []

    def _stack(self) -> list:
        return self._local.__dict__.setdefault("stack", [])  # one stack per thread

    def __enter__(self) -> "guard":
        from .backends import choose

        framework = choose(self.backend)  # "auto" with no framework, or several, imported: torch, as before backends
        if self.sample_steps is not None and "sample_steps" not in framework.capabilities:
            raise InvalidArgument(f"guard(sample_steps=...) needs the torch backend; the program uses {framework.name}")
        session = framework.new_guard_session(fingerprint=self.fingerprint, track_writes=self.track_writes,
                                              bisect=self.bisect)
        session.enter()
        if self.sample_steps is not None and self.sample_steps > 1:  # NOTE [Sampled guard], torch/user_hooks.py
            from .backends.torch.user_hooks import Cycles

            session.cycles = Cycles(session, self.sample_steps)
            session.cycles.start()
        self._stack().append(session)
        self.session = session
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        stack = self._stack()
        if not stack:
            # NOTE [A guard is left on the thread that entered it]
            # PyTorch keeps saved-tensor hooks and dispatch modes per thread: only the entering thread can remove
            # the guard's. Leaving it from another thread used to fail with an IndexError from inside gradguard
            # and leave the hooks active without a word; now it says so, and never hides the user's exception.
            message = ("guard() was left on a different thread than the one that entered it; PyTorch keeps "
                       "saved-tensor hooks per thread, so the guard stays active on the entering thread. Leave it "
                       "(exit the `with` block) on the thread that entered it.")
            if exc is not None:
                import warnings

                warnings.warn(f"gradguard: {message}", RuntimeWarning, stacklevel=2)
                return False
            raise InvalidArgument(message)
        session = stack.pop()
        cycles = getattr(session, "cycles", None)
        if cycles is not None:
            cycles.stop()
        session.exit()
        self.findings = list(session.findings)
        if exc is not None and not isinstance(exc, GradguardError):
            from .backends import get_adapter

            enriched = get_adapter(session.backend).enrich_error(exc, session)
            if enriched is not None:
                self.findings.append(enriched.finding)
                raise enriched.with_traceback(tb) from exc
        return False
