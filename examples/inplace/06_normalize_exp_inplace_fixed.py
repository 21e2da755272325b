# Fixed: divide out of place (or use torch.softmax, which is also numerically safer).
import torch
from torch import nn

torch.manual_seed(0)
scorer = nn.Linear(4, 3)
x = torch.randn(5, 4)
weights = torch.exp(scorer(x))
weights = weights / weights.sum(dim=1, keepdim=True)
loss = (weights * torch.arange(3.0)).sum()
loss.backward()
print(f"loss={loss.item():.4f}")
