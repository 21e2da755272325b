# `*=` on the output of tanh, which tanh's backward needs (tanh' = 1 - t^2). yunik1004/SAiD#8.
import torch
from torch import nn

torch.manual_seed(0)
proj = nn.Linear(6, 6)
x = torch.randn(5, 6)
h = torch.tanh(proj(x))
h *= 0.5
loss = h.sum()
loss.backward()
print(f"loss={loss.item():.4f}")
