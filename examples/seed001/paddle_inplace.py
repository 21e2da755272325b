"""Seed 001 (PaddlePaddle hackathon article on in-place ops), run under gradguard. Run with .venv-paddle/bin/python.

The article's cases: (1) in-place on a leaf (`x[0] = 4.0`, `a.sin_()`), (2) an in-place write to a tensor
saved for backward (Paddle's version check), plus the holes Paddle does not check (set_value, PyLayer),
and (3) the memory comparison of in-place vs out-of-place ops.
"""

import os
import subprocess
import sys
import tempfile

os.environ.setdefault("HOME", tempfile.mkdtemp())  # `import paddle` writes $HOME/.cache/paddle
import paddle  # noqa: E402

import gradguard  # noqa: E402


def show(title, fn):
    print(f"\n=== {title}")
    try:
        fn()
        print("(no error)")
    except gradguard.GradguardError as e:
        print(f"gradguard: {type(e).__name__}\n{e}")


def leaf_setitem():
    with gradguard.guard():
        x = paddle.to_tensor([1.0, 2.0, 3.0], stop_gradient=False)
        x[0] = 4.0


def leaf_sin_():
    with gradguard.guard():
        a = paddle.to_tensor([1.0, 2.0, 3.0], stop_gradient=False)
        a.sin_()


def saved_then_modified():
    with gradguard.guard():
        x = paddle.to_tensor([1.0, 2.0, 3.0], stop_gradient=False)
        y = x * 1
        z = y.sin()
        y.add_(paddle.to_tensor(1.0))
        z.sum().backward()


def set_value_hole():
    with gradguard.guard():
        x = paddle.to_tensor([1.0, 2.0, 3.0], stop_gradient=False)
        y = x * 1
        z = y.sin()
        y.set_value(paddle.ones([3]))
        z.sum().backward()


def handled_correctly():
    with gradguard.guard() as g:
        x = paddle.to_tensor([1.0, 2.0, 3.0], stop_gradient=False)
        y = x * 2.0
        y.add_(paddle.to_tensor(1.0))
        y.exp_()
        (y * 3).sum().backward()
    print("gradient:", x.grad.numpy(), "findings:", g.findings)


_MEMORY = """
import paddle, sys, time
def hwm():
    for line in open('/proc/self/status'):
        if line.startswith('VmHWM'): return int(line.split()[1]) * 1024
x = paddle.rand([64, 1024, 1024])  # 256 MiB float32
x.exp_(); base = hwm(); t = time.perf_counter()
for _ in range(5):
    if sys.argv[1] == 'inplace':
        x.exp_(); x.scale_(0.5)
    else:
        x = paddle.exp(x); x = paddle.scale(x, 0.5)
print(hwm() - base, time.perf_counter() - t)
"""


def memory_comparison():
    print("\n=== memory: 5 x (exp, scale) on a 256 MiB tensor, peak RSS growth (VmHWM), separate processes")
    for kind in ("inplace", "out-of-place"):
        out = subprocess.run([sys.executable, "-c", _MEMORY, "inplace" if kind == "inplace" else "out"],
                             capture_output=True, text=True, check=True).stdout.split()
        print(f"{kind:>13}: peak +{int(out[0]) / 2**20:.0f} MiB, {float(out[1]) * 1000:.0f} ms")


if __name__ == "__main__":
    show("leaf in-place: x[0] = 4.0", leaf_setitem)
    show("leaf in-place: a.sin_()", leaf_sin_)
    show("saved tensor modified: Paddle's version check, with names and lines", saved_then_modified)
    show("set_value: a write Paddle cannot see (silent wrong gradient without gradguard)", set_value_hole)
    print("\n=== in-place handled correctly by Paddle (6*exp(2x+1))")
    handled_correctly()
    memory_comparison()
