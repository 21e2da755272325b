"""Writing through a NumPy view (`t.numpy()`) bypasses PyTorch: no op, no version bump.

    python examples/silent/numpy_view_write.py
"""

import torch

import gradguard
from gradguard.backends.torch.bisect import bisect


def train_step():
    x = torch.linspace(-1, 1, 4, requires_grad=True)
    h = x.sigmoid()
    y = (h * 3).sum()
    view = h.detach().numpy()
    view *= 2  # silently rewrites what sigmoid saved for backward
    loss = y * 1.0
    loss.backward()


print("== guard(): flagged; the writer is outside torch ==")
try:
    with gradguard.guard():
        train_step()
except gradguard.SilentModificationError as error:
    print(error)

print("\n== bisect mode: pinned to an interval of user lines ==")
for finding in bisect(train_step):
    print(finding)
