"""Measurement helpers for benchmarks/run.py: interleaved paired timing, memory, machine description.

# NOTE [Why paired ratios]
# The benchmark machine is shared (other processes compete for the same cores), so absolute step times drift
# by tens of percent within a minute. Every round runs each configuration once, back to back, in a shuffled
# order; a round's ratio is config_time / plain_time *of that round*, and the report gives the median of
# those per-round ratios (and their 25th-75th percentiles). Drift slower than one round cancels out.
#
# NOTE [Why the profiler's allocation events for CPU memory]
# Peak RSS moves in pages and never goes down (glibc keeps freed memory), so it cannot resolve a few
# percent. The CPU allocator reports every tensor allocation and free to the profiler when
# ``profile_memory=True``; replaying the allocations made during the step and their frees, in time order,
# gives the exact peak of tensor bytes allocated in the step and still live, whatever allocated them (the
# model, autograd, the optimizer, or the guard's own copies). Memory that existed before the step (weights,
# Adam state) is not counted; frees of it are ignored (the allocator reports them only sometimes). It does not use a TorchDispatchMode, so it does not change what
# the guard's write log sees. Python objects (the guard's records) are not tensor memory: they are measured
# separately with tracemalloc.
"""

from __future__ import annotations

import datetime
import os
import platform
import random
import statistics
import sys
import time
import tracemalloc
from typing import Callable, Iterable

import torch

__all__ = [
    "median", "quantile", "sync", "time_steps", "interleaved", "peak_tensor_bytes", "peak_python_bytes",
    "machine_description",
]


def median(xs: Iterable[float]) -> float:
    xs = list(xs)
    return statistics.median(xs) if xs else float("nan")


def quantile(xs: Iterable[float], q: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


# The clock step times are read with: wall time, or this process's CPU time (``run.py --clock cpu``) on a machine
# shared with other jobs, where wall time measures the neighbours too (single-threaded CPU runs only: a GPU's
# work and other threads' are not in it).
CLOCK: Callable[[], float] = time.perf_counter


def time_steps(step: Callable[[], object], context: Callable[[], object], n: int, device: str) -> float:
    """Seconds per step for ``n`` steps run inside one ``context()`` (entered once, like a training loop)."""
    sync(device)
    with context():
        t0 = CLOCK()
        for _ in range(n):
            step()
        sync(device)
        t1 = CLOCK()
    return (t1 - t0) / n


def interleaved(
    configs: dict[str, Callable[[], object]],
    step: Callable[[], object],
    *,
    inner: int,
    rounds: int,
    warmup_rounds: int,
    device: str,
    seed: int = 0,
    budget_s: float | None = None,
    min_rounds: int = 5,
) -> dict[str, list[float]]:
    """Per-config lists of seconds-per-step, one entry per measured round, configs shuffled in each round.

    ``budget_s`` stops early (after at least ``min_rounds``) once that much wall time has been spent.
    """
    rng = random.Random(seed)
    names = list(configs)
    times: dict[str, list[float]] = {name: [] for name in names}
    start = time.perf_counter()
    for r in range(warmup_rounds + rounds):
        order = names[:]
        rng.shuffle(order)
        for name in order:
            t = time_steps(step, configs[name], inner, device)
            if r >= warmup_rounds:
                times[name].append(t)
        done = r + 1 - warmup_rounds
        if budget_s is not None and done >= min_rounds and time.perf_counter() - start > budget_s:
            break
    return times


def paired_ratios(times: dict[str, list[float]], baseline: str) -> dict[str, list[float]]:
    base = times[baseline]
    return {name: [t / b for t, b in zip(ts, base)] for name, ts in times.items()}


def peak_tensor_bytes(step: Callable[[], object], context: Callable[[], object], device: str) -> int:
    """Peak bytes of tensor memory allocated during one step and still live (see NOTE above)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with context():
            step()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base

    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with context():
            step()
    events = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            events.append((node.start_time_ns, node.extra_fields.alloc_size, node.extra_fields.ptr))
    events.sort()
    # Count only blocks allocated during the step (and their frees): the allocator reports frees of older
    # blocks only when it happens to know their size, which depends on earlier profiling sessions.
    live_blocks: dict[int, int] = {}
    live = peak = 0
    for _t, size, ptr in events:
        if size > 0:
            live_blocks[ptr] = size
            live += size
            peak = max(peak, live)
        elif ptr in live_blocks:
            live -= live_blocks.pop(ptr)
    return peak


def peak_python_bytes(step: Callable[[], object], context: Callable[[], object]) -> int:
    """Peak Python-heap bytes (tracemalloc) during one step above the level at its start."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        with context():
            step()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _load() -> str:
    try:
        return "%.2f %.2f %.2f" % os.getloadavg()
    except OSError:
        return "n/a"


def machine_description(device: str, threads: int) -> dict[str, str]:
    import gradguard

    desc = {
        "date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "cpu": _cpu_model(),
        "cores": str(os.cpu_count()),
        "torch threads": str(threads),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "gradguard": getattr(gradguard, "__version__", "?"),
        "device": device,
        "load average at start": _load(),
    }
    if device.startswith("cuda"):
        desc["gpu"] = torch.cuda.get_device_name()
        desc["cuda"] = str(torch.version.cuda)
    try:
        import subprocess

        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=os.path.dirname(os.path.abspath(__file__)))
        if rev.returncode == 0:
            desc["git commit"] = rev.stdout.strip()
    except Exception:
        pass
    return desc


def load_average() -> str:
    return _load()
