"""``gradguard fix`` for pytest: a failing test's verified edit, shown under its finding.

The test runs again as NOTE [Verifying an edit by re-running one test] says, in fix.pytest_run: the verify loop
imports that module, since this one drives the loop. The run's names stay importable from here.
"""

from __future__ import annotations

from .pytest_run import FIX_PYTEST_REPORT_ENV, is_pytest, pytest_argv

__all__ = ["FIX_PYTEST_REPORT_ENV", "is_pytest", "pytest_argv", "verified_fix_text"]


def verified_fix_text(nodeid: str, rootdir: str, timeout: float) -> str:
    """The report section for a test that failed at a hazard: the verified diff and its reasons, or why no edit
    verified. Never raises for a failed repair: the test's own failure is what the user came for."""
    from .cli import _reasons, _summary
    from .diff import unified_diff
    from .verify import repair

    first, outcome = repair(["-m", "pytest", "-q", nodeid, "--rootdir", rootdir], rootdir, timeout=timeout)
    lines = []
    if outcome.accepted:
        state = ("this test then passes with no finding" if outcome.clean
                 else "it removes the hazards below; others remain")
        lines.append(f"verified edit ({state}; {outcome.runs} runs of this test; `git apply` takes it):")
        lines.append(unified_diff(outcome.original, outcome.edited, _reasons(outcome), rootdir).rstrip("\n"))
        lines.extend(f"verified: {edit.reason} (removes: {_summary(edit.finding)})" for edit in outcome.accepted)
    for item in outcome.unfixed:
        lines.append(f"not fixed: {_summary(item.finding)}: {item.why}")
    if not lines:
        lines.append("no hazard when this test runs alone: nothing to verify an edit against"
                     if not first.findings else "no edit verified")
    return "\n".join(lines) + "\n"
