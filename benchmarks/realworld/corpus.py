"""The real-world corpus: loading the cases and their answer keys, checking a key is well formed, and running
scripts under plain Python in one batch process (used by score.py and tests/slow/test_realworld_corpus.py)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass

__all__ = ["CASES_DIR", "KINDS", "SPLITS", "Case", "load_cases", "key_problems", "run_plain_batch", "split_of"]

CASES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cases")
KINDS = ("inplace_modification", "backward_twice", "leaf_inplace", "view_inplace", "silent_write", "none")
SPLITS = ("development", "validation")
_REQUIRED = {"id": str, "source": str, "title": str, "framework": str, "loud": bool, "kind": str,
             "tensor_names": list, "saver_lines": list, "writes": list, "fix_lines": list, "fix": str, "notes": str}


# NOTE [The validation split is drawn, not chosen]
# A case's half is a function of its id alone (the low bit of the first byte of sha256(id)): nobody picks which
# reports go where, adding a case never moves another, and a tool can compute the split without reading keys.
# Development cases are what diagnosis and repair work looks at; validation cases are scored only when a piece of
# work is finished and never tuned to, so the gap between the two halves measures how well the work generalises.
def split_of(case_id: str) -> str:
    return SPLITS[hashlib.sha256(case_id.encode("utf-8")).digest()[0] & 1]


@dataclass
class Case:
    directory: str
    key: dict

    @property
    def id(self) -> str:
        return self.key["id"]

    @property
    def split(self) -> str:
        return split_of(self.id)

    @property
    def buggy(self) -> str:
        return os.path.join(self.directory, "buggy.py")

    @property
    def fixed(self) -> str:
        return os.path.join(self.directory, "fixed.py")

    @property
    def correct(self) -> bool:
        return self.key["kind"] == "none"

    def accepted_kinds(self) -> list[str]:
        return self.key.get("kinds_accepted") or [self.key["kind"]]


def load_cases(cases_dir: str = CASES_DIR) -> list[Case]:
    cases = []
    for name in sorted(os.listdir(cases_dir)):
        directory = os.path.join(cases_dir, name)
        if not os.path.isdir(directory):
            continue
        with open(os.path.join(directory, "key.json"), encoding="utf-8") as handle:
            cases.append(Case(directory, json.load(handle)))
    return cases


def key_problems(case: Case) -> list[str]:
    """Everything wrong with one case's files and key (an empty list when it is well formed)."""
    key, problems = case.key, []
    for field, kind in _REQUIRED.items():
        if not isinstance(key.get(field), kind):
            problems.append(f"{field}: expected {kind.__name__}, got {key.get(field)!r}")
    if problems:
        return problems
    if key["id"] != os.path.basename(case.directory):
        problems.append(f"id {key['id']!r} is not the directory name")
    if key["kind"] not in KINDS:
        problems.append(f"kind {key['kind']!r} not in {KINDS}")
    if not key["source"].startswith("https://"):
        problems.append("source is not an https URL")
    if not os.path.isfile(case.buggy):
        return problems + ["buggy.py missing"]
    with open(case.buggy, encoding="utf-8") as handle:
        text = handle.read()
    n_lines = len(text.splitlines())
    if key["source"] not in text:
        problems.append("buggy.py does not cite the source URL")
    lines = list(key["saver_lines"]) + [n for group in key["writes"] for n in group] + list(key["fix_lines"])
    for n in lines:
        if not isinstance(n, int) or not 1 <= n <= n_lines:
            problems.append(f"line {n!r} is not a line of buggy.py ({n_lines} lines)")
    if case.correct:
        if key["loud"] or key["writes"] or key["saver_lines"] or os.path.exists(case.fixed):
            problems.append("a correct program (kind none) is quiet, has no lines and no fixed.py")
        return problems
    if not os.path.isfile(case.fixed):
        problems.append("fixed.py missing")
    if not key["writes"] or any(not group for group in key["writes"]):
        problems.append("every hazard case names at least one write, each with at least one line")
    if not key["fix_lines"] or not key["fix"]:
        problems.append("fix_lines and fix are required for a hazard case")
    if key["loud"] and not key.get("error"):
        problems.append("a loud case names the PyTorch error it raises (key 'error')")
    if key["kind"] in ("inplace_modification", "backward_twice", "silent_write") and not key["saver_lines"]:
        problems.append("saver_lines required for this kind")
    if not key["tensor_names"]:
        problems.append("tensor_names is empty")
    return problems


_DRIVER = r"""
import io, json, os, runpy, sys, traceback, warnings, contextlib
results = {}
for path in json.loads(sys.argv[1]):
    out = io.StringIO()
    code, error = 0, ""
    saved_argv, saved_path = list(sys.argv), list(sys.path)
    sys.argv = [path]
    sys.path.insert(0, os.path.dirname(path))
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            runpy.run_path(path, run_name="__main__")
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException as exc:
        code, error = 1, f"{type(exc).__name__}: {exc}"
    finally:
        sys.argv, sys.path = saved_argv, saved_path
    results[path] = {"exit": code, "error": error}
print(json.dumps(results))
"""


def run_plain_batch(paths: list[str], timeout: float = 600) -> dict[str, dict]:
    """Run each script as `python script.py` would (as __main__, its folder first on sys.path), all in one
    interpreter to pay torch's import once. Returns {path: {"exit": int, "error": "Type: message"}}."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(paths)], capture_output=True, text=True,
                          timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"batch runner failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


if __name__ == "__main__":  # list each case's half: python benchmarks/realworld/corpus.py [development|validation]
    wanted = sys.argv[1:] or list(SPLITS)
    for found in load_cases():
        if found.split in wanted:
            print(f"{found.split:<12} {found.id}")
