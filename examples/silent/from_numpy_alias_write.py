"""`torch.from_numpy` / DLPack aliases have their own version counter: writes through them are silent.

    python examples/silent/from_numpy_alias_write.py
"""

import torch

import gradguard

try:
    with gradguard.guard():
        x = torch.linspace(-1, 1, 4, requires_grad=True)
        h = x.tanh()
        y = h.sum()
        alias = torch.from_numpy(h.detach().numpy())
        with torch.no_grad():
            alias.mul_(2)  # same memory as h, separate version counter
        y.backward()
except gradguard.SilentModificationError as error:
    print(error)
