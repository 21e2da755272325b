"""Run every bundled example under ``gradguard run`` and show what gradguard says (``make demo``).

Each ``*_buggy.py`` example must produce a finding and each ``*_fixed.py`` must run clean (exit 0, no
finding); the exit status is 1 otherwise, so this doubles as a smoke test. Seed 000 (the blog post's RNN)
runs first. The examples run in parallel subprocesses: each one pays PyTorch's import time (~1.5 s).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

EXAMPLES_DIR = Path(__file__).resolve().parent
REPO_ROOT = EXAMPLES_DIR.parent


def example_scripts() -> list[Path]:
    """Seed 000 first, then the in-place patterns in numbered order (buggy before fixed)."""
    seed = sorted((EXAMPLES_DIR / "seed000").glob("*.py"), key=lambda p: (not p.stem.endswith("blog"), p.name))
    return seed + sorted((EXAMPLES_DIR / "inplace").glob("*.py"))


def expects_finding(script: Path) -> bool:
    return script.stem.endswith("_buggy") or script.stem.endswith("_blog")


def gradguard_command() -> list[str]:
    """`gradguard` from the interpreter running this file (works whether or not the venv is activated)."""
    return [sys.executable, "-m", "gradguard", "run"]


def run_example(script: Path) -> dict:
    """Run one example; returns its exit code, findings, stdout and stderr."""
    with tempfile.TemporaryDirectory() as tmp:
        json_path = os.path.join(tmp, "findings.json")
        env = {**os.environ, "COLUMNS": "110", "PYTHONHASHSEED": "0"}
        completed = subprocess.run(
            [*gradguard_command(), "--json", json_path, str(script.relative_to(REPO_ROOT))],
            cwd=REPO_ROOT, capture_output=True, text=True, env=env, timeout=120,
        )
        findings = []
        if os.path.exists(json_path):
            with open(json_path, encoding="utf-8") as handle:
                findings = json.load(handle)
    return {"script": script, "returncode": completed.returncode, "findings": findings,
            "stdout": completed.stdout, "stderr": completed.stderr}


def problem(result: dict) -> str | None:
    """Why this example's outcome is wrong, or None."""
    if expects_finding(result["script"]):
        if not result["findings"]:
            return f"expected a finding, got none (exit code {result['returncode']})"
        if result["returncode"] == 0:
            return "a finding was recorded but the script exited 0"
        return None
    if result["findings"]:
        return f"expected no finding, got {len(result['findings'])}"
    if result["returncode"] != 0:
        return f"exit code {result['returncode']}:\n{result['stderr']}"
    return None


def main() -> int:
    scripts = example_scripts()
    workers = max(2, os.cpu_count() or 2)
    failures = []
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for result in pool.map(run_example, scripts):  # map keeps the order: seed 000 prints first
            name = result["script"].relative_to(REPO_ROOT)
            wrong = problem(result)
            if expects_finding(result["script"]):
                print(f"=== {name}")
                print(result["stderr"].rstrip() if result["findings"] else "(no diagnosis)")
            else:
                print(f"=== {name}: {'ok' if wrong is None else 'FAILED'}")
            if wrong is not None:
                failures.append(f"{name}: {wrong}")
            print()
    if failures:
        print(f"{len(failures)} example(s) did not behave as expected:", file=sys.stderr)
        for failure in failures:
            print(f"  {failure}", file=sys.stderr)
        return 1
    print(f"all {len(scripts)} examples behaved as expected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
