"""Detection and time: gradguard.check_op vs torch.autograd.gradcheck (and fast_mode).

Runs every correct and buggy op of examples/ops/kernels.py (plus liger-kernel's cross entropy with
--liger, under the Triton interpreter) and prints a markdown table. Times are medians of --repeats runs;
gradcheck gets float64 copies of the inputs (it needs them), check_op the float32 inputs as given.

    .venv/bin/python benchmarks/bench_check_op.py [--repeats 5] [--liger] [--no-sizes]

A second table times the three correct ops of the first at growing input sizes: gradcheck's full Jacobian costs
2n forward and n backward calls, check_op's fixed set of regimes and probes does not grow with n past
``full_jacobian_max`` elements, so the ratio depends on the size chosen.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import time

os.environ.setdefault("TRITON_INTERPRET", "1")
ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "examples" / "ops"))

import torch  # noqa: E402

import gradguard  # noqa: E402
import kernels as K  # noqa: E402


def _gradcheck(fn, args, fast):
    args64 = [a.detach().double().requires_grad_() if a.is_floating_point() else a for a in args]
    try:
        ok = torch.autograd.gradcheck(fn, tuple(args64), fast_mode=fast, raise_exception=True)
        return not ok, ""
    except Exception as exc:  # GradcheckError, or the op crashing in float64
        return True, type(exc).__name__


def _median_time(run, repeats):
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - t0)
    return result, statistics.median(times)


def _size_sweep(repeats):
    """check_op (with and without reference) against gradcheck on the same op at growing sizes."""
    g = torch.Generator().manual_seed(0)
    shapes = {"xsin": [(10,), (64,), (1024,)], "softmax": [(4, 8), (8, 64), (32, 128)],
              "layer_norm": [(4, 8), (8, 64), (32, 128)]}

    def inputs(name, shape):
        x = torch.randn(*shape, generator=g)
        if name != "layer_norm":
            return (x,)
        c = shape[-1]
        return x, 1 + 0.1 * torch.randn(c, generator=g), 0.1 * torch.randn(c, generator=g)

    lines = ["| op | input | elements | gradcheck | gradcheck fast_mode | check_op, no reference | check_op, reference | check_op / gradcheck (no reference, reference) |",
             "|---|---|---|---|---|---|---|---|"]
    for name, shape_list in shapes.items():
        fn, ref, _ = K.CORRECT[name]
        for shape in shape_list:
            args = inputs(name, shape)
            n = sum(a.numel() for a in args)
            reps = repeats if n <= 1024 else 1  # gradcheck's 2n forwards: seconds at 4k elements
            _, t_gc = _median_time(lambda: _gradcheck(fn, args, False), reps)
            _, t_gcf = _median_time(lambda: _gradcheck(fn, args, True), reps)
            _, t_co = _median_time(lambda: gradguard.check_op(fn, *args), reps)
            _, t_cor = _median_time(lambda: gradguard.check_op(fn, *args, reference=ref), reps)
            dims = "x".join(map(str, shape))
            lines.append(f"| {name} | {dims} | {n} | {t_gc * 1e3:.0f} ms | {t_gcf * 1e3:.0f} ms | {t_co * 1e3:.0f} ms | "
                         f"{t_cor * 1e3:.0f} ms | {t_co / t_gc:.2f}x, {t_cor / t_gc:.2f}x |")
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--liger", action="store_true", help="add liger-kernel's cross entropy (Triton interpreter)")
    ap.add_argument("--no-sizes", action="store_true", help="skip the table at growing input sizes")
    args = ap.parse_args()
    torch.set_num_threads(1)  # small ops: threads only add barrier waits (and noise) on a shared machine

    cases = [(n, False, *K.CORRECT[n]) for n in K.CORRECT] + [(n, True, *K.BUGGY[n]) for n in K.BUGGY]
    if args.liger:
        import torch.nn.functional as F
        from liger_kernel.transformers.functional import liger_cross_entropy

        def liger_inputs(dtype=torch.float32):
            g = torch.Generator().manual_seed(0)
            return torch.randn(8, 8, generator=g, dtype=dtype), torch.randint(0, 8, (8,), generator=g)

        cases.append(("liger_cross_entropy (0.8.5)", True, liger_cross_entropy, F.cross_entropy, liger_inputs))

    # warm-up (imports, first-call allocations)
    gradguard.check_op(K.xsin, torch.randn(4))
    torch.autograd.gradcheck(K.xsin, (torch.randn(4, dtype=torch.float64, requires_grad=True),))

    rows = []
    totals = {k: [0, 0, 0.0] for k in ("gc", "gcf", "co", "cor")}  # detected-bugs, false alarms, time
    for name, buggy, fn, ref, make in cases:
        inputs = make()
        reps = 1 if name.startswith("liger") else args.repeats
        (gc, gc_err), t_gc = _median_time(lambda: _gradcheck(fn, inputs, False), reps)
        (gcf, _), t_gcf = _median_time(lambda: _gradcheck(fn, inputs, True), reps)
        rep_ref, t_cor = _median_time(lambda: gradguard.check_op(fn, *inputs, reference=ref), reps)
        rep, t_co = _median_time(lambda: gradguard.check_op(fn, *inputs), reps)
        results = {"gc": (gc, t_gc), "gcf": (gcf, t_gcf), "co": (not rep.passed, t_co), "cor": (not rep_ref.passed, t_cor)}
        for k, (det, t) in results.items():
            totals[k][0 if buggy else 1] += int(det)
            totals[k][2] += t

        def cell(k):
            det, t = results[k]
            mark = ("**caught**" if det else "missed") if buggy else ("FALSE ALARM" if det else "ok")
            return f"{mark} ({t * 1e3:.0f} ms)"

        why = ", ".join(sorted(rep_ref.failed_checks())) if buggy else ""
        rows.append(f"| {name} | {'bug' if buggy else 'correct'} | {cell('gc')} | {cell('gcf')} | {cell('co')} | {cell('cor')} | {why} |")

    n_bug = sum(1 for c in cases if c[1])
    n_ok = len(cases) - n_bug
    print(f"torch {torch.__version__}, 1 thread, median of {args.repeats} runs (liger: 1 run)\n")
    print("| op | kind | gradcheck | gradcheck fast_mode | check_op (no reference) | check_op (reference) | check_op's failing checks (with reference) |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print()
    print("| tool | bugs caught | false alarms | total time |")
    print("|---|---|---|---|")
    labels = {"gc": "gradcheck", "gcf": "gradcheck fast_mode", "co": "check_op, no reference", "cor": "check_op, reference"}
    for k, label in labels.items():
        caught, fa, t = totals[k]
        print(f"| {label} | {caught}/{n_bug} | {fa}/{n_ok} | {t:.2f} s |")
    if not args.no_sizes:
        print(f"\nThe correct ops at growing input sizes (median of {args.repeats} runs; 1 run past 1024 elements):\n")
        print("\n".join(_size_sweep(args.repeats)))


if __name__ == "__main__":
    main()
