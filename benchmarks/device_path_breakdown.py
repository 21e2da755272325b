"""Where the sentinel's time goes per saved tensor, on one zoo model: PyTorch's hook mechanism, the device path's
torch ops, gradguard's Python.

    .venv/bin/python benchmarks/device_path_breakdown.py --model lstmcell_loop --rounds 15
    .venv/bin/python benchmarks/device_path_breakdown.py --model lstmcell_loop --profile   # + cProfile, op table

Interleaved in one process (configurations shuffled in every round, benchmarks/_timing.py), step time read from
this process's CPU time (a shared machine), 1 torch thread. Each configuration's cost is given as a ratio to plain
(median of per-round paired ratios) and as µs added per saved tensor (median of per-round paired differences,
divided by the saved tensors of one step). The configurations, from bare hooks up to the sentinel:

* ``hooks floor: identity``, ``... one tiny op``, ``... sample copies``: NOTE [The hooks floor] in run.py;
* ``sentinel, fingerprint off``: gradguard's hooks, records, user line and version checks, no fingerprint;
* ``sentinel, CPU path``: the same with the xxh3 sample hash (pack and unpack);
* ``sentinel, device path``: the same with the device sample copies (pack and unpack) and the end-of-pass compare.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import os
import pstats
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import _timing  # noqa: E402
import run  # noqa: E402
import zoo  # noqa: E402

import gradguard  # noqa: E402

OFF = {"fingerprint": "off", "track_writes": False}


def configs() -> dict:
    out = {"plain": contextlib.nullcontext}
    out.update(run.HOOKS_FLOOR)
    out["sentinel, fingerprint off"] = lambda: gradguard.guard(**OFF)
    out["sentinel, CPU path"] = lambda: gradguard.guard(**run.SENTINEL)
    out["sentinel, device path"] = run._on_device_path(run.SENTINEL)
    return out


def breakdown(name: str, rounds: int, inner: int | None, only: list[str] | None = None) -> tuple[dict, int]:
    w = zoo.build(name, seed=0)
    for _ in range(3):
        w.step()
    saved = run.count_per_step(w)["saved"]
    contexts = configs()
    if only:
        contexts = {k: v for k, v in contexts.items() if k == "plain" or k in only}
    if inner is None:
        t_plain = min(_timing.time_steps(w.step, contextlib.nullcontext, 1, "cpu") for _ in range(3))
        inner = max(1, round(0.05 / t_plain))
    times = _timing.interleaved(contexts, w.step, inner=inner, rounds=rounds, warmup_rounds=2, device="cpu",
                                seed=1, min_rounds=rounds)
    base = times["plain"]
    rows = {}
    for lab, ts in times.items():
        ratios = [t / b for t, b in zip(ts, base)]
        extra = [(t - b) * 1e6 / saved for t, b in zip(ts, base)]
        rows[lab] = {"ms": _timing.median(ts) * 1e3, "ratio": _timing.median(ratios),
                     "p25": _timing.quantile(ratios, 0.25), "p75": _timing.quantile(ratios, 0.75),
                     "us_per_saved": _timing.median(extra)}
    return {"rows": rows, "saved": saved, "rounds": len(base), "inner": inner}, saved


def render(name: str, result: dict) -> str:
    lines = [f"{name}: {result['saved']} saved tensors per step, {result['rounds']} rounds of {result['inner']} "
             f"step(s) per configuration, CPU-time clock, load average {_timing.load_average()}", "",
             "| configuration | ms/step | ratio to plain (p25-p75) | µs added per saved tensor |",
             "|---|---|---|---|"]
    for lab, r in result["rows"].items():
        if lab == "plain":
            lines.append(f"| plain | {r['ms']:.2f} | 1 | 0 |")
            continue
        lines.append(f"| {lab} | {r['ms']:.2f} | {r['ratio']:.2f}× ({r['p25']:.2f}-{r['p75']:.2f}) | "
                     f"{r['us_per_saved']:.1f} |")
    return "\n".join(lines) + "\n"


def profile(name: str, steps: int, top: int = 25) -> str:
    """cProfile of the device path over ``steps`` steps (gradguard's and torch's Python functions by cumulative
    time per step), and torch's profiler: the aten ops the device path adds over fingerprint off."""
    w = zoo.build(name, seed=0)
    saved = run.count_per_step(w)["saved"]
    ctx = run._on_device_path(run.SENTINEL)
    prof = cProfile.Profile()
    with ctx():
        w.step()
        prof.enable()
        for _ in range(steps):
            w.step()
        prof.disable()
    st = pstats.Stats(prof)
    rows = []
    for key, (_cc, nc, tt, ct, _callers) in st.stats.items():
        rows.append((run._func_label(key), nc / steps, tt / steps * 1e3, ct / steps * 1e3))
    total = sum(r[2] for r in rows)
    out = [f"cProfile, device path, {steps} steps ({saved} saved tensors per step): {total:.1f} ms/step of self "
           "time under the profiler (it inflates small Python calls)", "",
           "| function | calls/step | self ms/step | cum ms/step |", "|---|---|---|---|"]
    for func, calls, self_ms, cum_ms in sorted(rows, key=lambda r: -r[2])[:top]:
        out.append(f"| `{func}` | {calls:.0f} | {self_ms:.2f} | {cum_ms:.2f} |")
    out.append("")

    def ops(context) -> dict:
        with context():
            w.step()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p:
                for _ in range(3):
                    w.step()
        return {e.key: (e.count / 3, e.self_cpu_time_total / 3 / 1e3) for e in p.key_averages()}

    guarded = ops(ctx)
    off = ops(lambda: gradguard.guard(**OFF))
    out += ["torch profiler, aten ops the device path adds over `fingerprint='off'` (per step; the profiler "
            "inflates each op's time)", "", "| op | extra calls/step | extra self ms/step |", "|---|---|---|"]
    diffs = []
    for key in set(guarded) | set(off):
        c1, t1 = guarded.get(key, (0, 0.0))
        c0, t0 = off.get(key, (0, 0.0))
        if abs(c1 - c0) >= 1:
            diffs.append((key, c1 - c0, t1 - t0))
    for key, dc, dt in sorted(diffs, key=lambda d: -d[2])[:12]:
        out.append(f"| `{key}` | {dc:+.0f} | {dt:+.2f} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="lstmcell_loop", help="a zoo model (benchmarks/zoo.py)")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--inner", type=int, default=None, help="steps per timing (default: ~50 ms of plain)")
    ap.add_argument("--only", default=None,
                    help="semicolon-separated configuration labels (plain is always in), e.g. "
                         "'hooks floor: identity;sentinel, device path'")
    ap.add_argument("--profile", action="store_true", help="also cProfile the device path and count its ops")
    ap.add_argument("--profile-steps", type=int, default=10)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    _timing.CLOCK = time.process_time
    only = [s.strip() for s in args.only.split(";")] if args.only else None
    result, _saved = breakdown(args.model, args.rounds, args.inner, only)
    print(render(args.model, result), flush=True)
    if args.profile:
        print(profile(args.model, args.profile_steps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
