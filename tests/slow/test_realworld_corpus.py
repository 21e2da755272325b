"""The real-world corpus (benchmarks/realworld/cases) is itself correct: every answer key is well formed and points
at real lines, every loud reproduction fails under plain Python with the PyTorch error it reproduces, every silent
reproduction and correct program runs clean, and every hand fix runs clean. All scripts run in one interpreter
(benchmarks/realworld/corpus.py: run_plain_batch) so the whole corpus costs one torch import."""

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "realworld"))

from corpus import KINDS, SPLITS, key_problems, load_cases, run_plain_batch, split_of  # noqa: E402

pytestmark = pytest.mark.slow
CASES = load_cases()


@pytest.fixture(scope="module")
def plain_runs():
    paths = [c.buggy for c in CASES] + [c.fixed for c in CASES if not c.correct]
    return run_plain_batch(paths, timeout=600)


def test_corpus_size_and_coverage():
    kinds = [c.key["kind"] for c in CASES]
    hazards = [c for c in CASES if not c.correct]
    assert len(CASES) >= 60, len(CASES)
    assert kinds.count("none") >= 10
    assert set(kinds) == set(KINDS), sorted(set(KINDS) - set(kinds))
    assert len({c.key["source"] for c in hazards}) == len(hazards), "each hazard reproduces a different report"
    assert len({c.id for c in CASES}) == len(CASES)


def test_both_halves_hold_every_class_of_case():
    """The development/validation split is drawn from the case id (never chosen) and each half has loud hazards,
    silent hazards and correct programs, so each half's figures mean something."""
    assert split_of("001_recurrence_in_preallocated_vector") == split_of("001_recurrence_in_preallocated_vector")
    for split in SPLITS:
        half = [c for c in CASES if c.split == split]
        assert len(half) >= len(CASES) // 3, (split, len(half))
        assert any(c.key["loud"] for c in half), split
        assert any(c.correct for c in half), split
        assert any(not c.key["loud"] and not c.correct for c in half), split


def test_every_key_is_well_formed():
    problems = {c.id: key_problems(c) for c in CASES}
    assert {k: v for k, v in problems.items() if v} == {}


@pytest.mark.exhaustive  # every case run under plain python: checks the corpus, not gradguard
def test_loud_reproductions_fail_with_the_reported_pytorch_error(plain_runs):
    wrong = {}
    for case in CASES:
        if not case.key["loud"]:
            continue
        run = plain_runs[case.buggy]
        if run["exit"] == 0 or not run["error"].startswith("RuntimeError") or case.key["error"] not in run["error"]:
            wrong[case.id] = (run["exit"], run["error"][:200], case.key["error"])
    assert wrong == {}


@pytest.mark.exhaustive  # every case run under plain python: checks the corpus, not gradguard
def test_silent_reproductions_and_correct_programs_exit_0(plain_runs):
    wrong = {c.id: plain_runs[c.buggy] for c in CASES if not c.key["loud"] and plain_runs[c.buggy]["exit"] != 0}
    assert wrong == {}


@pytest.mark.exhaustive  # every case run under plain python: checks the corpus, not gradguard
def test_every_hand_fix_runs_clean(plain_runs):
    wrong = {c.id: plain_runs[c.fixed] for c in CASES if not c.correct and plain_runs[c.fixed]["exit"] != 0}
    assert wrong == {}


def test_hand_fix_edits_exactly_the_fix_lines():
    """fix_lines in the key are the buggy.py lines the hand fix replaces or deletes, or the two lines an insertion sits between."""
    import difflib

    wrong = {}
    for case in CASES:
        if case.correct:
            continue
        with open(case.buggy, encoding="utf-8") as handle:
            buggy = handle.read().splitlines()
        with open(case.fixed, encoding="utf-8") as handle:
            fixed = handle.read().splitlines()
        touched = set()
        for tag, i1, i2, _, _ in difflib.SequenceMatcher(a=buggy, b=fixed, autojunk=False).get_opcodes():
            if tag == "insert":
                touched.update({max(i1, 1), min(i1 + 1, len(buggy))})  # the lines around the insertion
            elif tag != "equal":
                touched.update(range(i1 + 1, i2 + 1))
        if not touched or not touched <= set(case.key["fix_lines"]):
            wrong[case.id] = (sorted(touched), case.key["fix_lines"])
    assert wrong == {}


def test_scorer_reads_the_json_fields_it_documents(tmp_path):
    """score.py's readers on findings shaped like `gradguard run --json` output (README, JSON format)."""
    import score

    path = str(tmp_path / "buggy.py")
    here = {"file": path, "function": "<module>", "code": ""}
    inplace = {"kind": "inplace_modification", "tensor": {"name": None, "label": "laterals[0] (float32[1, 4])"},
               "saved_at": dict(here, line=17), "modified_at": [dict(here, line=21), {"file": "/lib.py", "line": 3}],
               "explanation": "x", "suggestion": "Use `x = x + y` instead of `x += y`; call `.detach()`.",
               "context": {}}
    twice = {"kind": "backward_twice", "tensor": {"name": "state[0]", "label": "state[0] (float32[1])"},
             "saved_at": {"file": None, "line": None}, "modified_at": [],
             "context": {"display": [["carried by", "`state`, assigned at line 14: out, state = f()"],
                                     ["freed by", "the earlier backward at line 17: loss.backward()"]]}}
    assert score.saver_lines(inplace, path) == {17}
    assert score.write_lines(inplace, path) == {21}
    assert score.saver_lines(twice, path) == {14} and score.write_lines(twice, path) == {17}
    assert score._name_ok(score.tensor_candidates(inplace), ["laterals[0]"])
    assert score._name_ok(score.tensor_candidates(twice), ["state[0]"])
    assert not score._name_ok(["TwinnedQNetwork.Q2.Q.2.weight"], ["Q.2.bias"])
    assert score._name_ok(["TwinnedQNetwork.Q2.Q.2.weight"], ["Q2.Q.2.weight"])
    assert score.bad_code(inplace["suggestion"]) == []
    assert score.bad_code("`the tensor = the tensor.clone()` and `with torch.no_grad():`") == ["the tensor = the tensor.clone()"]
