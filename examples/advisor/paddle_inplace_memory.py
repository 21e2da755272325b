"""PaddlePaddle: which out-of-place ops of a training step could be in-place, and what that saves (measured).

The memory question of seed 001 (Paddle's "Inplace" article: in-place ops save memory, and can break
gradients), answered by gradguard's advisor instead of by hand: ``gradguard.advise(step, ...)`` records the
MLP step below at Paddle's Python entry points, rejects the calls that must stay out-of-place (and says which
rule and which line), verifies each remaining rewrite by re-running the step with it (gradients, parameters
and the loss bit-identical) and measures what each frees at the step's peak with Paddle's own host allocator
statistics (``paddle.base.core.host_memory_stat_peak_value("Allocated", 0)``). A second step makes an in-place
write on a tensor sigmoid saved for backward; the advisor lists it as unsafe.

    .venv-paddle/bin/python examples/advisor/paddle_inplace_memory.py
"""

import paddle
import paddle.nn as nn
import paddle.nn.functional as F

import gradguard


class MLP(nn.Layer):
    def __init__(self, d=256, hidden=1024):
        super().__init__()
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, d)


def train_step(model, opt, x):
    """One training step written inline, with named intermediates (they stay alive until the end)."""
    h1 = model.fc1(x)
    a1 = F.relu(h1)  # h1 is dead after this line: relu_ is safe
    h2 = model.fc2(a1)
    r = h2 + a1  # h2 is dead; a1 is not (relu saved it for backward)
    s = r.scale(0.5)  # r is dead
    out = model.fc3(s)
    g = F.sigmoid(out)  # out is not dead: the product below reads it
    y = out * g  # sigmoid saved g, and the product saves both operands
    loss = y.pow(2).mean()
    loss.backward()
    opt.step()
    opt.clear_grad()
    return loss


def unsafe_step(model, opt, x):
    """An in-place write on a tensor that sigmoid saved for backward (Paddle raises at backward)."""
    s = F.sigmoid(model.fc1(x))
    s.scale_(2.0)
    s.mean().backward()
    opt.clear_grad()


def main(batch=256, repeats=3):
    paddle.seed(0)
    paddle.set_device("cpu")
    model = MLP()
    opt = paddle.optimizer.Adam(learning_rate=1e-3, parameters=model.parameters())
    x = paddle.randn([batch, 256])
    report = gradguard.advise(train_step, model, opt, x, repeats=repeats)
    print(report)
    print()
    unsafe = gradguard.advise(unsafe_step, model, opt, x, repeats=1)
    print(unsafe)
    return report, unsafe


if __name__ == "__main__":
    main()
