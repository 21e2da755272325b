"""``make demo``: gradguard's headline in under a minute on two cores, after the install.

Seed 000's finding and its verified ``gradguard fix`` diff (and the HTML report's path), one silent write
(Liger-Kernel's Triton cross entropy, run on CPU by Triton's interpreter) and one ``check_op`` report. The steps
run two at a time (each is its own Python process, most of it single-threaded) and are printed in order, each as
soon as it and the ones before it are done. Exit status 1 if a step does not end as it should.
Every other example: ``make examples``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
GRADGUARD = [sys.executable, "-m", "gradguard"]

# One check_op report: seed 003's x * sin(x) with a backward that squares the upstream gradient (gradcheck, whose
# upstream gradients are ones, passes it). The four variants: python examples/ops/xsin_seed003.py.
CHECK_OP = """
import sys
sys.path.insert(0, "examples/ops")
import torch
from _show import show
from kernels import xsin_squared_upstream

x = torch.randn(10, generator=torch.Generator().manual_seed(0))
show("backward g * g * (sin x + x cos x): gradcheck passes it", xsin_squared_upstream, x)
"""

# (title, command, expected exit code, which output to show: stdout, or all of it)
STEPS = [
    ("seed 000: an RNN keeps its graph across steps: the finding and its fix",
     [*GRADGUARD, "fix", "--html", "gradguard-report.html", "examples/seed000/rnn_blog.py"], 0, "all"),
    ("a silent write: PyTorch alone gives a wrong gradient (Triton on CPU)",
     [sys.executable, "examples/silent/liger_cross_entropy_after_softmax.py"], 0, "stdout"),
    ("check_op: seed 003's x*sin(x) with a hand-written backward",
     [sys.executable, "-c", CHECK_OP], 0, "stdout"),
]


def _run(command: list[str]) -> subprocess.CompletedProcess:
    columns = str(shutil.get_terminal_size().columns)  # the demo's own terminal (COLUMNS, else 80 off one)
    env = {**os.environ, "COLUMNS": columns, "TRITON_INTERPRET": "1", "PYTHONWARNINGS": "ignore"}
    return subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, env=env, timeout=600,
                          stdin=subprocess.DEVNULL)


def _shown(result: subprocess.CompletedProcess, what: str) -> str:
    if what == "stdout":
        return result.stdout
    return result.stderr + result.stdout  # gradguard fix: what it found and did (stderr), then the diff


def main() -> int:
    failed = []
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = [pool.submit(_run, command) for _title, command, _code, _what in STEPS]
        for (title, command, code, what), future in zip(STEPS, results):
            result = future.result()
            print(f"== {title} ==", flush=True)
            print(_shown(result, what).rstrip() + "\n", flush=True)
            if result.returncode != code:
                failed.append(f"{title}: exit code {result.returncode}, expected {code}\n"
                              f"{result.stderr[-2000:]}")
    print("More: make examples (every bundled example, each checked), make demo-all (PaddlePaddle, MindSpore)")
    for failure in failed:
        print(f"demo step failed: {failure}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
