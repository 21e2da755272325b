"""`.data` has its own version counter: writing through it hides the write from autograd.

    python examples/silent/data_write.py
"""

import torch

import gradguard

try:
    with gradguard.guard():
        x = torch.linspace(-1, 1, 4, requires_grad=True)
        h = x.exp()
        y = h.sum()
        h.data.mul_(2)
        y.backward()
except gradguard.SilentModificationError as error:
    print(error)
