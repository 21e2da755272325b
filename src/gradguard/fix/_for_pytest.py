"""``gradguard fix`` for pytest: a failing test's verified edit, shown under its finding.

# NOTE [Verifying an edit by re-running one test]
# A test is verified the way a script is: it runs again with the edit held in memory (the source overlay), and
# the edit is kept only if the test then passes with no finding. The run is not ``gradguard run -m pytest``:
# pytest catches the test's error, so a guard around the whole process would never see the errors PyTorch
# raises itself (a graph freed by an earlier backward, an in-place write on a leaf). It is
# ``python -m pytest NODEID --gradguard --gradguard-mode=forensic`` (the plugin guards the test; the write
# log is on from the start, as no error escapes to trigger a re-run), and ``GRADGUARD_FIX_PYTEST_REPORT``
# tells the plugin that it runs for ``gradguard fix``: it loads the overlay, records gradient coverage, writes
# its findings there as ``gradguard run --json`` would, and never starts a fix of its own. pytest's assertion
# rewriting imports test modules with its own loader, which reads the file on disk and would miss the edit:
# the runs use ``--assert=plain``.
"""

from __future__ import annotations

__all__ = ["FIX_PYTEST_REPORT_ENV", "is_pytest", "pytest_argv", "verified_fix_text"]

FIX_PYTEST_REPORT_ENV = "GRADGUARD_FIX_PYTEST_REPORT"


def is_pytest(command: list[str]) -> bool:
    return len(command) >= 2 and command[0] == "-m" and command[1] in ("pytest", "py.test")


def pytest_argv(command: list[str]) -> list[str]:
    """``python -m pytest ...`` as a verification run (see the NOTE above)."""
    import sys

    return [sys.executable, *command, "--assert=plain", "-p", "no:cacheprovider", "--gradguard",
            "--gradguard-mode=forensic"]


def verified_fix_text(nodeid: str, rootdir: str, timeout: float) -> str:
    """The report section for a test that failed at a hazard: the verified diff and its reasons, or why no edit
    verified. Never raises for a failed repair: the test's own failure is what the user came for."""
    from ._cli import _reasons, _summary
    from ._diff import unified_diff
    from ._verify import repair

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
