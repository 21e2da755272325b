"""Fingerprint throughput (GB/s) against memcpy and clone, and the fixed cost per small tensor.

    python benchmarks/bench_fingerprint.py [--repeats N] [--threads T] [--device cpu|cuda]

Every configuration runs once per round, rounds interleave the configurations (so background load hits
all of them alike), and the table shows the median over rounds. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from gradguard.backends.torch.fingerprint import device_digest, device_sample, fingerprint

MiB = 1 << 20


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def _time(fn, device, inner=1):
    _sync(device)
    start = time.perf_counter()
    for _ in range(inner):
        fn()
    _sync(device)
    return (time.perf_counter() - start) / inner


def throughput(device: str, repeats: int) -> list[tuple[str, dict[int, float]]]:
    sizes = [1, 16, 128]
    tensors = {s: torch.randn(s * MiB // 4, device=device) for s in sizes}
    dests = {s: torch.empty_like(t) for s, t in tensors.items()}
    configs = {
        "fingerprint full (xxh3-64 on CPU, weighted int64 sum on GPU)": lambda t, d: fingerprint(t, "full"),
        "fingerprint sample (<= 64 KiB per tensor)": lambda t, d: fingerprint(t, "sample"),
        "weighted int64 sum (the GPU digest, fingerprint full on a device)": lambda t, d: device_digest(
            t.view(torch.uint8)),
        "device sample (fingerprint sample on a device: one launch, <= 64 KiB copied)": lambda t, d: device_sample(t),
        "memcpy: `copy_` into a preallocated buffer": lambda t, d: d.copy_(t),
        "`clone()` (fresh allocation)": lambda t, d: t.clone(),
    }
    samples: dict[tuple[str, int], list[float]] = {}
    for name, fn in configs.items():  # warm up (page faults, weight tables)
        for s in sizes:
            fn(tensors[s], dests[s])
    for _ in range(repeats):
        for s in sizes:
            for name, fn in configs.items():
                inner = 8 if s == 1 else 1
                sec = _time(lambda: fn(tensors[s], dests[s]), device, inner)
                samples.setdefault((name, s), []).append(s * MiB / sec / 1e9)
    return [(name, {s: statistics.median(samples[(name, s)]) for s in sizes}) for name in configs]


def fixed_cost(device: str, repeats: int) -> list[tuple[str, float]]:
    rows = []
    shapes = [("64 B (16 float32)", (16,)), ("1 KiB (256 float32)", (256,)), ("16 KiB (64x64 float32)", (64, 64)),
              ("1 KiB transposed view", (16, 16))]
    tensors = []
    for label, shape in shapes:
        t = torch.randn(shape, device=device)
        tensors.append((label, t.t() if "transposed" in label else t))
    per = {label: ([], []) for label, _ in tensors}
    inner = 2000 if device == "cpu" else 200
    for _ in range(repeats):
        for label, t in tensors:
            per[label][0].append(_time(lambda: fingerprint(t, "full"), device, inner) * 1e6)
            per[label][1].append(_time(lambda: device_sample(t), device, inner) * 1e6)
    for label, _ in tensors:
        rows.append((label, statistics.median(per[label][0]), statistics.median(per[label][1])))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = args.device
    name = torch.cuda.get_device_name() if device == "cuda" else f"CPU, {args.threads} torch thread(s)"
    print(f"Fingerprint throughput on {name}, torch {torch.__version__}, median of {args.repeats} interleaved "
          f"rounds (GB/s, higher is better):\n")
    print("| method | 1 MiB | 16 MiB | 128 MiB |")
    print("|---|---|---|---|")
    for label, by_size in throughput(device, args.repeats):
        print(f"| {label} | " + " | ".join(f"{by_size[s]:.1f}" for s in (1, 16, 128)) + " |")
    print("\nFixed cost per small tensor (µs, median): one full fingerprint, and the device sample (on CPU "
          "tensors: the device path emulated, its dispatcher cost without the launch):\n")
    print("| tensor | µs per fingerprint | µs per device sample |")
    print("|---|---|---|")
    for label, us, sample_us in fixed_cost(device, args.repeats):
        print(f"| {label} | {us:.1f} | {sample_us:.1f} |")


if __name__ == "__main__":
    main()
