"""What the Lightning and Hugging Face callbacks share: enter the guard when a step begins, leave it when the
step ends, and, when the step fails, leave it with the exception so the diagnosis reaches the user."""

from __future__ import annotations

from .. import GradguardError, InvalidArgument, guard

__all__ = ["StepGuard", "StepCallback", "CALLBACK_MODES", "SAMPLE_STEPS"]

# NOTE [Callbacks check one step in N]
# ``sample_steps=N`` makes the sentinel check one training step in N (``guard(sample_steps=N)``: the saved-tensor
# hooks are on for one backward cycle in N, off otherwise). It is an option, not the default. Its cost is about
# (checked step / plain step - 1) / N: the device path's checked step costs 1.1-3.7x a plain one on the zoo
# (docs/performance.md), so N = 256 keeps every model within ~1% (N = 64 leaves the LSTMCell loop at ~4%). But on the
# other steps a loud in-place error comes out as PyTorch's own RuntimeError, unexplained (the callback has no
# re-run to diagnose it), and a silent write made on one step only is missed. A write made on every step (a fused
# kernel, an optimizer, an offload hook) is still caught within N steps. SAMPLE_STEPS is the N the docs and the
# benchmark suggest.
SAMPLE_STEPS = 256

# NOTE [Callbacks start cheap]
# A callback is meant to stay on for a whole training run, so by default (mode="auto") each step runs under the
# sentinel (saved-tensor versions and sampled fingerprints, no write log: a few microseconds per saved tensor).
# The sentinel still raises on every hazard and names the tensor and the line that saved it; it cannot name the
# line that wrote. After the first finding the callback switches to forensic mode (full fingerprints and the
# write log) for the steps that follow, and the finding says so. mode="forensic" gives the writer from the first
# step at forensic cost; mode="sentinel" never switches.
CALLBACK_MODES = {
    "sentinel": {"fingerprint": "sample", "track_writes": False},
    "forensic": {"fingerprint": "full", "track_writes": True},
}

_SENTINEL_NOTE = ("the callback ran this step in the cheap sentinel mode (no write log), so the line that wrote "
                  "is not named; it switched to forensic mode for the following steps. To name the writer of this "
                  "finding, run with GradguardCallback(mode='forensic').")


class StepGuard:
    """One ``gradguard.guard`` per training step (modes: NOTE [Callbacks start cheap]); ``findings`` accumulates
    over the whole run; ``fingerprint`` and ``track_writes``, when given, override what the mode chooses."""

    def __init__(self, *, mode: str = "auto", fingerprint: str | None = None, track_writes: bool | None = None,
                 backend: str = "auto", owner: str = "GradguardCallback", sample_steps: int | None = None):
        if mode not in ("auto", *CALLBACK_MODES):
            raise InvalidArgument(f"{owner}(mode=...) must be one of 'auto', 'sentinel', 'forensic'; got {mode!r}")
        self.mode = mode
        self._overrides = {key: value for key, value in
                           (("fingerprint", fingerprint), ("track_writes", track_writes)) if value is not None}
        self._backend = backend
        self.current_mode = "sentinel" if mode == "auto" else mode
        if sample_steps is not None and (isinstance(sample_steps, bool) or not isinstance(sample_steps, int)
                                         or sample_steps < 1):
            raise InvalidArgument(f"{owner}(sample_steps=...) must be None (check every step) or an int >= 1 "
                                  f"(check one step in N); got {sample_steps!r}")
        self.sample_steps = sample_steps
        guard(**self._arguments())  # validate now, not mid-fit
        guard(**self._arguments("forensic"))
        self._active = None
        self.findings: list = []

    def _arguments(self, mode: str | None = None) -> dict:
        mode = mode or self.current_mode
        sampled = {"sample_steps": self.sample_steps} if self.sample_steps and mode == "sentinel" else {}
        return {**CALLBACK_MODES[mode], **self._overrides, "backend": self._backend, **sampled}

    @property
    def active(self) -> bool:
        return self._active is not None

    def begin(self) -> None:
        if self._active is not None:  # a step that never ended (an exception nobody reported to us)
            self.end()
        block = guard(**self._arguments())
        block.__enter__()
        self._active = block

    def end(self, *exc_info) -> None:
        block, self._active = self._active, None
        if block is None:
            return
        try:
            block.__exit__(*(exc_info or (None, None, None)))
        finally:
            self._collect(block)

    def fail(self, exception: BaseException):
        """Leave the guard because ``exception`` ended the step. Returns gradguard's enriched error when the
        guard explains a framework error (an in-place op on a leaf, backward twice ...), else None; either
        way the finding is in ``findings`` and added to ``exception``'s notes."""
        try:
            self.end(type(exception), exception, exception.__traceback__)
        except GradguardError as error:
            if hasattr(exception, "add_note"):
                exception.add_note("gradguard:\n" + str(error))
            return error
        return None

    def _collect(self, block) -> None:
        new = [finding for finding in block.findings if not any(finding is known for known in self.findings)]
        if new and self.mode == "auto" and self.current_mode == "sentinel":
            for finding in new:
                if not finding.modified_at:
                    finding.notes.append(_SENTINEL_NOTE)
            self.current_mode = "forensic"
        self.findings.extend(new)


class StepCallback:
    """What both frameworks' ``GradguardCallback`` take and keep: the arguments and a :class:`StepGuard`.

    ``mode="auto"`` (default): the cheap sentinel until the first finding, then forensic mode (the write log) for
    the steps that follow; ``"forensic"`` names the writer from the first step; ``"sentinel"`` never switches.
    ``fingerprint=``, ``track_writes=``, ``backend=`` as for ``gradguard.guard`` (they override the mode's).
    ``sample_steps=N``: the sentinel checks one step in N (``gradguard.guard(sample_steps=N)``; NOTE [Callbacks
    check one step in N]); forensic mode, once switched to, checks every step.
    """

    def __init__(self, *, mode: str = "auto", fingerprint: str | None = None, track_writes: bool | None = None,
                 backend: str = "auto", sample_steps: int | None = None):
        super().__init__()
        self._steps = StepGuard(mode=mode, fingerprint=fingerprint, track_writes=track_writes, backend=backend,
                                sample_steps=sample_steps)

    @property
    def findings(self) -> list:
        """Every finding of the run so far."""
        return self._steps.findings

    def on_train_end(self, *args, **kwargs):  # the same hook in both frameworks, with their own arguments
        self._steps.end()
