"""PaddlePaddle: in-place vs out-of-place, measured on CPU, as seed 001 (the Paddle "Inplace" article) does.

gradguard's advisor records and rewrites PyTorch steps; Paddle has no dispatch-mode equivalent (see
docs/advisor.md), so for Paddle this is a *measured comparison script*: the same step written out-of-place
and with each safe in-place rewrite, measured with Paddle's own host allocator statistics
(``paddle.base.core.host_memory_stat_peak_value("Allocated", 0)``), gradients compared bit for bit, and two
unsafe in-place writes run to show what Paddle does. The figures are put into gradguard's report object.

    .venv-paddle/bin/python examples/advisor/paddle_inplace_memory.py
"""

import inspect
import statistics
import time

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F
from paddle.base import core

from gradguard.advisor._report import AdviceReport, Proposal, UnsafeInplaceOp
from gradguard.core._findings import SourceLocation

REWRITES = ("relu", "residual_add", "scale")
PADDLE_OPS = {"relu": ("F.relu", "F.relu_"), "residual_add": ("Tensor.__add__", "Tensor.add_"),
              "scale": ("Tensor.scale", "Tensor.scale_")}


class MLP(nn.Layer):
    def __init__(self, d=256, hidden=1024):
        super().__init__()
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, d)


def train_step(model, x, inplace=()):
    """One forward + backward written inline, with named intermediates (they stay alive until the end)."""
    h1 = model.fc1(x)
    a1 = F.relu_(h1) if "relu" in inplace else F.relu(h1)  # REWRITE relu
    h2 = model.fc2(a1)
    r = h2.add_(a1) if "residual_add" in inplace else h2 + a1  # REWRITE residual_add
    s = r.scale_(0.5) if "scale" in inplace else r.scale(0.5)  # REWRITE scale
    out = model.fc3(s)
    loss = out.pow(2).mean()
    loss.backward()


def step(model, x, inplace):
    """Returns (peak host bytes allocated during the step, seconds, gradients)."""
    model.clear_gradients(set_to_zero=False)
    core.host_memory_stat_reset_peak_value("Allocated", 0)
    start_bytes = core.host_memory_stat_current_value("Allocated", 0)
    t0 = time.perf_counter()
    train_step(model, x, inplace)
    seconds = time.perf_counter() - t0
    peak = core.host_memory_stat_peak_value("Allocated", 0) - start_bytes
    grads = [p.grad.numpy().copy() for p in model.parameters()]
    return peak, seconds, grads


def measure(model, x, inplace, repeats, timings):
    peaks, times, grads = [], [], None
    for _ in range(repeats):
        peak, seconds, grads = step(model, x, inplace)
        peaks.append(peak)
        times.append(seconds)
    assert len(set(peaks)) == 1, f"peak not stable across repeats: {peaks}"
    timings.extend(times)
    return peaks[0], statistics.median(times), grads


def _line(marker):
    lines, first = inspect.getsourcelines(train_step)
    for i, text in enumerate(lines):
        if marker in text:
            return SourceLocation(inspect.getsourcefile(train_step), first + i, "train_step", text.strip())
    return None


def unsafe_cases():
    """Two in-place writes Paddle refuses, run for real: a leaf that requires grad, a tensor saved for backward."""
    found = []
    leaf = paddle.randn([4, 4])
    leaf.stop_gradient = False
    try:
        leaf.scale_(2.0)
    except ValueError as error:
        found.append(UnsafeInplaceOp("raises", "scale_", None, None, None,
                                     "in-place on a leaf that requires grad: " + str(error).splitlines()[0]))
    x = paddle.randn([4, 4])
    x.stop_gradient = False
    s = F.sigmoid(x * 1.0)  # sigmoid saves its output for backward
    s.scale_(2.0)
    try:
        s.sum().backward()
    except RuntimeError as error:
        found.append(UnsafeInplaceOp("raises", "scale_", None, "sigmoid", None,
                                     "in-place on a tensor saved for backward: " + str(error).splitlines()[0]))
    return found


def main(batch=256, repeats=5):
    paddle.seed(0)
    paddle.set_device("cpu")
    model = MLP()
    x = paddle.randn([batch, 256])
    step(model, x, ())  # warm-up
    base_times, all_times = [], []
    base_peak, base_time, base_grads = measure(model, x, (), repeats, base_times)
    report = AdviceReport(
        baseline_peak=base_peak, baseline_seconds=base_time, device="cpu", runs=0,
        memory_method="Paddle host allocator peak, core.host_memory_stat_peak_value('Allocated', 0), "
                      "bytes above the step's starting level",
    )
    report.notes.append("Paddle has no dispatch-mode recorder: claimed = the overwritten tensor's bytes "
                        "(upper bound), measured = drop of the allocator peak with that rewrite alone")
    for name in REWRITES:
        peak, seconds, grads = measure(model, x, (name,), repeats, [])
        identical = all(np.array_equal(a, b) for a, b in zip(base_grads, grads))
        nbytes = batch * 1024 * 4
        p = Proposal(op=PADDLE_OPS[name][0], inplace_op=PADDLE_OPS[name][1], location=_line(f"# REWRITE {name}"), module=None,
                     operand="self", shape=(batch, 1024), dtype="float32", tensor_bytes=nbytes,
                     suggestion={"relu": "F.relu_(h1)", "residual_add": "h2.add_(a1)", "scale": "r.scale_(0.5)"}[name],
                     claimed_peak_saving=nbytes, measured_peak_saving=base_peak - peak,
                     gradients_identical=identical)
        p.verified = identical and p.measured_peak_saving > 0
        p.note = f"step time {base_time * 1e3:.2f} ms -> {seconds * 1e3:.2f} ms (median of {repeats})"
        (report.proposals if p.verified else report.unverified).append(p)
        report.runs += repeats
    peak, seconds, grads = measure(model, x, REWRITES, repeats, all_times)
    report.timing_runs = (base_times, all_times)
    report.rewritten_peak = peak
    report.rewritten_seconds = seconds
    report.measured_total_saving = base_peak - peak
    report.claimed_total_saving = sum(p.claimed_peak_saving for p in report.proposals)
    report.gradients_identical = all(np.array_equal(a, b) for a, b in zip(base_grads, grads))
    report.runs += repeats + 1
    report.unsafe_inplace = unsafe_cases()
    print(report.render())
    for p in report.proposals + report.unverified:
        print(f"  {p.op}: {p.note}")
    return report


if __name__ == "__main__":
    main()
