"""pytest plugin (entry point ``pytest11``: ``gradguard = gradguard.integrations.pytest_plugin``).

* ``pytest --gradguard``: every test's call phase runs under ``gradguard.guard()``;
* ``@pytest.mark.gradguard(fingerprint="sample", track_writes=True)``: this test runs under the guard with
  these arguments (``enabled=False`` opts a test out of ``--gradguard``);
* the ``gradguard`` fixture: the test runs under the guard and gets a handle whose ``findings`` lists what
  the guard found so far (``pytest.raises(gradguard.InplaceModificationError)`` then inspect);
* findings are attached to the test's report (a "gradguard" section, shown with the failure) and summed up
  in the terminal summary.

This module must load without importing any deep-learning framework (pytest loads it in every run of every
project that has gradguard installed): it imports only pytest and the standard library at module level, and
gradguard's guard (whose backend imports torch) only when a test asks for it.
"""

from __future__ import annotations

import pytest

__all__ = ["GradguardFixture"]

_GUARD_ARGUMENTS = ("fingerprint", "track_writes", "backend")
_all_key = pytest.StashKey[list]()  # config -> [(nodeid, finding), ...]


def pytest_addoption(parser):
    group = parser.getgroup("gradguard", "gradguard: gradient correctness")
    group.addoption("--gradguard", action="store_true", default=False,
                    help="run every test under gradguard.guard(): in-place hazards on tensors saved for backward "
                         "fail the test with a precise diagnosis")
    group.addoption("--gradguard-fingerprint", choices=("full", "sample", "off"), default=None,
                    help="fingerprint mode for guarded tests (default: full, or the marker's)")


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "gradguard(fingerprint='full', track_writes=True, backend='auto', enabled=True): run this test under "
        "gradguard.guard(...) with these arguments; enabled=False opts it out of --gradguard",
    )
    config.stash[_all_key] = []


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
        return "gradguard: every test runs under gradguard.guard()"
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    enabled, kwargs = _guard_arguments(item)
    if not enabled:
        return (yield)
    from gradguard import guard

    block = guard(**kwargs)
    handle = getattr(item, "funcargs", {}).get("gradguard")
    if isinstance(handle, GradguardFixture):
        handle.guard = block
    try:
        with block:
            return (yield)
    finally:
        findings = list(block.findings)
        if findings:
            from gradguard.report._text import render_finding

            text = "\n\n".join(render_finding(f) for f in findings)
            item.add_report_section("call", "gradguard", text + "\n")
            item.config.stash[_all_key].extend((item.nodeid, f) for f in findings)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    found = config.stash.get(_all_key, [])
    if not found:
        return
    terminalreporter.section("gradguard", sep="=", red=True, bold=True)
    for nodeid, finding in found:
        terminalreporter.write_line(f"{nodeid}: {finding.headline or finding.kind}")
        terminalreporter.write_line(f"    tensor: {finding.tensor.label}")
        if finding.saved_at.op:
            terminalreporter.write_line(f"    saved by: {finding.saved_at.op}")
        if finding.suggestion:
            terminalreporter.write_line(f"    fix: {finding.suggestion}")
    tests = len({nodeid for nodeid, _ in found})
    terminalreporter.write_line(f"gradguard: {len(found)} finding(s) in {tests} test(s)")
