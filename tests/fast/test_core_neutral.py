"""The framework-neutral core and the top-level package import no deep-learning framework."""

import json
import subprocess
import sys

CODE = """
import json, sys
import gradguard, gradguard.core, gradguard.backends, gradguard.backends._adapter
print(json.dumps(sorted(m for m in ("torch", "paddle", "mindspore") if m in sys.modules)))
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
        "guard(backend=...) must be 'auto' or one of 'torch', 'paddle', 'mindspore'; got 'jax'", "False"]


def test_core_names_neither_a_framework_nor_the_renderers():
    import pathlib
    import re

    core = pathlib.Path(__file__).resolve().parents[2] / "src" / "gradguard" / "core"
    pattern = re.compile(r"\b(import|from)\s+(torch|paddle|mindspore|\.\.report|gradguard\.report)\b|"
                         r"[\"']gradguard\.report[\"']")
    offenders = [f"{p.name}:{n}" for p in sorted(core.glob("*.py"))
                 for n, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert offenders == []
