"""What the sentinel's module forward hooks cost (NOTE [Silent classes without the write log],
src/gradguard/backends/torch/forward_hooks.py): zoo training steps, plain, under the sentinel as shipped, and
under the sentinel with the hooks left out; paired per-round ratios (benchmarks/_timing.py).

    .venv/bin/python benchmarks/bench_forward_hooks.py [--models tiny_mlp,lstmcell_loop] [--rounds 15]

Prints a markdown table: median step time of each configuration, the sentinel's ratio to plain with and without
the hooks, and the hooks' own share in microseconds per module call.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

import gradguard  # noqa: E402
from gradguard.backends.torch import forward_hooks as _forward_hooks  # noqa: E402
from _timing import interleaved, median, paired_ratios  # noqa: E402
from zoo import build  # noqa: E402


@contextlib.contextmanager
def _without_hooks():
    install = _forward_hooks.ForwardHooks.install
    _forward_hooks.ForwardHooks.install = lambda self: None
    try:
        with gradguard.guard(fingerprint="sample", track_writes=False):
            yield
    finally:
        _forward_hooks.ForwardHooks.install = install


def _module_calls(workload) -> int:
    count = [0]

    def tick(module, args):
        count[0] += 1

    from torch.nn.modules.module import register_module_forward_pre_hook

    handle = register_module_forward_pre_hook(tick)
    try:
        workload.step(seed=0)
    finally:
        handle.remove()
    return count[0]


def micro(rounds: int, calls: int = 2000) -> str:
    """Per module call: a small Linear called ``calls`` times, with the two hooks installed and without (the same
    interleaved rounds, so the machine's load drifts out of the difference)."""
    import time

    layer, x = torch.nn.Linear(4, 4), torch.randn(2, 4, requires_grad=True)
    hooks = _forward_hooks.ForwardHooks(lambda finding: None)

    def run(installed: bool) -> float:
        if installed:
            hooks.install()
        try:
            start = time.perf_counter()
            for _ in range(calls):
                layer(x)
            return (time.perf_counter() - start) / calls
        finally:
            if installed:
                hooks.uninstall()

    with_hooks, without = [], []
    for _ in range(rounds):
        without.append(run(False))
        with_hooks.append(run(True))
    return (f"Linear(4, 4) call: {median(without) * 1e6:.2f} us plain, {median(with_hooks) * 1e6:.2f} us with the "
            f"hooks (+{(median(with_hooks) - median(without)) * 1e6:.2f} us per module call, median of {rounds} "
            f"rounds of {calls} calls)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="tiny_mlp,lstmcell_loop,transformer_mid,cnn")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--inner", type=int, default=5)
    parser.add_argument("--micro-only", action="store_true", help="only the per-module-call measurement")
    options = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(micro(options.rounds), flush=True)
    if options.micro_only:
        return 0
    rows = ["| model | module calls per step | plain | sentinel, hooks | sentinel, no hooks | ratio with hooks | "
            "ratio without | hooks per module call |", "|---|---|---|---|---|---|---|---|"]
    for name in options.models.split(","):
        workload = build(name)
        calls = _module_calls(workload)
        configs = {"plain": contextlib.nullcontext, "hooks": lambda: gradguard.guard(fingerprint="sample", track_writes=False),
                   "no_hooks": _without_hooks}
        times = interleaved(configs, lambda: workload.step(seed=0), inner=options.inner, rounds=options.rounds,
                            warmup_rounds=2, device="cpu")
        ratios = paired_ratios(times, "plain")
        per_call = (median(times["hooks"]) - median(times["no_hooks"])) / calls * 1e6
        rows.append(f"| {name} | {calls} | {median(times['plain']) * 1e3:.2f} ms | {median(times['hooks']) * 1e3:.2f} ms | "
                    f"{median(times['no_hooks']) * 1e3:.2f} ms | {median(ratios['hooks']):.2f}x | "
                    f"{median(ratios['no_hooks']):.2f}x | {per_call:.1f} us |")
        print(rows[-1], flush=True)
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
