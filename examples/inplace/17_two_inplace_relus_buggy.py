# Two in-place ReLUs in a row: the second overwrites the output the first saved for its backward.
# pytorch/pytorch#5687 (colesbury), #34429.
import torch
from torch import nn

torch.manual_seed(0)
net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(inplace=True), nn.ReLU(inplace=True), nn.Linear(8, 1))
loss = net(torch.randn(3, 4)).sum()
loss.backward()
print(f"loss={loss.item():.4f}")
