"""Python memory the guard keeps per saved tensor while a graph is alive (issue 17: records within 0.2 KiB).

    python benchmarks/bench_records.py [--repeats N] [--links N]

Each program builds a forward graph and keeps it alive. The table gives the Python heap (tracemalloc) held
after the forward under a configuration, less the same forward under plain PyTorch, divided by the number of
tensors the forward saved for backward (counted by a pair of pass-through saved-tensor hooks). Two graph
lengths are measured and their difference is used, so what one forward allocates once (a module's first
call, the guard's tables) is not counted. Tensor bytes are not Python memory and are not counted: the guard
keeps ``detach()`` aliases, never copies (``benchmarks/run.py`` checks peak tensor memory). Median of
``--repeats`` runs; the figures are allocation counts, so repeats agree.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import tracemalloc

import torch
from torch import nn

import gradguard

CONFIGS = {
    "sentinel (sample fingerprint, writes off)": dict(fingerprint="sample", track_writes=False),
    "sentinel, fingerprint off": dict(fingerprint="off", track_writes=False),
    "forensic (`guard()`: full fingerprint, writes on)": dict(),
}


def _operand(links: int):
    """``y = y * w`` with a constant ``w``: every link saves ``w`` (one storage saved many times)."""
    x = torch.randn(16, 128, requires_grad=True)
    w = torch.randn(16, 128)

    def forward():
        y = x
        for _ in range(links):
            y = y * w
        return y

    return forward


def _activations(links: int):
    """``y = tanh(y @ w)``: each link saves its input, the weight and its own result (new storages)."""
    x = torch.randn(8, 64, requires_grad=True)
    w = torch.randn(64, 64, requires_grad=True)

    def forward():
        y = x
        for _ in range(links):
            y = torch.tanh(y @ w)
        return y

    return forward


def _lstmcell(links: int):
    """An ``nn.LSTMCell`` unrolled ``links`` steps (the zoo's LSTMCell loop: strided gate chunks)."""
    torch.manual_seed(0)
    cell = nn.LSTMCell(32, 64)
    xs = torch.randn(links, 4, 32)

    def forward():
        h = c = torch.zeros(4, 64)
        for step in range(links):
            h, c = cell(xs[step], (h, c))
        return h

    return forward


def _mlp(links: int):
    """``links`` Linear+ReLU layers (parameters, activations and ReLU results saved)."""
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(links) for m in (nn.Linear(32, 32), nn.ReLU())])
    x = torch.randn(8, 32)

    def forward():
        return model(x)

    return forward


PROGRAMS = {"y = y * w (constant w)": _operand, "y = tanh(y @ w)": _activations,
            "nn.LSTMCell loop": _lstmcell, "Linear+ReLU stack": _mlp}


def _saved_count(forward) -> int:
    count = 0

    def pack(t):
        nonlocal count
        count += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward()
    del out
    return count


def _held(forward, context) -> int:
    """Python heap held after ``forward()`` under ``context``, with the graph alive."""
    gc.collect()
    with context():
        forward()  # warm-up: first-call caches (modules, the guard's tables) are not per saved tensor
        gc.collect()
        tracemalloc.start()
        try:
            out = forward()
            held = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        del out
    return held


def per_saved_tensor(make, context, links: tuple[int, int]) -> float:
    short, long = (make(n) for n in links)
    saved = _saved_count(long) - _saved_count(short)
    plain = _held(long, contextlib.nullcontext) - _held(short, contextlib.nullcontext)
    guarded = _held(long, context) - _held(short, context)
    return (guarded - plain) / saved


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--links", type=int, default=400, help="length of the longer graph (the shorter: a quarter)")
    args = parser.parse_args(argv)
    links = (args.links // 4, args.links)
    torch.set_num_threads(1)
    print(f"Python memory held per saved tensor (bytes; graphs of {links[0]} and {links[1]} links, "
          f"median of {args.repeats}), torch {torch.__version__}\n")
    print("| program | " + " | ".join(CONFIGS) + " |")
    print("|---" * (len(CONFIGS) + 1) + "|")
    for name, make in PROGRAMS.items():
        cells = []
        for kwargs in CONFIGS.values():
            values = [per_saved_tensor(make, lambda kw=kwargs: gradguard.guard(**kw), links)
                      for _ in range(args.repeats)]
            cells.append(f"{statistics.median(values):.0f}")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
