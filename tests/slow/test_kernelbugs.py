"""check_op on published kernel bugs (benchmarks/kernelbugs): the answer keys hold on the cheap cases.

The full corpus (Triton kernels under the interpreter: about 5 minutes) is scored by ``make kernelbugs``; its
figures are in the README. Each case runs in its own process, as the scorer runs it.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCORE = os.path.join(ROOT, "benchmarks", "kernelbugs", "score.py")
spec = importlib.util.spec_from_file_location("kernelbugs_score", SCORE)
score = importlib.util.module_from_spec(spec)
spec.loader.exec_module(score)

CHEAP = ("k01", "k05", "k06", "k07", "k09")


def test_the_corpus_has_ten_published_bugs_with_keys():
    paths = score._case_paths([])
    assert len(paths) >= 10
    for path in paths:
        case = score._load(path)
        assert set(score.REQUIRED) <= set(case.CASE), path
        assert case.CASE["report"].startswith("https://github.com/"), path
        assert callable(case.buggy) and callable(case.fixed) and callable(case.reference), path


@pytest.mark.parametrize("path", score._case_paths(list(CHEAP)), ids=lambda p: os.path.basename(p)[:3])
def test_bug_caught_with_its_root_cause_and_the_fix_is_clean(path):
    row = score._subprocess(path, timeout=600, gradcheck=False)  # gradcheck: a minute on k09 alone
    assert "error" not in row, row.get("error")
    assert row["caught"], row["buggy"]
    assert row["root_ok"], (row["buggy"]["root_cause"], row["buggy"]["root_regime"])
    assert row["fixed_clean"], row["fixed"]["unexpected"]
    assert row["noref_agrees"], (row["noref"], row["noref_expected"])


def test_gradcheck_comparison_is_measured_and_rendered():
    # k05's ISRLU: gradcheck catches the bug (Jacobian mismatch) and passes the fix, in well under a second
    row = score._subprocess(score._case_paths(["k05"])[0], timeout=600)
    assert row["buggy_gradcheck"]["verdict"].startswith("fail: Jacobian mismatch"), row["buggy_gradcheck"]
    assert row["fixed_gradcheck"]["verdict"] == "pass"
    assert row["buggy_gradcheck"]["seconds"] > 0 and row["fixed_gradcheck"]["seconds"] > 0
    text = "\n".join(score._render_gradcheck([row]))
    assert "fails on 1/1 buggy versions and on 0/1 fixed ones" in text
    assert "| k05_isrlu_backward_ignores_grad_output | fail: Jacobian mismatch" in text
