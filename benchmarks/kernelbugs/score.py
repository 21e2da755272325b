"""Score check_op on the kernel-bug corpus (benchmarks/kernelbugs/cases): real, published gradient bugs.

    .venv/bin/python benchmarks/kernelbugs/score.py [--jobs 2] [--only k01,k03] [--out DIR]

Each case module holds the buggy and the fixed version of one published op (Triton kernels run on CPU under
TRITON_INTERPRET=1), a trusted reference, the inputs the op's author would test with, and its answer key
(``CASE``). Every case runs in its own process; for each version check_op runs with and without the
reference. Writes results.md and results.json next to this file (or in --out). Exits 0 whatever the figures
(thresholds are asserted by tests/slow/test_kernelbugs.py); 2 when the corpus itself is malformed.

How each column is read:
  caught      with the reference, the buggy version fails a check that is not one of the case's
              known_defects (defects both versions share, with where they are documented or how they were checked).
  root cause  the report's root cause (the first line of its verdict) is one of the key's root_cause
              checks (a key ending in "." matches any check under it).
  fixed clean with the reference, every failure on the fixed version is a known defect: a failure
              that is not is a false alarm. Known defects are real defects both versions share (the case
              says which and where they are documented or how they were checked); they are listed.
  no ref      without a reference: "caught" or "silent" on the buggy version, and whether that agrees
              with the key (a bug only a reference can show is listed with the reason).
  gradcheck   torch.autograd.gradcheck on float64 copies of the same inputs (what a kernel author would run
              instead): its verdict on each version, its time, and check_op's time over it. check_op runs first
              on each version, so any first-call cost of the op's kernels is paid by check_op, not gradcheck.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = os.path.join(HERE, "cases")
REQUIRED = ("library", "kind", "report", "fix", "code", "root_cause", "without_reference", "known_defects")


def _load(path):
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _matches(check, accepted):
    return any(check == a or (a.endswith(".") and check.startswith(a)) for a in accepted)


def _gradcheck(fn, inputs):
    """gradcheck's verdict and seconds on float64 copies of ``inputs`` (non-float arguments as given)."""
    import torch
    from torch.autograd.gradcheck import GradcheckError

    args64 = tuple(a.detach().double().requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                   for a in inputs)
    t0 = time.perf_counter()
    try:
        torch.autograd.gradcheck(fn, args64)
        verdict = "pass"
    except GradcheckError as exc:
        verdict = "fail: " + str(exc).strip().splitlines()[0][:90]
    except Exception as exc:  # the op crashing in float64 is gradcheck's verdict too
        verdict = f"raised {type(exc).__name__}"
    return verdict, round(time.perf_counter() - t0, 3)


def _warm_up():
    """First-call costs of gradguard and of autograd's Python (imports, caches) kept out of every timing."""
    import torch

    import gradguard

    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(torch.sin, (x,))
    gradguard.check_op(torch.sin, x.detach().float())


def run_case(path, gradcheck=True):
    """One case in this process: the four check_op runs (and gradcheck's two) and what the key says of them."""
    import gradguard

    _warm_up()

    case = _load(path)
    key = case.CASE
    missing = [k for k in REQUIRED if k not in key]
    if missing:
        raise SystemExit(f"{path}: CASE lacks {missing}")
    known = set(key["known_defects"])
    row = {"case": os.path.basename(path)[:-3], "doc": (case.__doc__ or "").strip().splitlines()[0],
           **{k: key[k] for k in ("library", "kind", "report", "fix", "code")}, "known_defects": list(key["known_defects"])}
    for version in ("buggy", "fixed"):
        fn = getattr(case, version)
        for with_ref in (True, False):
            t0 = time.perf_counter()
            report = gradguard.check_op(fn, *case.inputs(), reference=case.reference if with_ref else None, **getattr(case, "OPTIONS", {}))
            seconds = time.perf_counter() - t0
            failed = sorted(report.failed_checks())
            unknown = sorted(c for c in failed if not _matches(c, known))
            root = report.root_cause
            row[f"{version}{'' if with_ref else '_noref'}"] = {
                "failed": failed,
                "unexpected": unknown,
                "root_cause": root.check if root else None,
                "root_regime": root.regime if root else None,
                "seconds": round(seconds, 2),
            }
        if gradcheck:
            verdict, gc_seconds = _gradcheck(fn, case.inputs())
            row[f"{version}_gradcheck"] = {"verdict": verdict, "seconds": gc_seconds}
    b, f, n = row["buggy"], row["fixed"], row["buggy_noref"]
    row["caught"] = bool(b["unexpected"])
    row["root_ok"] = b["root_cause"] is not None and _matches(b["root_cause"], key["root_cause"])
    row["fixed_clean"] = not f["unexpected"]
    row["noref"] = "caught" if n["unexpected"] else "silent"
    row["noref_expected"] = key["without_reference"]
    row["noref_agrees"] = (row["noref"] == "caught") == (key["without_reference"] == "caught")
    row["fixed_noref_clean"] = not row["fixed_noref"]["unexpected"]
    return row


def _case_paths(only):
    names = sorted(n for n in os.listdir(CASES) if n.endswith(".py") and n[0] == "k")
    if only:
        names = [n for n in names if n.split("_")[0] in only]
    return [os.path.join(CASES, n) for n in names]


def _subprocess(path, timeout, gradcheck=True):
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, __file__, "--one", path] + ([] if gradcheck else ["--no-gradcheck"])
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        return {"case": os.path.basename(path)[:-3], "error": (proc.stderr or proc.stdout)[-2000:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _yes(flag):
    return "yes" if flag else "**no**"


def render(rows, seconds):
    ok = [r for r in rows if "error" not in r]
    n = len(rows)
    lines = [
        "# check_op on published kernel bugs: results",
        "",
        f"{n} cases, {seconds:.0f} s (`benchmarks/kernelbugs/score.py`). With the reference: bugs caught "
        f"**{sum(r['caught'] for r in ok)}/{n}**, root cause named first **{sum(r['root_ok'] for r in ok)}/{n}**, "
        f"fixed versions with no false alarm **{sum(r['fixed_clean'] for r in ok)}/{n}**. Without a reference: "
        f"{sum(r['noref'] == 'caught' for r in ok)}/{n} caught, fixed versions clean "
        f"{sum(r['fixed_noref_clean'] for r in ok)}/{n}; the key's expectation met on {sum(r['noref_agrees'] for r in ok)}/{n}.",
        "",
        "| case | library | caught | root cause (check [regime]) | fixed clean | known defects of both versions | no reference | buggy / fixed s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['case']} | | **error** | `{r['error'].strip().splitlines()[-1][:80]}` | | | | |")
            continue
        b = r["buggy"]
        root = f"`{b['root_cause']}` [{b['root_regime']}]" if b["root_cause"] else "none"
        noref = r["noref"] + ("" if r["noref_agrees"] else " (key: " + r["noref_expected"] + ")")
        if r["noref_expected"] != "caught":
            noref += f": {r['noref_expected'].removeprefix('invisible: ')}"
        false = "" if r["fixed_clean"] else " (" + ", ".join(r["fixed"]["unexpected"]) + ")"
        known = ", ".join(f"`{k}`" for k in r["known_defects"]) or "none"
        lines.append(f"| {r['case']} | {r['library']} | {_yes(r['caught'])} | {root}{'' if r['root_ok'] else ' **(key: other)**'} | {_yes(r['fixed_clean'])}{false} | {known} | {noref} | {b['seconds']} / {r['fixed']['seconds']} |")
    lines += _render_gradcheck(ok)
    lines += ["", "Sources (report, then fix) and how the code was taken:", ""]
    for r in ok:
        lines.append(f"- {r['case']}: {r['doc']} {r['report']} ; {r['fix']} ; {r['code']}.")
    return "\n".join(lines) + "\n"


def _render_gradcheck(rows):
    """The same ops under gradcheck: what a kernel author gets instead, and check_op's time over it."""
    rows = [r for r in rows if "buggy_gradcheck" in r]
    if not rows:
        return []
    caught = sum(r["buggy_gradcheck"]["verdict"] != "pass" for r in rows)
    alarms = sum(r["fixed_gradcheck"]["verdict"] != "pass" for r in rows)
    ratios = [r[v + s]["seconds"] / r[v + "_gradcheck"]["seconds"] for r in rows for v in ("buggy", "fixed")
              for s in ("", "_noref") if r[v + "_gradcheck"]["seconds"] > 0]
    within = sum(x <= 2.0 for x in ratios)
    lines = [
        "",
        "## The same ops under `torch.autograd.gradcheck`",
        "",
        f"gradcheck (float64 copies of the same inputs) fails on {caught}/{len(rows)} buggy versions and on "
        f"{alarms}/{len(rows)} fixed ones. check_op's time over gradcheck's, per run (both versions, with and without "
        f"the reference): median **{statistics.median(ratios):.2f}x**, {within}/{len(ratios)} runs within 2x, worst "
        f"{max(ratios):.2f}x.",
        "",
        "| case | gradcheck on the buggy version | gradcheck on the fixed version | gradcheck s (buggy / fixed) | check_op s, reference (buggy / fixed) | check_op s, no reference (buggy / fixed) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        gb, gf = r["buggy_gradcheck"], r["fixed_gradcheck"]
        lines.append(f"| {r['case']} | {gb['verdict']} | {gf['verdict']} | {gb['seconds']} / {gf['seconds']} | "
                     f"{r['buggy']['seconds']} / {r['fixed']['seconds']} | {r['buggy_noref']['seconds']} / {r['fixed_noref']['seconds']} |")
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", default="")
    ap.add_argument("--out", default=HERE)
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--no-gradcheck", action="store_true", help="skip the gradcheck comparison (minutes on Triton cases)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(run_case(args.one, gradcheck=not args.no_gradcheck)))
        return 0
    paths = _case_paths([s for s in args.only.split(",") if s])
    if not paths:
        print("kernelbugs: no case matched", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(lambda p: _subprocess(p, args.timeout, not args.no_gradcheck), paths))
    seconds = time.perf_counter() - t0
    text = render(rows, seconds)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.md"), "w") as fh:
        fh.write(text)
    with open(os.path.join(args.out, "results.json"), "w") as fh:
        json.dump({"seconds": round(seconds, 1), "cases": rows}, fh, indent=1)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
