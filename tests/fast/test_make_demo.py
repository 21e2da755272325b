"""``make demo`` shows the headline and only that (seed 000's finding and its verified fix with the HTML report's
path, one silent write, one check_op report); every other example runs under ``make examples``, which
``make test`` (CI) runs too."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _target(makefile: str, name: str) -> str:
    match = re.search(rf"^{name}:([^\n]*)\n((?:\t[^\n]*\n)*)", makefile, re.M)
    assert match, f"no `{name}` target"
    return match.group(1) + "\n" + match.group(2)


def test_demo_is_the_headline_and_examples_run_everything():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    demo, examples, test = (_target(makefile, name) for name in ("demo", "examples", "test"))
    assert "examples/demo.py" in demo and "run_examples.py" not in demo
    assert "examples/run_examples.py" in examples and "examples/silent/" in examples and "examples/ops/" in examples
    assert "examples" in test.split("\n")[0].split()


def test_demo_output(tmp_path):
    env = {**os.environ, "COLUMNS": "80", "PYTHONWARNINGS": "ignore"}
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "demo.py")], cwd=ROOT, capture_output=True,
                            text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    sections = re.findall(r"^== (.*) ==$", out, re.M)
    assert [s.split(":")[0] for s in sections if not s.startswith(("liger", "the fix"))] == [
        "seed 000", "a silent write", "check_op"], sections
    assert "gradguard: the first run's finding" in out and "rnn.weight_hh_l0" in out
    assert "+        h_cur = h_next.detach()" in out
    assert re.search(r"HTML report: \S+gradguard-report\.html", out)
    assert "triton:liger_cross_entropy_kernel" in out
    assert out.count("gradguard.check_op FAILED") == 1
    assert "make examples" in out
