"""Seed 003: x * sin(x) with a hand-written backward (the forum user's op, in PyTorch).

The user's own numerical checker was wrong; check_op is the checker. Three backwards:
correct, forgetting the product rule, and squaring the upstream gradient (which gradcheck passes).
"""

import torch

from _show import show
from kernels import xcos_consistent, xsin, xsin_ref, xsin_squared_upstream, xsin_wrong

x = torch.randn(10, generator=torch.Generator().manual_seed(0))
show("correct backward: g * (sin x + x cos x)", xsin, x)
show("wrong backward: g * x cos x (product rule forgotten)", xsin_wrong, x)
show("wrong backward: g * g * (...) (gradcheck passes this)", xsin_squared_upstream, x)
show("forward and backward both of x cos x: only a reference sees it", xcos_consistent, x, reference=xsin_ref)
