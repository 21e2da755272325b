"""Softmax with a hand-written backward: correct, missing the Jacobian's cross terms, and a naive forward that overflows."""

import torch

from _show import show
from kernels import softmax, softmax_naive, softmax_no_cross_term, softmax_ref

x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
show("softmax: correct", softmax, x, reference=softmax_ref)
show("softmax: backward keeps only the diagonal y(1-y)", softmax_no_cross_term, x, reference=softmax_ref)
show("softmax: no max subtraction (fine on the given inputs, NaN at large logits)", softmax_naive, x, reference=softmax_ref)
