"""Every JSON document gradguard writes is the versioned envelope, strict JSON, and valid against the schema
shipped in the package (``gradguard/schemas/*.schema.json``): real outputs of ``gradguard run --json``
(a finding, with its write records and fix intents, and an empty run), ``check_op`` and ``gradguard advise``."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import torch

import gradguard
from gradguard.report import FORMAT_VERSION, dumps, read_findings
from gradguard.schemas import REPORTS, load_schema

REPO_ROOT = Path(__file__).resolve().parents[2]


def _strict_loads(text: str):
    """json.loads that rejects NaN/Infinity tokens, as strict parsers in other languages do."""
    def reject(token):
        raise ValueError(f"non-standard JSON token {token}")

    return json.loads(text, parse_constant=reject)


def _validate(document: dict, report: str) -> None:
    schema = load_schema(report)
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(document)
    assert (document["format_version"], document["tool"], document["version"], document["report"]) == (
        FORMAT_VERSION, "gradguard", gradguard.__version__, report)


def test_schemas_are_shipped_and_valid():
    for report in REPORTS:
        schema = load_schema(report)
        jsonschema.Draft202012Validator.check_schema(schema)
        assert schema["properties"]["report"] == {"const": report, "description": schema["properties"]["report"][
            "description"]}
    with pytest.raises(gradguard.InvalidArgument, match="load_schema\\(report=...\\) must be one of"):
        load_schema("findings")


_RUNS = r"""
import sys
from gradguard.cli import main
for args in (sys.argv[1:6], sys.argv[6:]):
    try:
        main(["run", *args])
    except SystemExit:
        pass
"""


def test_gradguard_run_json_validates(tmp_path):
    buggy, empty = tmp_path / "buggy.json", tmp_path / "empty.json"
    done = subprocess.run(
        [sys.executable, "-c", _RUNS, "--mode", "forensic", "--json", str(buggy),
         "examples/inplace/04_residual_add_after_relu_buggy.py",
         "--json", str(empty), "examples/inplace/04_residual_add_after_relu_fixed.py"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=240)
    assert "InplaceModificationError" in done.stderr, done.stderr

    document = _strict_loads(buggy.read_text())
    _validate(document, "guard")
    (finding,) = read_findings(document)
    assert document["script"] == finding["script"] == "examples/inplace/04_residual_add_after_relu_buggy.py"
    assert finding["kind"] == "inplace_modification" and finding["modified_at"], finding
    assert isinstance(finding["fixes"], list)

    nothing = _strict_loads(empty.read_text())
    _validate(nothing, "guard")
    assert nothing["findings"] == [] and read_findings(nothing) == []


def test_check_op_json_is_strict_and_validates():
    # A reference that is identically zero: the relative error is infinite, which strict JSON cannot write.
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    report = gradguard.check_op(lambda t: t * 2, x, reference=lambda t: t * 0)
    assert any(f.max_rel_err is not None and math.isinf(f.max_rel_err) for f in report.findings)
    text = report.to_json()
    document = _strict_loads(text)
    _validate(document, "check_op")
    assert document["passed"] is False
    assert "Infinity" in {f["max_rel_err"] for f in document["findings"]}
    assert [f["check"] for f in document["findings"]] == [f.check for f in report.failures + report.warnings]


def test_check_op_passing_report_validates():
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    report = gradguard.check_op(torch.sin, x, reference=lambda t: t.sin())
    document = _strict_loads(report.to_json())
    _validate(document, "check_op")
    assert document["passed"] is True and document["findings"] == []


def test_advise_json_validates():
    torch.manual_seed(0)
    w = torch.randn(64, 64, requires_grad=True)
    x = torch.randn(32, 64)

    def step():
        h = x @ w
        a = torch.relu(h)
        (a @ w).sum().backward()

    report = gradguard.advise(step, repeats=0, allocator_check=False)
    document = _strict_loads(report.to_json())
    _validate(document, "advise")
    assert document["findings"] == [p.to_dict() for p in report.proposals]


def test_non_finite_numbers_are_strings():
    assert _strict_loads(dumps({"a": [float("nan"), float("inf"), -float("inf"), 1.5]})) == {
        "a": ["NaN", "Infinity", "-Infinity", 1.5]}


def test_read_findings_rejects_other_documents():
    with pytest.raises(ValueError, match="not a gradguard findings document"):
        read_findings({"proposals": []})
