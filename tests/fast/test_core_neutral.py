"""The framework-neutral core and the top-level package import no deep-learning framework."""

import json
import subprocess
import sys

CODE = """
import json, sys
import gradguard, gradguard.core, gradguard.backends, gradguard.backends.adapter
print(json.dumps(sorted(m for m in ("torch", "paddle", "mindspore", "autograd") if m in sys.modules)))
"""


def test_import_gradguard_and_core_imports_no_framework():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_guard_backend_argument_is_validated_without_importing_a_framework():
    code = ("import gradguard, sys\n"
            "try:\n    gradguard.guard(backend='jax')\nexcept TypeError as e:\n    print(e)\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [
        "guard(backend=...) must be 'auto' or one of 'torch', 'paddle', 'mindspore', 'autograd'; got 'jax'", "False"]


def test_core_imports_only_the_standard_library_its_dependencies_and_itself():
    """core imports no framework, renderer, error class, CLI or backend, at module level or lazily: every import
    statement in core/*.py (read with ast, so a lazy import inside a function counts) names the standard library,
    a declared dependency that is no framework (xxhash, libcst), or a core module."""
    import ast
    import pathlib

    core = pathlib.Path(__file__).resolve().parents[2] / "src" / "gradguard" / "core"
    allowed = set(sys.stdlib_module_names) | {"xxhash", "libcst", "__future__"}
    offenders = []
    for path in sorted(core.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level == 1:  # from .x import y: inside core
                    continue
                names = ["." * node.level + (node.module or "")]
            else:
                continue
            offenders += [f"{path.name}:{node.lineno} {name}" for name in names
                          if name.startswith(".") or name.split(".")[0] not in allowed]
    assert offenders == []


def test_test_files_have_unique_basenames():
    """Bare ``pytest`` (rootdir-relative module names, no packages) collects only when no two test files share
    a basename."""
    import collections
    import pathlib

    tests = pathlib.Path(__file__).resolve().parents[1]
    seen = collections.Counter(p.name for p in tests.rglob("test_*.py"))
    assert sorted(name for name, count in seen.items() if count > 1) == []
