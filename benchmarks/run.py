"""gradguard's performance benchmark (GitHub issue #6): ``make bench`` or ``python benchmarks/run.py``.

Runs the model zoo (benchmarks/zoo.py) under plain PyTorch, anomaly mode (check_nan False and True) and every
gradguard configuration found in ``gradguard.guard``'s signature *at run time*, and writes
``benchmarks/results.md``:

* step time: median over rounds of (config step time / plain step time in the same round), configurations
  interleaved in a shuffled order each round, warm-up rounds excluded (benchmarks/_timing.py);
* peak memory: tensor bytes allocated during a step above its starting level, ratio to plain (profiler
  allocation events on CPU, ``max_memory_allocated`` on CUDA), and the Python heap (tracemalloc);
* bit-identity of parameters, gradients and buffers after one step, against plain;
* counts per step (saved tensors, aten ops, in-place ops) and the marginal cost per saved tensor / per op
  derived from the timings; a cProfile breakdown of the worst models under each gradguard configuration;
* torch.compile: graphs compiled and graph breaks under each configuration, gradients against plain compiled;
* the tables of benchmarks/bench_fingerprint.py and benchmarks/bench_check_op.py when those scripts exist
  (run as ``python <script> [--quick]``; their stdout, markdown, is included verbatim).

``--quick`` is a smoke run (about a minute); the default run aims at under 10 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import inspect
import itertools
import json
import math
import os
import pstats
import re
import subprocess
import sys
import time
import traceback
import warnings
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import _timing  # noqa: E402
import zoo  # noqa: E402

import gradguard  # noqa: E402

warnings.filterwarnings("ignore", message=".*[Aa]nomaly [Dd]etection.*")

# guard() parameters that are never varied (they pick a framework, not a cost/coverage trade-off).
NOT_VARIED = {"backend"}
NOISE = 0.05  # ratio differences below this are reported as noise
MAX_GRID = 16
CORE = ("fingerprint", "track_writes", "mode")  # varied jointly; other guard() parameters one at a time
SLOW = 20.0  # a mode whose trial step is this many times plain is timed alone (3 single steps), not interleaved
_ABBREV = {"fingerprint": "fp", "track_writes": "writes"}
_PROBE = "__gradguard_bench_probe__"


# ---------------------------------------------------------------------------------------------------------
# Configurations
# ---------------------------------------------------------------------------------------------------------
def _quoted(text: str) -> list[str]:
    return [m for m in re.findall(r"""['"]([^'"]+)['"]""", text) if m != _PROBE]


def _choices(name: str, param: inspect.Parameter) -> list:
    """The values worth benchmarking for one keyword of ``gradguard.guard``."""
    default = param.default
    annotation = param.annotation if isinstance(param.annotation, str) else repr(param.annotation)
    if isinstance(default, bool) or annotation.strip() == "bool":
        return [default, not default] if isinstance(default, bool) else [True, False]
    if isinstance(default, str) or default is None:
        values: list = []
        # 1. a Literal[...] annotation
        if "Literal" in annotation:
            values = _quoted(annotation)
        # 2. the error message for an invalid value ("must be one of 'full', 'sample', 'off'")
        if not values:
            try:
                gradguard.guard(**{name: _PROBE})
            except Exception as e:  # noqa: BLE001 - any validation error will do
                values = _quoted(str(e))
        # 3. a module constant such as _FINGERPRINT_MODES / FINGERPRINT_MODES
        if not values:
            module = sys.modules[gradguard.guard.__module__]
            for const in (f"_{name.upper()}_MODES", f"{name.upper()}_MODES", f"_{name.upper()}S"):
                if isinstance(getattr(module, const, None), (tuple, list)):
                    values = list(getattr(module, const))
                    break
        values = [v for v in dict.fromkeys(values) if v != "auto"] if values else []
        if default is not inspect.Parameter.empty:
            values = [default] + [v for v in values if v != default]
        return values or [default]
    return [default] if default is not inspect.Parameter.empty else []


def discover_guard_configs(fixed: dict | None = None) -> tuple[list[dict], list[str]]:
    """Keyword sets for ``gradguard.guard`` read from its signature now; returns (configs, notes)."""
    fixed = dict(fixed or {})
    notes = []
    sig = inspect.signature(gradguard.guard)
    grid: dict[str, list] = {}
    defaults: dict = {}
    for name, p in sig.parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.default is not p.empty:
            defaults[name] = p.default
        if name in fixed:
            grid[name] = [fixed[name]]
        elif name in NOT_VARIED:
            continue
        else:
            values = _choices(name, p)
            if values:
                grid[name] = values
    notes.append("guard" + str(sig) + ": varied " + ", ".join(f"{k} in {v}" for k, v in grid.items()))
    # The cost/coverage grid: fingerprint x track_writes (x mode, when it exists), everything else at its default;
    # every other parameter (e.g. a diagnostic switch) is varied one at a time from the defaults.
    core = [k for k in grid if k in CORE]
    base = {k: v[0] for k, v in grid.items()}
    combos = [{**base, **dict(zip(core, vals))} for vals in itertools.product(*(grid[k] for k in core))]
    for k, vs in grid.items():
        if k not in core:
            combos.extend({**base, k: v} for v in vs[1:])
    if len(combos) > MAX_GRID:
        notes.append(f"{len(combos)} configurations: kept the first {MAX_GRID}")
        combos = combos[:MAX_GRID]
    valid = []
    for kw in combos:
        try:
            gradguard.guard(**kw)
        except Exception as e:  # noqa: BLE001
            notes.append(f"skipped guard({_kwargs(kw)}): {type(e).__name__}: {e}")
            continue
        valid.append(kw)
    return valid, notes


def _kwargs(kw: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kw.items())


def _guard_defaults() -> dict:
    return {k: p.default for k, p in inspect.signature(gradguard.guard).parameters.items()
            if p.default is not p.empty}


def label(kw: dict) -> str:
    """"gg fp=full writes=on": the core parameters always, any other one only when not at its default."""
    defaults = _guard_defaults()
    parts = []
    for k, v in kw.items():
        if k not in CORE and k in defaults and defaults[k] == v:
            continue
        if isinstance(v, bool):
            v = "on" if v else "off"
        parts.append(f"{_ABBREV.get(k, k)}={v}")
    return "gg " + " ".join(parts)


def mode_contexts(guard_configs: list[dict]) -> dict[str, tuple[dict | None, object]]:
    """label -> (guard kwargs or None, context factory)."""
    out: dict[str, tuple[dict | None, object]] = {
        "plain": (None, contextlib.nullcontext),
        "anomaly nan=off": (None, lambda: torch.autograd.detect_anomaly(check_nan=False)),
        "anomaly nan=on": (None, lambda: torch.autograd.detect_anomaly(check_nan=True)),
    }
    for kw in guard_configs:
        out[label(kw)] = (kw, (lambda kw=kw: gradguard.guard(**kw)))
    return out


# ---------------------------------------------------------------------------------------------------------
# Per-model measurements
# ---------------------------------------------------------------------------------------------------------
def _state_equal(a: dict, b: dict) -> tuple[bool, float]:
    """(bit-identical, max abs difference) over parameters, gradients and buffers."""
    same, worst = True, 0.0
    for k, x in a.items():
        y = b.get(k)
        if (x is None) != (y is None):
            return False, float("inf")
        if x is None:
            continue
        if x.shape != y.shape or x.dtype != y.dtype:
            return False, float("inf")
        if not torch.equal(x, y):
            same = False
            if x.is_floating_point():
                worst = max(worst, (x.double() - y.double()).abs().max().item())
            else:
                worst = float("inf")
    return same, worst


def check_identity(name: str, modes: dict, device: str) -> dict[str, str]:
    """One seeded step per mode on a fresh model; bit-identity of the resulting state against plain."""
    out = {}
    ref = None
    for lab, (_kw, ctx) in modes.items():
        if lab.startswith("anomaly"):
            continue
        w = zoo.build(name, seed=0, device=device)
        try:
            with ctx():
                w.step(seed=1)
        except Exception as e:  # noqa: BLE001
            out[lab] = f"error: {type(e).__name__}"
            continue
        st = w.state()
        if ref is None:
            ref = st
            continue
        same, diff = _state_equal(ref, st)
        out[lab] = "yes" if same else f"NO (max diff {diff:.2g})"
    return out


class _Counter(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = 0
        self.inplace = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        schema = getattr(func, "_schema", None)
        if schema is not None and any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
            self.inplace += 1
        return func(*args, **(kwargs or {}))


def count_per_step(w: zoo.Workload) -> dict:
    saved = {"n": 0, "bytes": 0}

    def pack(t):
        saved["n"] += 1
        saved["bytes"] += t.numel() * t.element_size()
        return t.detach()

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        w.step()
    counter = _Counter()
    with counter:
        w.step()
    return {"saved": saved["n"], "saved_bytes": saved["bytes"], "ops": counter.ops, "inplace": counter.inplace}


def time_model(name: str, modes: dict, args, device: str) -> dict:
    w = zoo.build(name, seed=0, device=device)
    # calibrate: steps per sample so that a plain sample lasts about args.sample_ms
    for _ in range(3):
        w.step()
    t_plain = min(_timing.time_steps(w.step, contextlib.nullcontext, 1, device) for _ in range(3))
    inner = max(1, math.ceil(args.sample_ms / 1e3 / t_plain))
    contexts = {lab: ctx for lab, (_kw, ctx) in modes.items()}
    errors = {}
    slow: dict[str, float] = {}
    # one trial step per mode: drop modes that fail on this model, so the timing loop only times working ones,
    # and set apart diagnostic modes too slow to interleave (timed alone below)
    for lab, ctx in list(contexts.items()):
        try:
            trial = _timing.time_steps(w.step, ctx, 1, device)  # the first step of a mode pays one-time costs
            if trial > SLOW * t_plain:
                trial = min(trial, _timing.time_steps(w.step, ctx, 1, device))
        except Exception as e:  # noqa: BLE001
            errors[lab] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            del contexts[lab]
            w = zoo.build(name, seed=0, device=device)
            continue
        if lab != "plain" and trial > SLOW * t_plain:
            slow[lab] = trial
            del contexts[lab]
    t0 = time.perf_counter()
    times = _timing.interleaved(contexts, w.step, inner=inner, rounds=args.max_rounds,
                                warmup_rounds=args.warmup_rounds, device=device, seed=zlib.crc32(name.encode()),
                                budget_s=args.budget_s, min_rounds=args.min_rounds)
    elapsed = time.perf_counter() - t0
    ratios = _timing.paired_ratios({k: v for k, v in times.items() if v}, "plain")
    for lab, trial in slow.items():
        # a couple more single steps if cheap enough (<= 20 s in all), each paired with a plain step
        ratios_slow = [trial / _timing.median(times["plain"])]
        if trial < 2:
            for _ in range(2):
                tp = _timing.time_steps(w.step, contextlib.nullcontext, 1, device)
                ts = _timing.time_steps(w.step, modes[lab][1], 1, device)
                ratios_slow.append(ts / tp)
        times[lab] = []
        slow[lab] = _timing.median(ratios_slow)
    out = {"inner": inner, "rounds": len(times["plain"]), "seconds": elapsed, "errors": errors, "slow": slow,
           "plain_ms": _timing.median(times["plain"]) * 1e3,
           "plain_ms_min": min(times["plain"]) * 1e3,
           "ratio": {**{k: _timing.median(v) for k, v in ratios.items()}, **slow},
           "ratio_p25": {k: _timing.quantile(v, 0.25) for k, v in ratios.items()},
           "ratio_p75": {k: _timing.quantile(v, 0.75) for k, v in ratios.items()}}
    # memory: one more warm step per mode, then one measured step
    mem, py = {}, {}
    for lab, ctx in contexts.items():
        try:
            with ctx():
                w.step()
            mem[lab] = _timing.peak_tensor_bytes(w.step, ctx, device)
            py[lab] = _timing.peak_python_bytes(w.step, ctx)
        except Exception as e:  # noqa: BLE001
            errors.setdefault(lab, f"{type(e).__name__} during the memory pass")
    out["peak_bytes"] = mem
    out["python_peak_bytes"] = py
    out["static_bytes"] = w.static_bytes()
    out["counts"] = count_per_step(w)
    return out


# ---------------------------------------------------------------------------------------------------------
# The device path (emulated on CPU) and the sampled mode
# ---------------------------------------------------------------------------------------------------------
SENTINEL = {"fingerprint": "sample", "track_writes": False}
from gradguard.integrations.callback_core import SAMPLE_STEPS  # noqa: E402 - the callbacks' default N


@contextlib.contextmanager
def device_path():
    """Send CPU tensors down the guard's device path (NOTE [Sending CPU tensors down the device path])."""
    from gradguard.backends.torch import fingerprint as _fingerprint

    before, _fingerprint.DEVICE_PATH = _fingerprint.DEVICE_PATH, True
    try:
        yield
    finally:
        _fingerprint.DEVICE_PATH = before


def _on_device_path(kw: dict):
    @contextlib.contextmanager
    def ctx():
        with device_path(), gradguard.guard(**kw):
            yield
    return ctx


# NOTE [The hooks floor]
# What PyTorch's saved-tensor hook mechanism costs by itself, with no gradguard code in the hooks: the part of any
# saved-tensor guard's ratio that no change inside gradguard can remove. Three pairs of hooks, each installed with
# ``torch.autograd.graph.saved_tensors_hooks`` around the step exactly as the guard installs its own:
#   * identity: pack and unpack return the tensor (two Python calls per saved tensor, through torch's C++ glue);
#   * one tiny op: pack and unpack each also make one dispatched torch op that reads no bytes (``t.detach()``,
#     a new tensor object sharing ``t``'s memory): the fixed cost of one torch op called from Python;
#   * sample copies: pack and unpack each take the device path's own sample (``fingerprint.device_sample``: the
#     same one op per saved tensor, bytes included) and pack keeps it, but nothing is recorded or compared.
# The rest of the sentinel's ratio (its records, the user's line, version checks, the end-of-pass comparison) is
# gradguard's own Python work.
def _floor_identity():
    return torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)


def _floor_tiny_op():
    def pack(t):
        t.detach()
        return t

    def unpack(t):
        t.detach()
        return t

    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


def _floor_sample_copies():
    from gradguard.backends.torch.fingerprint import device_sample

    def pack(t):
        return t, device_sample(t)

    def unpack(packed):
        device_sample(packed[0])
        return packed[0]

    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


HOOKS_FLOOR = {"hooks floor: identity": _floor_identity, "hooks floor: one tiny op": _floor_tiny_op,
               "hooks floor: sample copies": _floor_sample_copies}


def syncs_per_backward(w: zoo.Workload, kw: dict) -> tuple[int, int]:
    """(host syncs in one guarded step on the device path, backward passes in it), counted by torch's profiler
    (every aten op, the guard's own included). The workload's own syncs are subtracted (a plain step counted)."""
    names = {"aten::_local_scalar_dense", "aten::is_nonzero", "aten::equal", "aten::item"}

    def count(ctx) -> int:
        with ctx():
            w.step()
            with torch.autograd.profiler.profile() as prof:
                w.step()
        return sum(1 for e in prof.function_events
                   if e.name in names and (e.cpu_parent is None or e.cpu_parent.name not in names))

    passes = [0]

    def counting():
        original = torch.autograd.backward

        def wrapper(*a, **k):
            passes[0] += 1
            return original(*a, **k)
        return wrapper, original

    guarded = count(_on_device_path(kw))
    plain = count(contextlib.nullcontext)
    wrapper, original = counting()
    torch.autograd.backward = wrapper
    try:
        w.step()
    finally:
        torch.autograd.backward = original
    return guarded - plain, passes[0]


def device_rows(models: list[str], args, device: str, n: int) -> dict:
    """Per model: step-time ratios to plain of the sentinel on the CPU path and on the device path (interleaved,
    as the main table), with ``--hooks-floor`` also of bare saved-tensor hooks (NOTE [The hooks floor]); and of the
    sampled sentinel (``sample_steps=n``, on the paths ``--sampled-paths`` names, device path by default): blocks of
    ``n`` steps, each holding exactly one checked step, alternated with plain blocks (a median of per-step ratios
    would hide the one slow step in n); plus host syncs per backward on the device path."""
    out = {}
    floor = getattr(args, "hooks_floor", False)
    sampled_paths = getattr(args, "sampled_paths", ("device",))
    for name in models:
        w = zoo.build(name, seed=0, device=device)
        for _ in range(3):
            w.step()
        t_plain = min(_timing.time_steps(w.step, contextlib.nullcontext, 1, device) for _ in range(3))
        inner = max(1, math.ceil(args.sample_ms / 1e3 / t_plain))
        contexts = {"plain": contextlib.nullcontext, "cpu path": lambda: gradguard.guard(**SENTINEL),
                    "device path": _on_device_path(SENTINEL)}
        if floor:
            contexts.update(HOOKS_FLOOR)
        times = _timing.interleaved(contexts, w.step, inner=inner, rounds=args.max_rounds,
                                    warmup_rounds=args.warmup_rounds, device=device, seed=zlib.crc32(name.encode()),
                                    budget_s=args.budget_s / 2, min_rounds=args.min_rounds)
        ratios = _timing.paired_ratios(times, "plain")
        row = {k: _timing.median(v) for k, v in ratios.items() if k != "plain"}
        row["rounds"] = len(times["plain"])
        row["p25"] = {k: _timing.quantile(v, 0.25) for k, v in ratios.items() if k != "plain"}
        row["p75"] = {k: _timing.quantile(v, 0.75) for k, v in ratios.items() if k != "plain"}
        for path in sampled_paths:
            sampled = (_on_device_path({**SENTINEL, "sample_steps": n}) if path == "device"
                       else (lambda: gradguard.guard(**SENTINEL, sample_steps=n)))
            blocks = []
            _timing.time_steps(w.step, sampled, n, device)  # warm-up: the first sampled block pays one-time costs
            deadline = time.perf_counter() + args.budget_s
            for r in range(2 if args.quick else 5):
                if r % 2 == 0:
                    tp = _timing.time_steps(w.step, contextlib.nullcontext, n, device)
                    ts = _timing.time_steps(w.step, sampled, n, device)
                else:  # the other order every other block: the block run second is not always the sampled one
                    ts = _timing.time_steps(w.step, sampled, n, device)
                    tp = _timing.time_steps(w.step, contextlib.nullcontext, n, device)
                blocks.append(ts / tp)
                if r >= 1 and time.perf_counter() > deadline:
                    break
            key = "sampled" if path == "device" else "sampled cpu"
            row[key] = _timing.median(blocks)
            row[key + "_blocks"] = blocks
        row["syncs"], row["passes"] = syncs_per_backward(w, SENTINEL)
        row["plain_ms"] = _timing.median(times["plain"]) * 1e3
        out[name] = row
        extra = "".join(f"  {k[len('hooks floor: '):]} {_fmt_ratio(row[k])}" for k in HOOKS_FLOOR if k in row)
        sampled_text = "".join(f"  sampled 1/{n} {'cpu' if k == 'sampled cpu' else 'device'} path "
                               f"{_fmt_ratio(row[k])} ({len(row[k + '_blocks'])} blocks)"
                               for k in ("sampled cpu", "sampled") if k in row)
        print(f"  {name:14s} plain {row['plain_ms']:.2f} ms, {row['rounds']} rounds: cpu path "
              f"{_fmt_ratio(row['cpu path'])}  device path {_fmt_ratio(row['device path'])}{extra}{sampled_text}  "
              f"syncs {row['syncs']} in {row['passes']} backward pass(es)", flush=True)
    return out


def render_device_rows(rows: dict, n: int) -> str:
    if not rows:
        return ""
    models = list(rows)
    lines = ["## The device path (emulated on CPU) and the sampled mode", "",
             "The sentinel (`fingerprint='sample', track_writes=False`) on the CPU path, on the device path (the ops a "
             "GPU tensor gets, run on CPU tensors: GRADGUARD_DEVICE_PATH=1; the host sync itself costs nothing on a "
             f"CPU, so these are lower bounds), and sampled (`sample_steps={n}`: blocks of {n} steps, "
             "each with one checked step, against plain blocks). Host syncs: counted by torch's profiler in one "
             "guarded step, the workload's own subtracted. The hooks floor rows (`--hooks-floor`) are bare "
             "saved-tensor hooks without gradguard (NOTE [The hooks floor] in run.py).", "",
             "| | " + " | ".join(models) + " |", "|---|" + "---|" * len(models)]
    lines.append("| plain, ms/step | " + " | ".join(f"{rows[m]['plain_ms']:.2f}" for m in models) + " |")
    titles = [(k, k) for k in HOOKS_FLOOR] + [
        ("cpu path", "sentinel, CPU path"), ("device path", "sentinel, device path"),
        ("sampled cpu", f"sentinel sampled 1/{n}, CPU path"), ("sampled", f"sentinel sampled 1/{n}, device path")]
    for key, title in titles:
        if any(key in rows[m] for m in models):
            lines.append(f"| {title} | " + " | ".join(
                _fmt_ratio(rows[m][key]) if key in rows[m] else "–" for m in models) + " |")
    lines.append("| host syncs per backward, device path | "
                 + " | ".join(f"{rows[m]['syncs'] / max(1, rows[m]['passes']):g}" for m in models) + " |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------------
# Per-call costs (public API only, no profiler)
# ---------------------------------------------------------------------------------------------------------
def per_call_costs(modes: dict, device: str, rounds: int, n: int = 200) -> dict:
    """µs added per saved tensor and per aten op, from tiny synthetic programs, paired with plain per round.

    * saved, contiguous: ``y = y * w`` n times on 16x128 float32 (each mul saves 2 tensors: 8 KiB each),
      then backward; cost / (2n).
    * saved, strided: the same, but ``y`` is one of the 4 column chunks of a 16x512 tensor (the gates of an
      LSTM cell): not contiguous, so hashing it needs a copy.
    * op, out-of-place / in-place: under ``no_grad``, n ``x.add(1)`` / ``x.add_(1)`` on 16x128 (nothing
      saved): the per-op cost of the write log's dispatch mode.
    """
    x0 = torch.randn(16, 128, device=device)
    w = torch.randn(16, 128, device=device, requires_grad=True)
    gates = torch.randn(16, 512, device=device, requires_grad=True)
    wg = torch.randn(16, 128, device=device, requires_grad=True)

    def saved_contig():
        y = x0.requires_grad_(False) * w
        for _ in range(n - 1):
            y = y * w
        y.sum().backward()

    def saved_strided():
        z = gates * 1.0
        loss = 0
        for i in range(n // 2):
            c = z[:, 128 * (i % 4): 128 * (i % 4 + 1)]
            loss = loss + (c * wg).sum()  # saves c (strided view) and wg; sum saves nothing
        loss.backward()

    x1 = torch.randn(16, 128, device=device)

    def op_out():
        with torch.no_grad():
            for _ in range(n):
                x1.add(1.0)

    def op_in():
        with torch.no_grad():
            for _ in range(n):
                x1.add_(1.0)

    programs = {"saved, contiguous 8 KiB": (saved_contig, 2 * n), "saved, strided 8 KiB": (saved_strided, n),
                "aten op, out-of-place": (op_out, n), "aten op, in-place": (op_in, n)}
    contexts = {lab: ctx for lab, (kw, ctx) in modes.items() if kw is not None or lab.startswith("plain")}
    contexts.update({lab: ctx for lab, (kw, ctx) in modes.items() if lab.startswith("anomaly")})
    out: dict[str, dict[str, float]] = {}
    for prog, (fn, count) in programs.items():
        ok = {}
        t_plain = _timing.time_steps(fn, contextlib.nullcontext, 2, device)
        for lab, ctx in contexts.items():
            try:
                if _timing.time_steps(fn, ctx, 1, device) <= SLOW * t_plain:
                    ok[lab] = ctx
            except Exception:  # noqa: BLE001
                pass
        times = _timing.interleaved(ok, fn, inner=3, rounds=rounds, warmup_rounds=1, device=device,
                                    seed=zlib.crc32(prog.encode()))
        base = times["plain"]
        out[prog] = {lab: _timing.median([(t - b) * 1e6 / count for t, b in zip(ts, base)])
                     for lab, ts in times.items() if lab != "plain"}
        out[prog]["plain"] = _timing.median(base) * 1e6 / count
    return out


# ---------------------------------------------------------------------------------------------------------
# Profiles
# ---------------------------------------------------------------------------------------------------------
_GG_DIR = os.path.dirname(os.path.abspath(gradguard.__file__)) + os.sep
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def _func_label(key) -> str:
    filename, line, func = key
    if filename == "~":
        return func  # builtins: "<built-in method ...>" / "<method 'detach' ...>"
    if filename.startswith(_GG_DIR):
        filename = "gradguard/" + filename[len(_GG_DIR):]
    elif filename.startswith(_TORCH_DIR):
        filename = "torch/" + filename[len(_TORCH_DIR):]
    else:
        filename = os.path.basename(filename)
    return f"{filename}:{line}({func})"


def profile_model(name: str, modes: dict, device: str, target_s: float, top: int, skip=()) -> dict:
    """cProfile of ``name`` under each gradguard mode: the guard's own functions and the top self-times."""
    w = zoo.build(name, seed=0, device=device)
    for _ in range(3):
        w.step()
    t_plain = min(_timing.time_steps(w.step, contextlib.nullcontext, 1, device) for _ in range(3))
    n = max(3, math.ceil(target_s / t_plain))
    out = {"steps": n}
    for lab, (kw, ctx) in modes.items():
        if (kw is None and lab != "plain") or lab in skip:
            continue
        prof = cProfile.Profile()
        try:
            with ctx():
                w.step()
                prof.enable()
                t0 = time.perf_counter()
                for _ in range(n):
                    w.step()
                _timing.sync(device)
                wall = time.perf_counter() - t0
                prof.disable()
        except Exception as e:  # noqa: BLE001
            prof.disable()
            out[lab] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}
            continue
        st = pstats.Stats(prof)
        rows = []
        for key, (cc, nc, tt, ct, _callers) in st.stats.items():
            rows.append({"func": _func_label(key), "gradguard": key[0].startswith(_GG_DIR),
                         "calls": nc / n, "self_us": tt / nc * 1e6 if nc else 0.0,
                         "cum_us": ct / nc * 1e6 if nc else 0.0, "self_ms_step": tt / n * 1e3,
                         "cum_ms_step": ct / n * 1e3})
        total = sum(r["self_ms_step"] for r in rows)
        gg = sorted((r for r in rows if r["gradguard"]), key=lambda r: -r["cum_ms_step"])
        topself = sorted(rows, key=lambda r: -r["self_ms_step"])[:top]
        out[lab] = {"step_ms_profiled": wall / n * 1e3, "total_self_ms": total, "gradguard": gg[:top],
                    "top_self": topself}
    return out


# ---------------------------------------------------------------------------------------------------------
# torch.compile
# ---------------------------------------------------------------------------------------------------------
def compile_check(names: list[str], modes: dict, backend: str, device: str) -> list[dict]:
    import torch._dynamo
    from torch._dynamo.backends.registry import lookup_backend
    from torch._dynamo.utils import counters

    inner = lookup_backend(backend)
    rows = []
    for name in names:
        eager = zoo.build(name, seed=0, device=device)
        eager.step(seed=1)
        eager_state = eager.state()
        ref_state = None
        for lab, (kw, ctx) in modes.items():
            if lab.startswith("anomaly"):
                continue
            torch._dynamo.reset()
            counters.clear()
            stats = {"graphs": 0, "nodes": 0}

            def counting(gm, example_inputs, stats=stats):
                stats["graphs"] += 1
                stats["nodes"] += sum(1 for nd in gm.graph.nodes if nd.op == "call_function")
                return inner(gm, example_inputs)

            row = {"model": name, "mode": lab, "backend": backend}
            t0 = time.perf_counter()
            try:
                w = zoo.build(name, seed=0, device=device, wrap=lambda m: torch.compile(m, backend=counting))
                with ctx():
                    w.step(seed=1)
                state = w.state()
                with ctx():
                    w.step(seed=2)
                    w.step(seed=3)
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
                rows.append(row)
                continue
            row["seconds"] = time.perf_counter() - t0
            row["graphs"] = stats["graphs"]
            row["fx_nodes"] = stats["nodes"]
            row["graph_breaks"] = sum(counters["graph_break"].values())
            row["frames_ok"] = counters["frames"].get("ok", 0)
            if lab == "plain":
                ref_state = state
            if ref_state is not None:
                row["same_as_plain_compiled"] = _state_equal(ref_state, state)[0]
            row["max_diff_vs_eager"] = _state_equal(eager_state, state)[1]
            rows.append(row)
    torch._dynamo.reset()
    return rows


# ---------------------------------------------------------------------------------------------------------
# Sub-benchmarks written by others
# ---------------------------------------------------------------------------------------------------------
def run_sub_benchmark(script: str, quick: bool, threads: int, timeout: float) -> dict:
    path = os.path.join(HERE, script)
    if not os.path.exists(path):
        return {"script": script, "status": "absent"}
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    cmd = [sys.executable, path] + (["--quick"] if quick else [])
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=os.path.dirname(HERE))
        if proc.returncode == 2 and "unrecognized arguments" in proc.stderr and quick:
            proc = subprocess.run(cmd[:-1], capture_output=True, text=True, timeout=timeout, env=env,
                                  cwd=os.path.dirname(HERE))
    except subprocess.TimeoutExpired:
        return {"script": script, "status": f"timed out after {timeout:.0f} s", "cmd": " ".join(cmd)}
    return {"script": script, "status": "ok" if proc.returncode == 0 else f"exit {proc.returncode}",
            "stdout": proc.stdout, "stderr": proc.stderr[-3000:], "seconds": time.perf_counter() - t0,
            "cmd": "python " + os.path.relpath(path, os.path.dirname(HERE)) + (" --quick" if quick else "")}


# ---------------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------------
def _fmt_ratio(x: float | None) -> str:
    return "–" if x is None or x != x else f"{x:.2f}×"


def _mib(b: float) -> str:
    return f"{b / 2**20:.1f} MiB" if b >= 2**20 else f"{b / 2**10:.0f} KiB"


def _find(guard_configs: list[dict], **want) -> str | None:
    """Label of the config whose kwargs match ``want`` (other parameters at their first/default value)."""
    if not guard_configs:
        return None
    base = guard_configs[0]
    for kw in guard_configs:
        if all(kw.get(k) == v for k, v in want.items()) and all(
            kw.get(k) == base.get(k) for k in kw if k not in want
        ):
            return label(kw)
    return None


def marginal_costs(res: dict, guard_configs: list[dict]) -> dict[str, float | None]:
    """µs per saved tensor / per op, from the median ratios (difference of two configs × plain step time)."""
    r, plain_us, c = res["ratio"], res["plain_ms"] * 1e3, res["counts"]

    def diff(a, b, per):
        if a is None or b is None or a not in r or b not in r or not per:
            return None
        if abs(r[a] - r[b]) < NOISE:
            return 0.0  # rendered as "≈0": within the noise of the ratios
        return (r[a] - r[b]) * plain_us / per

    off_nw = _find(guard_configs, fingerprint="off", track_writes=False)
    full_nw = _find(guard_configs, fingerprint="full", track_writes=False)
    sample_nw = _find(guard_configs, fingerprint="sample", track_writes=False)
    off_w = _find(guard_configs, fingerprint="off", track_writes=True)
    full_w = _find(guard_configs, fingerprint="full", track_writes=True)
    return {
        "hooks_per_saved": diff(off_nw, "plain", c["saved"]),
        "full_fp_per_saved": diff(full_nw, off_nw, c["saved"]),
        "sample_fp_per_saved": diff(sample_nw, off_nw, c["saved"]),
        "writes_per_op": diff(off_w, off_nw, c["ops"]),
        "writes_per_op_with_full_fp": diff(full_w, full_nw, c["ops"]),
        "anomaly_per_op": diff("anomaly nan=off", "plain", c["ops"]),
    }


def render(report: dict) -> str:
    md = []
    add = md.append
    machine = report["machine"]
    models = [m for m in report["models"]]
    res = report["results"]
    labels = report["labels"]
    gcfgs = report["guard_configs"]
    add("# gradguard benchmark results\n")
    add(f"Generated by `{report['command']}` in {report['elapsed_s'] / 60:.1f} min"
        + (" (**--quick: few rounds, indicative only**)" if report["quick"] else "") + ".\n")
    add("| machine | |\n|---|---|")
    for k, v in machine.items():
        add(f"| {k} | {v} |")
    add("")
    add("Method: each model runs one full training step (zero_grad, forward, backward, `Adam.step()`) on fixed "
        "data. All modes run in one process, interleaved in a shuffled order in every round; a sample is "
        "`inner` consecutive steps inside one `with` block (entered once, like a training loop). Ratios are "
        "**medians of per-round paired ratios** to plain (config time / plain time of the same round); "
        "warm-up rounds are excluded. Treat differences under ~5% as noise on a shared machine.\n")
    add("## Step time, ratio to plain (median of per-round paired ratios)\n")
    add("| mode | " + " | ".join(models) + " | slower than anomaly nan=off on |")
    add("|---|" + "---|" * (len(models) + 1))
    add("| plain, ms/step | " + " | ".join(f"{res[m]['plain_ms']:.2f}" for m in models) + " | |")
    for lab in labels:
        if lab == "plain":
            continue
        cells, slower = [], []
        for m in models:
            r = res[m]["ratio"].get(lab)
            slow_mark = "†" if lab in res[m].get("slow", {}) else ""
            cells.append("error" if lab in res[m]["errors"] else _fmt_ratio(r) + slow_mark)
            a = res[m]["ratio"].get("anomaly nan=off")
            if lab.startswith("gg") and r is not None and a is not None and r >= a:
                slower.append(m)
        tail = "" if not lab.startswith("gg") else (", ".join(slower) if slower else "none")
        add(f"| {lab} | " + " | ".join(cells) + f" | {tail} |")
    add("")
    if any(res[m].get("slow") for m in models):
        add(f"† over {SLOW:.0f}× plain in a trial step: a diagnostic mode, timed alone (median of up to 3 single "
            "steps, each paired with a plain step) instead of interleaved, and left out of the memory, "
            "identity and profile passes.\n")
    add("Rounds measured (steps per sample): " + ", ".join(
        f"{m} {res[m]['rounds']} ({res[m]['inner']})" for m in models) + ".\n")
    add("<details><summary>25th–75th percentiles of the per-round ratios</summary>\n")
    add("| mode | " + " | ".join(models) + " |")
    add("|---|" + "---|" * len(models))
    for lab in labels:
        if lab == "plain":
            continue
        add(f"| {lab} | " + " | ".join(
            f"{res[m]['ratio_p25'].get(lab, float('nan')):.2f}–{res[m]['ratio_p75'].get(lab, float('nan')):.2f}"
            for m in models) + " |")
    add("\n</details>\n")
    errs = [(m, lab, e) for m in models for lab, e in res[m]["errors"].items()]
    if errs:
        add("Errors:\n")
        for m, lab, e in errs:
            add(f"- {m}, {lab}: `{e}`")
        add("")

    if report.get("device_rows"):
        add(report["device_rows"])
    add("## Peak memory\n")
    add("Peak of the tensor bytes allocated during one step and still live (activations, saved tensors, "
        "gradients, temporaries, and any copy the guard makes), as a ratio to plain. CPU: the allocator's "
        "allocation/free events recorded by `torch.profiler` (`profile_memory=True`), replayed in time order "
        "(blocks allocated before the step, such as weights and Adam state, are not counted): exact to the "
        "byte, and no dispatch mode involved. Peak RSS is not used: it moves in pages and never goes down. "
        "The guard keeps no tensor of its own (it stores `detach()` aliases), so ~1.00× is expected; "
        "anything above comes from transient copies (e.g. `contiguous()` before hashing a strided tensor). "
        "The Python heap rows (tracemalloc, peak during a step above its start) are where the "
        "guard's per-saved-tensor records live.\n")
    add("| mode | " + " | ".join(models) + " |")
    add("|---|" + "---|" * len(models))
    add("| plain: peak tensor bytes in a step | " + " | ".join(
        _mib(res[m]["peak_bytes"].get("plain", 0)) for m in models) + " |")
    add("| plain: held between steps (params, grads, Adam state, data) | " + " | ".join(
        _mib(res[m]["static_bytes"]) for m in models) + " |")
    for lab in labels:
        if lab == "plain":
            continue
        cells = []
        for m in models:
            b, p = res[m]["peak_bytes"].get(lab), res[m]["peak_bytes"].get("plain")
            cells.append("–" if b is None or not p else f"{b / p:.3f}×")
        add(f"| {lab} | " + " | ".join(cells) + " |")
    add("| **Python heap peak in a step** | " + " | ".join(" " for _ in models) + " |")
    for lab in labels:
        add(f"| {lab} | " + " | ".join(
            _mib(res[m]["python_peak_bytes"][lab]) if lab in res[m]["python_peak_bytes"] else "–"
            for m in models) + " |")
    add("")

    add("## Bit-identity after one step (parameters, gradients, buffers vs plain)\n")
    glabs = [lab for lab in labels if lab.startswith("gg")]
    add("| model | " + " | ".join(glabs) + " |")
    add("|---|" + "---|" * len(glabs))
    for m in models:
        ident = report["identity"].get(m, {})
        add(f"| {m} | " + " | ".join(ident.get(lab, "–") for lab in glabs) + " |")
    add("")

    add("## What a step contains, and the marginal cost of each mechanism\n")
    add("Counts per step from a counting `saved_tensors_hooks` pair and a counting `TorchDispatchMode` "
        "(separate passes, not timed). Marginal costs are differences of the median ratios above × the plain "
        "step time, divided by the count: e.g. hooks = (fp=off,writes=off − plain) / saved tensors; "
        "write log = (fp=off,writes=on − fp=off,writes=off) / aten ops. They are noisy where the difference "
        "is within the noise (large models; shown as ≈0 when the two ratios differ by < 0.05): read them on the "
        "small models. They scale with the machine's load: compare them with the plain step time.\n")
    add("| model | saved tensors | saved bytes | aten ops | in-place ops | hooks µs/saved | full fp µs/saved "
        "| sample fp µs/saved | write log µs/op | anomaly (nan=off) µs/op |")
    add("|---|---|---|---|---|---|---|---|---|---|")
    for m in models:
        c = res[m]["counts"]
        mc = marginal_costs(res[m], gcfgs)

        def f(x):
            return "–" if x is None else "≈0" if x == 0.0 else f"{x:.1f}"

        add(f"| {m} | {c['saved']} | {_mib(c['saved_bytes'])} | {c['ops']} | {c['inplace']} | "
            f"{f(mc['hooks_per_saved'])} | {f(mc['full_fp_per_saved'])} | {f(mc['sample_fp_per_saved'])} | "
            f"{f(mc['writes_per_op'])} | {f(mc['anomaly_per_op'])} |")
    add("")

    if report.get("per_call"):
        pc = report["per_call"]
        cols = [lab for lab in labels if lab != "plain"]
        add("## Cost per saved tensor and per op (synthetic programs)\n")
        add("µs added per saved tensor (pack + unpack) or per aten op, against plain, measured through the "
            "public API only: `y = y * w` chains on 16×128 float32 (each mul saves two 8 KiB tensors) then "
            "backward; the same with `y` a column chunk of a 16×512 tensor (strided, like an LSTM gate); and "
            "`x.add(1)` / `x.add_(1)` under `no_grad` (nothing saved: the write log's per-op cost alone). "
            "Medians of per-round paired differences. The saved-tensor rows include the per-op cost of the "
            "ops that save them (about 2 aten ops per saved tensor).\n")
        add("| program | plain µs/unit | " + " | ".join(cols) + " |")
        add("|---|---|" + "---|" * len(cols))
        for prog, d in pc.items():
            add(f"| {prog} | {d.get('plain', float('nan')):.1f} | " + " | ".join(
                "–" if lab not in d else f"+{d[lab]:.1f}" if d[lab] >= 0.05 else f"{d[lab]:.1f}"
                for lab in cols) + " |")
        add("")

    if report.get("profiles"):
        add("## Profile: where the time goes\n")
        add("cProfile over several steps per configuration (cProfile adds ~0.1–0.5 µs per Python call, so "
            "absolute µs are inflated; the ranking and the counts are what to read). `calls/step` is per "
            "training step; `cum µs/call` includes callees, `self µs/call` does not.\n")
        for m, prof in report["profiles"].items():
            c = res[m]["counts"] if m in res else {}
            add(f"### {m} ({prof['steps']} steps profiled; per step: {c.get('saved', '?')} saved tensors, "
                f"{c.get('ops', '?')} aten ops, {c.get('inplace', '?')} in-place)\n")
            for lab, p in prof.items():
                if lab == "steps":
                    continue
                if "error" in p:
                    add(f"**{lab}**: error `{p['error']}`\n")
                    continue
                add(f"**{lab}**: {p['step_ms_profiled']:.2f} ms/step under cProfile\n")
                if p["gradguard"]:
                    add("| gradguard function | calls/step | cum µs/call | self µs/call | cum ms/step |")
                    add("|---|---|---|---|---|")
                    for r in p["gradguard"]:
                        add(f"| `{r['func']}` | {r['calls']:.0f} | {r['cum_us']:.1f} | {r['self_us']:.1f} | "
                            f"{r['cum_ms_step']:.2f} |")
                    add("")
                add("<details><summary>top self time (all functions)</summary>\n")
                add("| function | calls/step | self µs/call | self ms/step | share |")
                add("|---|---|---|---|---|")
                for r in p["top_self"]:
                    add(f"| `{r['func']}` | {r['calls']:.0f} | {r['self_us']:.1f} | {r['self_ms_step']:.2f} | "
                        f"{100 * r['self_ms_step'] / p['total_self_ms']:.0f}% |")
                add("\n</details>\n")

    if report.get("compile"):
        add("## torch.compile\n")
        add("Each row: `torch._dynamo.reset()`, a fresh model wrapped in `torch.compile(backend=<counting "
            "wrapper around the backend>)`, three seeded steps inside the mode. `graphs` = graphs handed to "
            "the backend (0 = Dynamo fell back to eager: a TorchDispatchMode is active); state after the "
            "first step compared with plain compiled (bit-identical?) and with plain eager (max abs diff).\n")
        add("| model | mode | backend | graphs | FX ops | graph breaks | identical to plain compiled | "
            "max diff vs eager | seconds |")
        add("|---|---|---|---|---|---|---|---|---|")
        for r in report["compile"]:
            if "error" in r:
                add(f"| {r['model']} | {r['mode']} | {r['backend']} | error: `{r['error']}` | | | | | |")
                continue
            same = r.get("same_as_plain_compiled")
            add(f"| {r['model']} | {r['mode']} | {r['backend']} | {r['graphs']} | {r['fx_nodes']} | "
                f"{r['graph_breaks']} | {'–' if same is None else ('yes' if same else 'NO')} | "
                f"{r['max_diff_vs_eager']:.2g} | {r['seconds']:.1f} |")
        add("")

    for sub in report.get("sub_benchmarks", []):
        title = {"bench_fingerprint.py": "Fingerprint throughput and per-tensor cost",
                 "bench_check_op.py": "check_op vs torch.autograd.gradcheck"}.get(sub["script"], sub["script"])
        add(f"## {title}\n")
        if sub["status"] == "absent":
            add(f"`benchmarks/{sub['script']}` does not exist yet.\n")
            continue
        add(f"From `{sub.get('cmd', sub['script'])}` ({sub['status']}"
            + (f", {sub['seconds']:.0f} s" if "seconds" in sub else "") + "):\n")
        if sub.get("stdout"):
            add(sub["stdout"].rstrip() + "\n")
        if sub["status"] != "ok" and sub.get("stderr"):
            add("```\n" + sub["stderr"].rstrip() + "\n```\n")

    add("## Configurations\n")
    for note in report["notes"]:
        add(f"- {note}")
    add("- labels: `fp` = `fingerprint=`, `writes` = `track_writes=`; anomaly = "
        "`torch.autograd.detect_anomaly(check_nan=...)`")
    for m in models:
        add(f"- `{m}`: {zoo.DESCRIPTIONS[m]}")
    add("")
    return "\n".join(md)


# ---------------------------------------------------------------------------------------------------------
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="few rounds, for a smoke test (~1-2 min)")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="read step times from wall time (default) or this process's CPU time (a shared machine; "
                         "CPU runs with --threads 1 only)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--models", default=",".join(zoo.MODELS), help="comma-separated subset of the zoo")
    ap.add_argument("--out", default=os.path.join(HERE, "results.md"))
    ap.add_argument("--json", default=None, help="also write the raw results as JSON here")
    ap.add_argument("--guard-configs", default=None,
                    help='JSON list of guard kwargs, instead of discovering them, e.g. \'[{"fingerprint": "off"}]\'')
    ap.add_argument("--fixed", action="append", default=[], metavar="KEY=VALUE",
                    help="pin a guard keyword (JSON value) instead of varying it")
    ap.add_argument("--budget-s", type=float, default=None, help="timing wall-time budget per model")
    ap.add_argument("--max-rounds", type=int, default=None)
    ap.add_argument("--profile-models", default=None,
                    help="models to cProfile (default: the two with the worst gradguard ratio)")
    ap.add_argument("--compile-models", default=None, help="models for the torch.compile check")
    ap.add_argument("--compile-backend", default="aot_eager", help="aot_eager (default), inductor, eager")
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--no-sub", action="store_true", help="skip bench_fingerprint.py / bench_check_op.py")
    ap.add_argument("--device-models", default=None,
                    help="models for the device-path and sampled rows (default: all); 'none' skips them")
    ap.add_argument("--sample-steps", type=int, default=SAMPLE_STEPS,
                    help=f"N of the sampled rows (default: the callbacks' default, {SAMPLE_STEPS})")
    ap.add_argument("--device-rows-only", action="store_true",
                    help="only the device-path and sampled rows, printed as markdown (nothing written)")
    ap.add_argument("--hooks-floor", action="store_true",
                    help="add bare saved-tensor hooks (identity, one tiny op, the device sample copies) to the "
                         "device-path rows: what PyTorch's hook mechanism costs without gradguard")
    ap.add_argument("--sampled-paths", default="device",
                    help="paths of the sampled rows: 'device' (default), 'cpu', 'cpu,device' or 'none'")
    args = ap.parse_args(argv)
    args.sampled_paths = tuple(p.strip() for p in args.sampled_paths.split(",") if p.strip() and p.strip() != "none")
    if any(p not in ("cpu", "device") for p in args.sampled_paths):
        ap.error("--sampled-paths takes cpu, device, both (comma-separated) or none")
    if args.clock == "cpu" and (args.device != "cpu" or args.threads != 1):
        ap.error("--clock cpu measures single-threaded CPU runs only (--device cpu --threads 1)")
    if args.quick:
        args.warmup_rounds, args.min_rounds = 1, 3
        args.max_rounds = args.max_rounds or 3
        args.budget_s = args.budget_s if args.budget_s is not None else 4.0
        args.sample_ms = 10.0
        args.profile_s = 0.05
    else:
        args.warmup_rounds, args.min_rounds = 2, 7
        args.max_rounds = args.max_rounds or 61
        args.budget_s = args.budget_s if args.budget_s is not None else 40.0
        args.sample_ms = 30.0
        args.profile_s = 0.4
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    torch.set_num_threads(args.threads)
    if args.clock == "cpu":
        _timing.CLOCK = time.process_time
    device = args.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("CUDA is not available", file=sys.stderr)
        return 2
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    device_models = models if args.device_models is None else [
        m.strip() for m in args.device_models.split(",") if m.strip() and m.strip() != "none"]
    if args.device_rows_only:
        print(render_device_rows(device_rows(device_models, args, device, args.sample_steps), args.sample_steps))
        return 0
    fixed = {}
    for item in args.fixed:
        k, _, v = item.partition("=")
        try:
            fixed[k] = json.loads(v)
        except json.JSONDecodeError:
            fixed[k] = v
    if args.guard_configs:
        guard_configs, notes = json.loads(args.guard_configs), ["guard configurations given on the command line"]
    else:
        guard_configs, notes = discover_guard_configs(fixed)
    modes = mode_contexts(guard_configs)
    labels = list(modes)
    machine = _timing.machine_description(device, args.threads)
    print(f"gradguard bench: {len(models)} models x {len(modes)} modes on {device} "
          f"({machine['cpu']}, {args.threads} thread(s)); modes: {', '.join(labels)}", flush=True)

    results, identity = {}, {}
    for m in models:
        t0 = time.perf_counter()
        results[m] = time_model(m, modes, args, device)
        identity[m] = check_identity(m, {k: v for k, v in modes.items() if k not in results[m]["slow"]}, device)
        r = results[m]
        print(f"  {m:14s} plain {r['plain_ms']:8.2f} ms  rounds {r['rounds']:3d}  "
              + "  ".join(f"{lab}: {_fmt_ratio(v)}" for lab, v in r["ratio"].items() if lab != "plain")
              + f"  [{time.perf_counter() - t0:.0f} s]", flush=True)

    t0 = time.perf_counter()
    device = args.device
    device_table = render_device_rows(device_rows(device_models, args, device, args.sample_steps), args.sample_steps)
    print(f"  device-path and sampled rows [{time.perf_counter() - t0:.0f} s]", flush=True)

    t0 = time.perf_counter()
    per_call = per_call_costs(modes, device, rounds=5 if args.quick else 15)
    print(f"  per-call costs [{time.perf_counter() - t0:.0f} s]", flush=True)

    profiles = {}
    if not args.no_profile:
        if args.profile_models:
            pmodels = [p.strip() for p in args.profile_models.split(",") if p.strip()]
        else:
            defaults = _guard_defaults()
            core_labels = {label(kw) for kw in guard_configs
                           if all(k in CORE or defaults.get(k) == v for k, v in kw.items())}
            worst = sorted(models, key=lambda m: -max(
                [v for k, v in results[m]["ratio"].items() if k in core_labels] or [0]))
            pmodels = worst[:2]
        for m in pmodels:
            t0 = time.perf_counter()
            profiles[m] = profile_model(m, modes, device, args.profile_s, top=12, skip=results[m]["slow"])
            print(f"  profiled {m} [{time.perf_counter() - t0:.0f} s]", flush=True)

    compile_rows = []
    if not args.no_compile:
        cmodels = ([p.strip() for p in args.compile_models.split(",")] if args.compile_models
                   else (["tiny_mlp"] if args.quick else ["tiny_mlp", "cnn"]))
        cmodels = [c for c in cmodels if c]
        t0 = time.perf_counter()
        try:
            compile_rows = compile_check(cmodels, modes, args.compile_backend, device)
        except Exception as e:  # noqa: BLE001
            compile_rows = [{"model": ",".join(cmodels), "mode": "all", "backend": args.compile_backend,
                             "error": f"{type(e).__name__}: {e}"}]
            traceback.print_exc()
        print(f"  torch.compile check [{time.perf_counter() - t0:.0f} s]", flush=True)

    subs = []
    if not args.no_sub:
        for script in ("bench_fingerprint.py", "bench_check_op.py"):
            subs.append(run_sub_benchmark(script, args.quick, args.threads, timeout=120 if args.quick else 300))
            print(f"  {script}: {subs[-1]['status']}", flush=True)

    machine["load average at end"] = _timing.load_average()
    cmd = "python benchmarks/run.py" + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip()
    report = {"command": cmd.strip(), "quick": args.quick, "machine": machine, "models": models, "labels": labels,
              "guard_configs": guard_configs, "notes": notes, "results": results, "identity": identity,
              "profiles": profiles, "per_call": per_call, "compile": compile_rows, "sub_benchmarks": subs,
              "elapsed_s": time.perf_counter() - t_start}
    report["device_rows"] = device_table
    text = render(report)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=str)
    print(f"wrote {args.out} in {report['elapsed_s'] / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
