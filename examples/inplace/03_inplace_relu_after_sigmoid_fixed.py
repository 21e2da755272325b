# Fixed: the ReLU after Sigmoid is out of place. (An in-place ReLU right after Linear or BatchNorm is safe:
# neither saves its output for backward.)
import torch
from torch import nn

torch.manual_seed(0)
gate = nn.Sequential(nn.Linear(8, 8), nn.Sigmoid(), nn.ReLU(inplace=False), nn.Linear(8, 1))
x = torch.randn(4, 8)
loss = gate(x).pow(2).mean()
loss.backward()
print(f"loss={loss.item():.4f}")
