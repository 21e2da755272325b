"""Cost of the custom Function and tensor-hook checks: a model made of custom autograd.Functions.

The benchmark zoo (``benchmarks/run.py``) has no custom Function, so it cannot show what the Function
boundary costs. This model is the worst case for it: every layer is a Linear followed by a custom Swish
Function (``save_for_backward`` plus a tensor attribute on ctx) and a tensor hook on its output.

    python benchmarks/function_hygiene.py [--rounds 30]

Ratios are medians of per-round paired ratios to the plain step, all modes interleaved in one process.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

import gradguard


class Swish(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        ctx.mask = x > 0  # a tensor attribute: recorded and checked like a saved tensor
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return grad * (s * (1 + x * (1 - s)))


class Model(torch.nn.Module):
    def __init__(self, width: int, depth: int):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(depth))

    def forward(self, x):
        for layer in self.layers:
            h = Swish.apply(layer(x))
            h.register_hook(lambda g: g * 1.0)
            x = x + h  # a residual add: the Function's incoming gradient is shared
        return x


MODES = {
    "plain": None,
    "sentinel (fp=sample, writes=off)": dict(fingerprint="sample", track_writes=False),
    "forensic (fp=full, writes=on)": dict(fingerprint="full", track_writes=True),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depth", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Model(args.width, args.depth)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    data = torch.randn(32, args.width)

    def step():
        opt.zero_grad()
        model(data).pow(2).mean().backward()
        opt.step()

    def sample(mode, inner=5) -> float:
        start = time.perf_counter()
        if mode is None:
            for _ in range(inner):
                step()
        else:
            with gradguard.guard(**mode):
                for _ in range(inner):
                    step()
        return (time.perf_counter() - start) / inner

    for mode in MODES.values():  # warm-up
        sample(mode)
    ratios: dict[str, list[float]] = {name: [] for name in MODES if name != "plain"}
    plain_times = []
    for _ in range(args.rounds):
        order = list(MODES.items())
        random.shuffle(order)
        times = {name: sample(mode) for name, mode in order}
        plain_times.append(times["plain"])
        for name in ratios:
            ratios[name].append(times[name] / times["plain"])
    print(f"torch {torch.__version__}, gradguard from {gradguard.__file__}")
    print(f"model: {args.depth} x (Linear({args.width}) + custom Swish Function + tensor hook + residual add), "
          f"batch 32, {args.rounds} rounds")
    print(f"| mode | ratio to plain (median) | p25-p75 |")
    print(f"|---|---|---|")
    print(f"| plain | {statistics.median(plain_times) * 1e3:.2f} ms/step | |")
    for name, values in ratios.items():
        q = statistics.quantiles(values, n=4)
        print(f"| {name} | {statistics.median(values):.3f}x | {q[0]:.3f}-{q[2]:.3f} |")


if __name__ == "__main__":
    main()
