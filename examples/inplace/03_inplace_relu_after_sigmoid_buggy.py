# An in-place ReLU placed after a Sigmoid. Sigmoid's backward uses its own output (sigmoid' = s * (1 - s)),
# so overwriting that output in place destroys what backward needs. wutong16/DistributionBalancedLoss#20.
import torch
from torch import nn

torch.manual_seed(0)
gate = nn.Sequential(nn.Linear(8, 8), nn.Sigmoid(), nn.ReLU(inplace=True), nn.Linear(8, 1))
x = torch.randn(4, 8)
loss = gate(x).pow(2).mean()
loss.backward()
print(f"loss={loss.item():.4f}")
