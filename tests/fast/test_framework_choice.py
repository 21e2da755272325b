"""A framework is chosen in one place (NOTE [A framework is chosen in one place] in ``gradguard.backends``).

Outside ``backends/`` no module compares a framework's name: ``backend == "torch"``, ``name in ("paddle",
"mindspore")``. Entry points call ``backends.choose()`` and ask the object it returns (``capabilities``,
``new_guard_session``, ``check_op``, ``enrich_error``). The source is read with ``ast`` (nothing imported, so no
framework is needed). A tuple that mixes a framework name with other names (``base.id in ("torch", "F")``, a
source rewriter matching ``torch.x`` / ``F.x`` in user code) names identifiers, not frameworks, and is not counted.
"""

from __future__ import annotations

import ast
import pathlib

from gradguard.backends import KNOWN

SRC = pathlib.Path(__file__).resolve().parents[2] / "src" / "gradguard"
FRAMEWORKS = set(KNOWN)  # every backend's name (importing gradguard.backends imports no framework)

# The comparisons still to remove, each with why it is still here. Matched by file and stripped line text (not line
# numbers), and each must still occur: remove an entry when its line goes.
ALLOWED = {
    # advisor/api.py: not a dispatch, which module a failed `import torch` names (NOTE [advise without torch])
    ("advisor/api.py", 'if _missing.name != "torch":'),
    # _errors.py: torch's own version-check message rebuilt for a torch finding; belongs in the torch backend's
    # phrasebook (not moved yet)
    ("_errors.py", 'if finding.kind != "inplace_modification" or finding.backend != "torch" or versions.get("now") '
                   'is None:'),
}


def _names(node: ast.AST) -> list[str] | None:
    """The string constants ``node`` is (a constant, or a tuple/list/set of constants only), else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and all(
            isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
        return [e.value for e in node.elts]
    return None


def _dispatches(compare: ast.Compare) -> bool:
    for op, left, right in zip(compare.ops, [compare.left, *compare.comparators], compare.comparators):
        if isinstance(op, (ast.Eq, ast.NotEq)):
            sides = [_names(left), _names(right)]
            if any(s is not None and len(s) == 1 and s[0] in FRAMEWORKS for s in sides):
                return True
        elif isinstance(op, (ast.In, ast.NotIn)):
            names = _names(right)
            if names and set(names) <= FRAMEWORKS:
                return True
    return False


def framework_name_comparisons(src: pathlib.Path = SRC) -> list[tuple[str, int, str]]:
    """(file relative to the package, line, stripped line) of each framework-name comparison outside backends/."""
    found = []
    for path in sorted(src.rglob("*.py")):
        relative = path.relative_to(src).as_posix()
        if relative.startswith("backends/"):
            continue
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, ast.Compare) and _dispatches(node):
                found.append((relative, node.lineno, lines[node.lineno - 1].strip()))
    return sorted(found)


def test_the_scan_sees_each_kind_of_framework_name_comparison(tmp_path):
    (tmp_path / "backends").mkdir()
    (tmp_path / "backends" / "x.py").write_text('if name == "torch": pass\n')  # backends/ may
    (tmp_path / "a.py").write_text('if name == "torch": pass\nif "paddle" != b: pass\n'
                                   'if name in ("paddle", "mindspore"): pass\nif name not in ["torch"]: pass\n'
                                   'if base.id in ("torch", "F"): pass\nif name == "jax": pass\n')
    assert [line for _f, line, _t in framework_name_comparisons(tmp_path)] == [1, 2, 3, 4]


def test_no_framework_name_comparison_outside_backends():
    found = framework_name_comparisons()
    left = [f"{file}:{line}: {text}" for file, line, text in found if (file, text) not in ALLOWED]
    assert not left, ("framework chosen by name outside gradguard/backends (call backends.choose() and ask the "
                      "object it returns):\n" + "\n".join(left))
    gone = ALLOWED - {(file, text) for file, _line, text in found}
    assert not gone, f"allow-listed comparisons no longer in the source (remove them from ALLOWED): {sorted(gone)}"


def test_entry_points_choose_through_the_one_resolver():
    for relative in ("_guard.py", "checks/__init__.py"):
        text = (SRC / relative).read_text(encoding="utf-8")
        assert "choose(" in text, relative
        assert "detect_backend" not in text and "resolve_backend" not in text, relative
