# Fixed: the residual sum is out of place, so ReLU's output stays intact for its backward.
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)
        self.relu = nn.ReLU()

    def forward(self, x):
        identity = x
        out = self.relu(self.conv(x))
        out = out + identity
        return out


torch.manual_seed(0)
block = Block(4)
loss = block(torch.randn(2, 4, 8, 8)).mean()
loss.backward()
print(f"loss={loss.item():.4f}")
