"""Layer norm with a hand-written backward: correct, a dropped projection term, and eps dropped in backward."""

import torch

from _show import show
from kernels import layer_norm, layer_norm_eps_dropped, layer_norm_no_mean_term, layer_norm_ref

g = torch.Generator().manual_seed(2)
x, w, b = torch.randn(4, 8, generator=g), 1 + 0.1 * torch.randn(8, generator=g), 0.1 * torch.randn(8, generator=g)
show("layer norm: correct", layer_norm, x, w, b, reference=layer_norm_ref)
show("layer norm: backward drops xhat * mean(g * xhat)", layer_norm_no_mean_term, x, w, b, reference=layer_norm_ref)
show("layer norm: backward recomputes rstd without eps (wrong only for near-constant rows)", layer_norm_eps_dropped,
     x, w, b, reference=layer_norm_ref)
show("layer norm in bfloat16 against F.layer_norm: no false alarm", layer_norm,
     x.bfloat16(), w.bfloat16(), b.bfloat16(), reference=layer_norm_ref)
