"""One place for gradguard's own fallbacks: every one leaves a log record naming the component."""

from __future__ import annotations

import logging

__all__ = ["log_fallback"]

# NOTE [Fallbacks are never silent]
# Many probes ask a framework a question that may legitimately fail (a tensor without storage, a grad_fn
# without a name, a frame without source). gradguard then falls back to a weaker answer. The fallback must
# stay visible to whoever debugs gradguard itself, without alarming the user: a DEBUG record on the logger
# ``gradguard.<component>``, with the exception attached. Failures that change what the user sees (a
# finding built partially, a guard that steps aside) warn at WARNING level or add a note instead.


def log_fallback(component: str, what: str, error: BaseException | None = None) -> None:
    """Record that ``component`` fell back while doing ``what`` (DEBUG on ``gradguard.<component>``)."""
    logger = logging.getLogger(f"gradguard.{component}")
    if logger.isEnabledFor(logging.DEBUG):  # some probes fall back once per tensor: stay cheap when unobserved
        logger.debug("%s failed; falling back (%s)", what,
                     f"{type(error).__name__}: {error}" if error else "no detail", exc_info=error is not None)
