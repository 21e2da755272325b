"""Test helpers: ``assert_op`` for pytest suites of custom ops."""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["assert_op"]


def assert_op(fn: Callable, *inputs: Any, reference: Callable | None = None, **options: Any):
    """Run :func:`gradguard.check_op` and raise ``AssertionError`` with the full report if any check fails.

    Returns the report when everything passed (warnings do not fail).
    """
    from .checks import check_op

    report = check_op(fn, *inputs, reference=reference, **options)
    if not report.passed:
        raise AssertionError("\n" + str(report))
    return report
