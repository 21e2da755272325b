"""pytest plugin (entry point ``pytest11``: ``gradguard = gradguard.integrations.pytest_plugin``).

* ``pytest --gradguard``: every test's call phase runs under ``gradguard.guard()``;
* ``@pytest.mark.gradguard(fingerprint="sample", track_writes=True)``: this test runs under the guard with
  these arguments (``enabled=False`` opts a test out of ``--gradguard``);
* the ``gradguard`` fixture: the test runs under the guard and gets a handle whose ``findings`` lists what
  the guard found so far (``pytest.raises(gradguard.InplaceModificationError)`` then inspect);
* findings are attached to the test's report (a "gradguard" section, shown with the failure) and summed up
  in the terminal summary;
* ``pytest --gradguard-fix``: a test that fails at a hazard is re-run with the edit its diagnosis proposes (in
  a subprocess, as ``gradguard fix`` does); the edit is shown under the finding only if the test then passes
  with no finding ("gradguard fix" section and terminal summary), else why none verified.

This module must load without importing any deep-learning framework (pytest loads it in every run of every
project that has gradguard installed): at module level it imports only pytest, the standard library and what
``import gradguard`` loads anyway; gradguard's backend (which imports torch) loads only when a test asks for it.
"""

from __future__ import annotations

import os
import sys

import pytest

from gradguard import GradguardError, GradientHazardError, guard
from gradguard.core.internal import log_fallback
from gradguard.report.json import findings_to_json
from gradguard.report.text import printable, render_finding  # printable: quoted source must not drive the terminal

from .callback_core import CALLBACK_MODES

__all__ = ["GradguardFixture"]

_GUARD_ARGUMENTS = ("fingerprint", "track_writes", "backend")
_all_key = pytest.StashKey[list]()  # config -> [(nodeid, finding), ...]
_aside_key = pytest.StashKey[list]()  # config -> [(nodeid, reason), ...]: tests the guard stepped aside for
_fix_key = pytest.StashKey[dict]()  # config -> {nodeid: the "gradguard fix" section's text}
# Set when this pytest verifies an edit for `gradguard fix` (NOTE [Verifying an edit by re-running one test]):
# the report path for its findings. The same name as gradguard.fix.pytest_run.FIX_PYTEST_REPORT_ENV, written
# out because this module loads without the library (a test holds the two equal).
_FIX_REPORT_ENV = "GRADGUARD_FIX_PYTEST_REPORT"


def pytest_addoption(parser):
    group = parser.getgroup("gradguard", "gradguard: gradient correctness")
    group.addoption("--gradguard", action="store_true", default=False,
                    help="run every test under gradguard.guard(): in-place hazards on tensors saved for backward "
                         "fail the test with a precise diagnosis")
    group.addoption("--gradguard-fingerprint", choices=("full", "sample", "off"), default=None,
                    help="fingerprint mode for guarded tests (default: the mode's, or the marker's)")
    group.addoption("--gradguard-mode", choices=("auto", "sentinel", "forensic"), default="auto",
                    help="how --gradguard guards tests without a marker: auto (default) runs the cheap sentinel "
                         "and re-runs a test that failed at a hazard in forensic mode to name the writer (the test "
                         "body runs twice); sentinel: no re-run; forensic: every test with the write log")
    group.addoption("--gradguard-fix", action="store_true", default=False,
                    help="for a test that fails at a gradient hazard, re-run it with the edit its diagnosis "
                         "proposes (a subprocess: `gradguard run -m pytest` on that test, so the test runs again) "
                         "and show the diff under the finding only if the test then passes with no finding")


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "gradguard(fingerprint='full', track_writes=True, backend='auto', enabled=True): run this test under "
        "gradguard.guard(...) with these arguments; enabled=False opts it out of --gradguard",
    )
    config.stash[_all_key] = []
    config.stash[_aside_key] = []
    config.stash[_fix_key] = {}
    if os.environ.get(_FIX_REPORT_ENV):  # a verification run of `gradguard fix`: the edited sources, coverage
        from gradguard._overlay import install_overlay

        install_overlay()
        try:
            from gradguard.backends.torch.coverage import install_coverage_probe

            install_coverage_probe()
        except ImportError:  # not a torch project: the coverage check needs torch's optimizers
            pass


def pytest_sessionfinish(session, exitstatus):
    report = os.environ.get(_FIX_REPORT_ENV)
    if report:
        with open(report, "w", encoding="utf-8") as handle:
            handle.write(findings_to_json([f for _, f in session.config.stash.get(_all_key, [])],
                                          script=" ".join(session.config.invocation_params.args)))

class GradguardFixture:
    """What the ``gradguard`` fixture gives a test: the active guard and its findings so far."""

    def __init__(self):
        self.guard = None

    @property
    def findings(self) -> list:
        """Findings of this test so far (live while the test runs)."""
        if self.guard is None:
            return []
        session = getattr(self.guard, "session", None)
        live = list(session.findings) if session is not None else []
        done = list(self.guard.findings)
        return done if len(done) >= len(live) else live

    def __repr__(self) -> str:
        return f"<gradguard fixture: {len(self.findings)} finding(s)>"


@pytest.fixture
def gradguard():
    """Run this test under ``gradguard.guard()``; ``gradguard.findings`` lists what it found so far.

    Arguments for the guard come from ``@pytest.mark.gradguard(...)`` on the test, if any.
    """
    return GradguardFixture()


def _guard_arguments(item) -> tuple[bool, dict]:
    marker = item.get_closest_marker("gradguard")
    kwargs = dict(marker.kwargs) if marker is not None else {}
    enabled = kwargs.pop("enabled", True)
    if marker is not None and marker.args:
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.gradguard takes keyword arguments only "
                                f"({', '.join(_GUARD_ARGUMENTS)}, enabled); got {marker.args!r}")
    unknown = sorted(set(kwargs) - set(_GUARD_ARGUMENTS))
    if unknown:
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.gradguard got unknown argument(s) "
                                f"{', '.join(unknown)}; it takes {', '.join(_GUARD_ARGUMENTS)}, enabled")
    fingerprint = item.config.getoption("--gradguard-fingerprint")
    if fingerprint is not None and "fingerprint" not in kwargs:
        kwargs["fingerprint"] = fingerprint
    wanted = (item.config.getoption("--gradguard") or marker is not None or "gradguard" in item.fixturenames)
    return bool(wanted and enabled), kwargs


def pytest_collection_modifyitems(session, config, items):
    for item in items:  # a misspelt marker argument stops the run before any test, like an unknown option
        if item.get_closest_marker("gradguard") is not None:
            _guard_arguments(item)


def pytest_report_header(config):
    if config.getoption("--gradguard"):
        return f"gradguard: every test runs under gradguard.guard() ({config.getoption('--gradguard-mode')} mode)"
    return None


# NOTE [--gradguard: sentinel first, forensics on failure]
# A suite under --gradguard should cost little, so a test without a marker or the fixture runs under the sentinel
# (sampled fingerprints, no write log): it fails on every hazard and names the tensor and the saver. When it
# fails at a hazard whose writer it could not name, the plugin runs the test body once more under the forensic
# guard and, when that run reproduces the same finding (same kind, same saver), reports the forensic finding
# with the writer's line; otherwise the sentinel's finding stands. Tests that asked for the guard explicitly get
# guard()'s own defaults (forensic) and are never re-run.
_RERUN_NOTE = ("the write was found by running this test again in forensic mode (--gradguard runs the cheap "
               "sentinel first, so the test body ran twice; --gradguard-mode=forensic avoids the re-run)")


def _saver_key(finding) -> tuple:
    where = finding.saved_at.location
    return finding.kind, finding.saved_at.op, None if where is None else (where.file, where.line)


def _forensic_rerun(item, kwargs: dict, first_error):
    """The forensic guard's error for the same hazard, by running the test body again; None when the re-run does
    not reproduce it (the sentinel's finding then stands)."""
    block = guard(**{**kwargs, **CALLBACK_MODES["forensic"]})
    try:
        with block:
            item.runtest()
    except GradientHazardError as error:
        if _saver_key(first_error.finding) == _saver_key(error.finding) and error.finding.modified_at:
            for finding in error.findings:
                finding.notes.append(_RERUN_NOTE)
            noted = type(error)(error.finding)  # the message is rendered once, when the error is built
            noted.findings = error.findings
            return noted, list(block.findings)
    except Exception as error:  # the re-run failed differently: the first run's finding stands
        log_fallback("pytest_plugin", f"the forensic re-run of {item.nodeid}", error)
    return None


# NOTE [--gradguard never changes the outcome of a hazard-free test]
# `pytest --gradguard` puts every test under the guard, including tests of code the guard cannot watch
# (functorch transforms refuse saved-tensor hooks, Dynamo traces into the write-log mode, exotic layouts the
# fingerprint does not handle). When a test blanket-guarded by --gradguard fails with an error that is not a
# gradguard finding and that the guard itself caused (raised while gradguard's own code was on the stack, or
# naming gradguard's code, or functorch's refusal of saved-tensor hooks), the plugin steps aside: it runs the
# test again without the guard, so the outcome is the test's own, and says so in one line (report section and
# terminal summary). Tests that asked for the guard explicitly (marker, fixture) keep the error.
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_PLUGIN_FILE = os.path.abspath(__file__)
_GUARD_INCOMPATIBLE_MESSAGES = ("don't yet support saved tensor hooks",)


def _guard_caused(error: BaseException) -> str | None:
    """Why this failure comes from the guard rather than the test (one line), or None when it is the test's."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, GradguardError):
            return None
        message = str(current)
        headline = f"{type(current).__name__}: {message.splitlines()[0] if message else ''}"
        if any(text in message for text in _GUARD_INCOMPATIBLE_MESSAGES) or _PACKAGE_DIR in message:
            return headline
        tb = current.__traceback__
        while tb is not None:
            filename = os.path.abspath(tb.tb_frame.f_code.co_filename)
            if filename.startswith(_PACKAGE_DIR) and filename != _PLUGIN_FILE:
                return headline
            tb = tb.tb_next
        current = current.__cause__ or current.__context__
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    enabled, kwargs = _guard_arguments(item)
    if not enabled:
        return (yield)
    blanket = item.get_closest_marker("gradguard") is None and "gradguard" not in item.fixturenames
    mode = item.config.getoption("--gradguard-mode") if blanket else "forensic"
    if blanket:
        kwargs = {**CALLBACK_MODES["forensic" if mode == "forensic" else "sentinel"], **kwargs}
    block = guard(**kwargs)
    handle = getattr(item, "funcargs", {}).get("gradguard")
    if isinstance(handle, GradguardFixture):  # the test's fixture sees its guard
        handle.guard = block
    reason = None
    findings_of = block
    try:
        with block:
            return (yield)
    except GradientHazardError as error:
        if blanket and mode == "auto" and not error.finding.modified_at:
            rerun = _forensic_rerun(item, kwargs, error)
            if rerun is not None:
                forensic_error, findings_of = rerun
                raise forensic_error.with_traceback(error.__traceback__) from None
        raise
    except Exception as error:
        reason = _guard_caused(error) if blanket else None
        if reason is None:
            raise
    finally:
        _report_findings(item, list(findings_of if isinstance(findings_of, list) else findings_of.findings))
    return _step_aside(item, reason)


def _report_findings(item, findings: list) -> None:
    """The test's "gradguard" report section (and "gradguard fix" with --gradguard-fix)."""
    if not findings:
        return
    text = "\n\n".join(render_finding(f) for f in findings)
    item.add_report_section("call", "gradguard", text + "\n")
    item.config.stash[_all_key].extend((item.nodeid, f) for f in findings)
    if item.config.getoption("--gradguard-fix") and not os.environ.get(_FIX_REPORT_ENV):
        fix_text = _verified_fix(item) if any(f.fixes for f in findings) else (
            "no edit is known for this diagnosis "
            f"({', '.join(dict.fromkeys(f.rule or f.kind for f in findings))}): nothing to verify\n")
        item.add_report_section("call", "gradguard fix", fix_text)
        item.config.stash[_fix_key][item.nodeid] = fix_text


def _step_aside(item, reason: str):
    """Run the test again without the guard, which caused its failure (NOTE [--gradguard never changes ...])."""
    reason = " ".join(reason.split())[:200]
    item.add_report_section("call", "gradguard", f"gradguard stepped aside: the guard cannot watch this test "
                                                 f"({reason}); it ran again without the guard\n")
    item.config.stash[_aside_key].append((item.nodeid, reason))
    if "torch._dynamo" in sys.modules:  # Dynamo caches the failed guarded compile: compile afresh, unguarded
        sys.modules["torch"].compiler.reset()
    return item.runtest()  # the test's own outcome, unguarded


def _verified_fix(item) -> str:
    """The "gradguard fix" section: the verified diff, or why there is none (never raises: the test's own
    failure is what the user came for)."""
    from gradguard._rerun import DEFAULT_RERUN_TIMEOUT

    try:
        from gradguard.fix.cli import verified_fix_text

        return verified_fix_text(item.nodeid, str(item.config.rootpath), DEFAULT_RERUN_TIMEOUT)
    except Exception as error:
        log_fallback("pytest_plugin", f"gradguard fix for {item.nodeid}", error)
        return f"gradguard fix could not run for this test ({type(error).__name__}: {error})\n"


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    aside = config.stash.get(_aside_key, [])
    if aside:
        terminalreporter.section("gradguard", sep="-")
    for nodeid, reason in aside:
        terminalreporter.write_line(f"gradguard: stepped aside for {nodeid} (the guard cannot watch it: {reason}); "
                                    "it ran without the guard")
    found = config.stash.get(_all_key, [])
    if not found:
        return
    terminalreporter.section("gradguard", sep="=", red=True, bold=True)
    for nodeid, finding in found:
        terminalreporter.write_line(printable(f"{nodeid}: {finding.headline or finding.kind}"))
        terminalreporter.write_line(printable(f"    tensor: {finding.tensor.label}"))
        if finding.saved_at.op:
            terminalreporter.write_line(printable(f"    saved by: {finding.saved_at.op}"))
        if finding.suggestion:
            terminalreporter.write_line(printable(f"    fix: {finding.suggestion}"))
    for nodeid, text in config.stash.get(_fix_key, {}).items():
        terminalreporter.write_line(f"gradguard fix, {nodeid}:")
        for line in text.splitlines():
            terminalreporter.write_line(printable(f"    {line}"))
    tests = len({nodeid for nodeid, _ in found})
    terminalreporter.write_line(f"gradguard: {len(found)} finding(s) in {tests} test(s)")
