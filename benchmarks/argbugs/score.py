"""Argument-dependent bugs: check_op against torch.autograd.gradcheck on benchmarks/argbugs/catalogue.py.

For every case, the mutant and the correct op, called the way a gradcheck user calls them (the tensors and the
scalars the test passes, defaults otherwise): gradcheck on float64 copies, check_op on the float32 inputs with the
reference, without it, and with ``budget=`` (quick mode). Prints a markdown table and the totals.

    .venv/bin/python benchmarks/argbugs/score.py [--repeats 1] [--only NAME ...] [--budget quick] [--clock cpu]
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import torch  # noqa: E402

import gradguard  # noqa: E402
from catalogue import CASES  # noqa: E402


def _gradcheck(fn, args):
    args64 = [a.detach().double().requires_grad_() if torch.is_tensor(a) and a.is_floating_point() else a for a in args]
    try:
        return not torch.autograd.gradcheck(fn, tuple(args64), raise_exception=True)
    except Exception:  # GradcheckError, or the op crashing in float64
        return True


def _timed(run, repeats, clock=time.perf_counter):
    times, out = [], None
    for _ in range(repeats):
        t0 = clock()
        out = run()
        times.append(clock() - t0)
    return out, statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--budget", default=None, help="also run check_op(..., budget=SECONDS or quick)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="cpu: this process's CPU time (every tool runs on one thread here), steadier than the "
                             "wall clock on a shared machine")
    opts = parser.parse_args()
    if opts.budget not in (None, "quick"):
        opts.budget = float(opts.budget)
    torch.set_num_threads(1)
    rows = ["| case | version | gradcheck | check_op, reference | check_op, no reference |"
            + (" check_op, budget |" if opts.budget else ""), "|---|---|---|---|---|" + ("---|" if opts.budget else "")]
    totals = {"gradcheck": 0.0, "ref": 0.0, "noref": 0.0, "budget": 0.0}
    caught = {"gradcheck": 0, "ref": 0, "noref": 0, "budget": 0}
    false = {"gradcheck": 0, "ref": 0, "noref": 0, "budget": 0}
    for case in CASES:
        if opts.only and case.name not in opts.only:
            continue
        args = case.make(torch.float32, torch.Generator().manual_seed(0))
        for version, fn in (("mutant", case.mutant), ("correct", case.correct)):
            runs = {
                "gradcheck": lambda: _gradcheck(fn, args),
                "ref": lambda: not gradguard.check_op(fn, *args, reference=case.reference).passed,
                "noref": lambda: not gradguard.check_op(fn, *args).passed,
            }
            if opts.budget:
                runs["budget"] = lambda: not gradguard.check_op(fn, *args, reference=case.reference,
                                                                budget=opts.budget).passed
            cells = []
            for tool, run in runs.items():
                failed, t = _timed(run, opts.repeats, time.process_time if opts.clock == "cpu" else time.perf_counter)
                totals[tool] += t
                if version == "mutant":
                    caught[tool] += failed
                else:
                    false[tool] += failed
                word = ("**caught**" if failed else "missed") if version == "mutant" else ("FALSE ALARM" if failed else "ok")
                cells.append(f"{word} ({t * 1e3:.0f} ms)")
            rows.append(f"| {case.name} | {version} | " + " | ".join(cells) + " |")
            print(rows[-1], flush=True)
    n = len([c for c in CASES if not opts.only or c.name in opts.only])
    print("\n".join(rows[:2]))
    print()
    print("| tool | mutants caught | false alarms on correct ops | total time | / gradcheck |")
    print("|---|---|---|---|---|")
    labels = {"gradcheck": "gradcheck", "ref": "check_op, reference", "noref": "check_op, no reference",
              "budget": f"check_op, budget={opts.budget}"}
    for tool in runs:
        print(f"| {labels[tool]} | {caught[tool]}/{n} | {false[tool]}/{n} | {totals[tool]:.2f} s | "
              f"{totals[tool] / totals['gradcheck']:.2f}x |")


if __name__ == "__main__":
    main()
