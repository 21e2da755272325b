"""``checks.tolerances.TOLERANCES`` is the one source of check_op's tolerances: no check holds its own."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

import gradguard.checks as checks_pkg
from gradguard.checks import tolerances as tol
from gradguard.checks.tolerances import TOLERANCES, Rel, Ulps

SRC = pathlib.Path(checks_pkg.__file__).parent
TABLE = SRC / "tolerances.py"
BACKENDS = SRC.parent / "backends"
# every module a check_op check lives in (framework adapters and framework-only checks included)
CHECK_MODULES = sorted(p for p in SRC.glob("*.py") if p != TABLE) + sorted(BACKENDS.glob("*/check*.py"))

# Small constants in the checks that are not tolerances, each with why (file name, source text, reason).
NOT_TOLERANCES = {
    ("audit.py", "2.0**-40"): "NOTE [Effective precision]: the jitter a float64 op must see, a probe, not an allowance",
    ("audit.py", "2.0**-60"): "NOTE [Effective precision]: the jitter's offset so that zeros move too",
}


def _small_constants(path: pathlib.Path):
    """(source text, value) of float literals and constant powers below 1e-3 in ``path`` (zeros aside)."""
    source = path.read_text()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, float):
            value = node.value
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) and \
                isinstance(node.left, ast.Constant) and isinstance(node.right, (ast.Constant, ast.UnaryOp)):
            value = eval(compile(ast.Expression(node), str(path), "eval"))  # a constant expression
        else:
            continue
        if isinstance(value, (int, float)) and 0 < abs(value) < 1e-3:
            yield ast.get_source_segment(source, node), value


@pytest.mark.parametrize("path", CHECK_MODULES, ids=lambda p: p.name)
def test_no_small_float_literal_outside_the_table(path):
    found = [(text, value) for text, value in _small_constants(path) if (path.name, text) not in NOT_TOLERANCES]
    assert not found, f"{path.name} holds tolerance-sized constants {found}: move them to checks/tolerances.py"


@pytest.mark.parametrize("path", CHECK_MODULES, ids=lambda p: p.name)
def test_no_tolerance_pattern_outside_the_table(path):
    """The review's grep: ``1e-N`` and multiples of eps (ulps) appear in the table only, code, comments and text."""
    pattern = re.compile(r"1e-[0-9]|\*\s*eps|eps\s*\*")
    hits = [f"{n}: {line.strip()}" for n, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert not hits, f"{path.name}:\n" + "\n".join(hits)


def test_allow_list_entries_are_still_there():
    for (name, text), _why in NOT_TOLERANCES.items():
        assert any(t == text for t, _ in _small_constants(SRC / name)), f"{name} no longer has {text}: drop it here"


def test_mindspore_check_bprop_uses_no_private_audit_member():
    source = (BACKENDS / "mindspore" / "check_bprop.py").read_text()
    assert not re.search(r"audit\._[a-z]", source)
    assert "gradient_floor(" in source


def test_every_table_entry_says_why():
    """Each key of TOLERANCES has a comment line right above it (why that value)."""
    lines = TABLE.read_text().splitlines()
    for key in TOLERANCES:
        n = next(i for i, line in enumerate(lines) if line.strip().startswith(f'"{key}":'))
        assert lines[n - 1].strip().startswith("#"), f"{key} has no comment saying why"


def test_values_are_the_ones_the_checks_always_used():
    """The table only moved the literals: the values (and so every verdict) are unchanged."""
    assert TOLERANCES["gradient.numerical.rtol"] == 1e-4
    assert TOLERANCES["gradient.numerical.step"] == 1e-6
    assert TOLERANCES["gradient.numerical.rounding"] == Ulps(64)
    assert TOLERANCES["gradient.numerical.richardson"] == 4.0
    assert TOLERANCES["floor"] == Rel(1e-9, 64)
    assert TOLERANCES["reference"] == Rel(1e-9, 64)
    assert (TOLERANCES["reference.factor"], TOLERANCES["reference.ulps"]) == (5.0, Ulps(8))
    assert TOLERANCES["reference.float64_op"] == 1e-7
    assert TOLERANCES["gradient.precision"] == {"float32": 1e-4, "float16": 2e-2, "bfloat16": 1e-1, "complex64": 1e-4}
    assert TOLERANCES["gradient.surrogate"] == TOLERANCES["reference.vs_differences"] == Rel(1e-7, 64)
    assert (TOLERANCES["kink.step"], TOLERANCES["kink.slack"]) == (1e-7, 1e-6)
    assert TOLERANCES["gradient.cotangent_linearity"] == Rel(1e-9, 16)
    assert TOLERANCES["regime.layout"] == Rel(1e-12, 16)
    assert TOLERANCES["composition"] == TOLERANCES["mutation.backward_not_repeatable"] == Ulps(4)
    assert TOLERANCES["mode.graph"] == Rel(1e-9, 64)
    assert TOLERANCES["effective_precision.missed"] == 1e-2
    assert TOLERANCES["regime.near_constant_rows.spread"] == 1e-3
    assert TOLERANCES["tiny"] == 1e-300


def test_helpers_compute_what_the_literals_did():
    eps32, eps64 = 2.0**-23, 2.0**-52
    assert tol.difference_step(False, eps64) == 1e-6 and tol.difference_step(True, eps32) == eps32 ** 0.5
    assert tol.difference_rtol(1e-4, False, eps32) == 1e-4
    assert tol.difference_rtol(1e-4, True, eps32) == max(1e-4, 10 * eps32 ** 0.5)
    assert tol.weight_step("float64", eps64) == 1e-6 and tol.weight_step("float32", eps32) == eps32 ** (1.0 / 3.0)
    assert TOLERANCES["gradient.surrogate"].at("float32", eps32) == 64 * eps32
    assert TOLERANCES["gradient.surrogate"].at("float64", eps64) == 1e-7
    u, f, x, xmax = 1.7, 3.0, 2.5, 4.0
    assert tol.gradient_floor(eps32, u, f, x, xmax) == max(64.0 * eps32, 1e-9) * u * max(f, xmax) / max(x, 1.0)
    assert tol.gradient_floor(eps64, u, f, 0.5, 0.0) == 1e-9 * u * f / 1.0
    assert [tol.written(v) for v in (1e-9, 1e-4, 2.5e-3, 1e-12)] == ["1e-9", "1e-4", "2.5e-3", "1e-12"]
