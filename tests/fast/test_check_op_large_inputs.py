"""NOTE [Large inputs] (checks/audit.py): past LARGE_INPUT_ELEMENTS differentiated elements every run uses one
random cotangent as well as one random direction (probes=1), unless the caller sets probes=."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import gradguard  # noqa: E402
from gradguard.checks import runs as op_runs  # noqa: E402
from gradguard.checks.audit import LARGE_INPUT_ELEMENTS  # noqa: E402


def _cotangents_per_run(monkeypatch, **options) -> set[int]:
    counts: list[int] = []
    original = op_runs.OpRuns._cotangents

    def counting(self, lin, rng, probes):
        cotangents = original(self, lin, rng, probes)
        counts.append(len(cotangents))
        return cotangents

    monkeypatch.setattr(op_runs.OpRuns, "_cotangents", counting)
    x = torch.randn(LARGE_INPUT_ELEMENTS // 64 + 1, 64, generator=torch.Generator().manual_seed(3))
    report = gradguard.check_op(lambda a: torch.sin(a) * a, x, checks=("gradient",), **options)
    assert report.passed
    return set(counts)


def test_large_inputs_use_one_cotangent_per_run(monkeypatch):
    assert _cotangents_per_run(monkeypatch) == {1}
    assert _cotangents_per_run(monkeypatch, reference=lambda a: torch.sin(a) * a) == {1}


def test_probes_set_by_the_caller_keep_their_cotangents(monkeypatch):
    assert _cotangents_per_run(monkeypatch, probes=2) == {2}
