"""`pytest --gradguard` never changes the outcome of a test with no hazard. A probe suite of realistic
hazard-free tests (torch.func, torch.compile(fullgraph=True), user saved-tensor hooks, checkpointing,
threads, warnings as errors, `pytest.raises(match=...)` on PyTorch's own errors, capsys, subprocesses,
NumPy, double backward, sparse CSR, save_on_cpu, an optimizer loop) runs with and without --gradguard
(pytester, in subprocesses); every test's outcome must be the same. Where the guard cannot watch a test, the
plugin steps aside for it and says so in one line."""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.slow
pytest_plugins = ["pytester"]

SUITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe", "hazard_free_suite.py")


def _outcomes(result) -> dict[str, str]:
    """nodeid -> PASSED / FAILED / ERROR ... from the `-rA` short summary."""
    outcomes: dict[str, str] = {}
    for line in result.outlines:
        word, _, rest = line.partition(" ")
        if word in ("PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS") and "::" in rest:
            outcomes[rest.split(" ")[0]] = word
    return outcomes


def test_gradguard_flag_keeps_every_outcome(pytester):
    with open(SUITE, encoding="utf-8") as handle:
        pytester.makepyfile(test_probe=handle.read())
    plain = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA", timeout=600)
    guarded = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA", "--gradguard", timeout=600)
    expected = _outcomes(plain)
    assert len(expected) == 16 and set(expected.values()) == {"PASSED"}, plain.stdout.str()
    assert _outcomes(guarded) == expected, guarded.stdout.str()
    text = guarded.stdout.str()
    # The guard itself steps aside inside what it cannot watch (torch.func, sparse CSR: one NotWatched warning
    # each, shown in pytest's warnings summary), so the plugin never has to re-run a test unguarded, and a
    # fullgraph compile just works.
    assert "stepped aside for" not in text, text
    assert "NotWatched: gradguard: not watching inside torch.func transforms" in text, text
    assert "NotWatched: gradguard: not watching sparse_csr tensors saved for backward" in text, text
    # PyTorch's own error, matched by the test, is still explained by the guard
    assert "test_probe.py::test_pytorch_inplace_error_match: a tensor saved for backward was modified" in text
