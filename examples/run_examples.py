"""Run every bundled example under ``gradguard run`` and show what gradguard says (``make examples``).

Each ``*_buggy.py`` example must produce a finding and each ``*_fixed.py`` must run clean (exit 0, no
finding); the exit status is 1 otherwise, so this doubles as a smoke test. Seed 000 (the blog post's RNN)
runs first.

Buggy examples run one ``gradguard run --json`` subprocess each, in parallel, exactly as a user would run
them. Fixed examples only have to come out clean, so they share one subprocess that calls the same CLI
entry point once per script: PyTorch's import time (~1.5 s per process) is then paid once, not 21 times.
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
    """Seed 000 first, then the in-place patterns in numbered order (buggy before fixed), then the custom
    Function and tensor-hook writes PyTorch never checks (examples/hygiene)."""
    seed = sorted((EXAMPLES_DIR / "seed000").glob("*.py"), key=lambda p: (not p.stem.endswith("blog"), p.name))
    return seed + sorted((EXAMPLES_DIR / "inplace").glob("*.py")) + sorted((EXAMPLES_DIR / "hygiene").glob("*.py"))


def expects_finding(script: Path) -> bool:
    return script.stem.endswith("_buggy") or script.stem.endswith("_blog")


def mode_arguments(script: Path) -> list[str]:
    """``["--mode", "forensic"]`` when the example's docstring says to run it so (a hazard only the write log
    sees), else nothing."""
    for line in script.read_text(encoding="utf-8").splitlines()[:40]:
        words = line.split()
        if words[:3] == ["gradguard", "run", "--mode"] and len(words) > 3:
            return ["--mode", words[3]]
    return []


def gradguard_command() -> list[str]:
    """`gradguard` from the interpreter running this file (works whether or not the venv is activated)."""
    return [sys.executable, "-m", "gradguard", "run"]


def run_example(script: Path) -> dict:
    """Run one example; returns its exit code, findings, stdout and stderr."""
    with tempfile.TemporaryDirectory() as tmp:
        json_path = os.path.join(tmp, "findings.json")
        env = {**os.environ, "COLUMNS": "110", "PYTHONHASHSEED": "0"}
        completed = subprocess.run(
            [*gradguard_command(), "--json", json_path, *mode_arguments(script), str(script.relative_to(REPO_ROOT))],
            cwd=REPO_ROOT, capture_output=True, text=True, env=env, timeout=120,
        )
        findings = []
        if os.path.exists(json_path):
            with open(json_path, encoding="utf-8") as handle:
                findings = json.load(handle)["findings"]
    return {"script": script, "returncode": completed.returncode, "findings": findings,
            "stdout": completed.stdout, "stderr": completed.stderr}


_BATCH = r"""
import contextlib, gc, io, json, os, sys, tempfile
from gradguard.cli import main

results = {}
for entry in sys.argv[1:]:
    script, _, mode = entry.partition("::")
    out, err = io.StringIO(), io.StringIO()
    path_before, argv_before = list(sys.path), list(sys.argv)
    with tempfile.TemporaryDirectory() as tmp:
        json_path = os.path.join(tmp, "findings.json")
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(["run", "--json", json_path, *(["--mode", mode] if mode else []), script])
            except SystemExit as stop:
                code = stop.code
        findings = json.load(open(json_path))["findings"] if os.path.exists(json_path) else []
    sys.path[:], sys.argv = path_before, argv_before
    results[entry] = {"returncode": code, "findings": findings, "stdout": out.getvalue(), "stderr": err.getvalue()}
    gc.collect()
print(json.dumps(results))
"""


def run_clean_batch(scripts: list[Path]) -> dict[Path, dict]:
    """Run each script through ``gradguard.cli.main(["run", "--json", ...])`` in one shared subprocess."""
    relative = [str(s.relative_to(REPO_ROOT)) for s in scripts]
    entries = [f"{r}::{(mode_arguments(s) or [None, ''])[1]}" for s, r in zip(scripts, relative)]
    done = subprocess.run([sys.executable, "-c", _BATCH, *entries], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"the batch runner failed:\n{done.stderr}")
    raw = json.loads(done.stdout.strip().splitlines()[-1])
    return {s: {"script": s, **raw[e]} for s, e in zip(scripts, entries)}


def diagnosis_text(stderr: str) -> str:
    """What gradguard printed: from the traceback head on (the script's own warnings are left out)."""
    start = stderr.find("Traceback (most recent call last):")
    return stderr[start:].rstrip() if start >= 0 else stderr.rstrip()


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
    buggy = [s for s in scripts if expects_finding(s)]
    fixed = [s for s in scripts if not expects_finding(s)]
    workers = max(2, os.cpu_count() or 2)
    failures = []
    with ThreadPoolExecutor(max_workers=workers) as pool:
        clean = pool.submit(run_clean_batch, fixed)
        results = dict(zip(buggy, pool.map(run_example, buggy)))
        results.update(clean.result())
    for script in scripts:  # seed 000 first, each buggy example next to its fixed variant
        result = results[script]
        name = script.relative_to(REPO_ROOT)
        wrong = problem(result)
        if expects_finding(script):
            print(f"=== {name}")
            print(diagnosis_text(result["stderr"]) if result["findings"] else "(no diagnosis)")
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
