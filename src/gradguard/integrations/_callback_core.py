"""What the Lightning and Hugging Face callbacks share: enter the guard when a step begins, leave it when the
step ends, and, when the step fails, leave it with the exception so the diagnosis reaches the user."""

from __future__ import annotations

__all__ = ["StepGuard"]


class StepGuard:
    """One ``gradguard.guard`` per training step; ``findings`` accumulates over the whole run."""

    def __init__(self, *, fingerprint: str = "full", track_writes: bool = True, backend: str = "auto"):
        from gradguard import guard

        guard(fingerprint=fingerprint, track_writes=track_writes, backend=backend)  # validate now, not mid-fit
        self._arguments = {"fingerprint": fingerprint, "track_writes": track_writes, "backend": backend}
        self._active = None
        self.findings: list = []

    @property
    def active(self) -> bool:
        return self._active is not None

    def begin(self) -> None:
        from gradguard import guard

        if self._active is not None:  # a step that never ended (an exception nobody reported to us)
            self.end()
        block = guard(**self._arguments)
        block.__enter__()
        self._active = block

    def end(self) -> None:
        block, self._active = self._active, None
        if block is None:
            return
        try:
            block.__exit__(None, None, None)
        finally:
            self._collect(block)

    def fail(self, exception: BaseException):
        """Leave the guard because ``exception`` ended the step. Returns gradguard's enriched error when the
        guard explains a framework error (an in-place op on a leaf, backward twice ...), else None; either
        way the finding is in ``findings`` and added to ``exception``'s notes."""
        from gradguard import GradguardError

        block, self._active = self._active, None
        if block is None:
            return None
        enriched = None
        try:
            block.__exit__(type(exception), exception, exception.__traceback__)
        except GradguardError as error:
            enriched = error
        finally:
            self._collect(block)
        if enriched is not None and hasattr(exception, "add_note"):
            exception.add_note("gradguard:\n" + str(enriched))
        return enriched

    def _collect(self, block) -> None:
        for finding in block.findings:
            if not any(finding is known for known in self.findings):
                self.findings.append(finding)
