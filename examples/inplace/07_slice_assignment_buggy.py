# Zeroing a feature column by slice assignment after a sigmoid that saved its output.
# AggMan96/RK-Net#9, pytorch/pytorch#9391.
import torch
from torch import nn

torch.manual_seed(0)
encoder = nn.Linear(4, 4)
x = torch.randn(3, 4)
features = torch.sigmoid(encoder(x))
features[:, 0] = 0
loss = features.sum()
loss.backward()
print(f"loss={loss.item():.4f}")
