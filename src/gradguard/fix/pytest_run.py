"""How ``gradguard fix`` re-runs one pytest test to verify an edit: the command line and the report's channel.

Its own module because the verify loop (fix.verify.run_guarded) makes these runs, and the pytest plugin's
report section (fix.cli.verified_fix_text) drives that loop: both import this, neither imports the other
for it.

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

__all__ = ["FIX_PYTEST_REPORT_ENV", "is_pytest", "pytest_argv"]

FIX_PYTEST_REPORT_ENV = "GRADGUARD_FIX_PYTEST_REPORT"


def is_pytest(command: list[str]) -> bool:
    return len(command) >= 2 and command[0] == "-m" and command[1] in ("pytest", "py.test")


def pytest_argv(command: list[str]) -> list[str]:
    """``python -m pytest ...`` as a verification run (see the NOTE above)."""
    import sys

    return [sys.executable, *command, "--assert=plain", "-p", "no:cacheprovider", "--gradguard",
            "--gradguard-mode=forensic"]
