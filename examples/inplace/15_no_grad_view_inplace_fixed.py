# Fixed: the inspected slice is a detached copy, so clamping it leaves the graph alone.
import torch
from torch import nn

torch.manual_seed(0)
encoder = nn.Linear(4, 6)
hidden = encoder(torch.randn(3, 4))
with torch.no_grad():
    first = hidden[:, :2].clone()
first.clamp_(min=0)
loss = hidden.sum()
loss.backward()
print(f"loss={loss.item():.4f}")
