# A residual block that adds the identity in place to the output of ReLU. ReLU's backward uses its
# output, so `out += identity` breaks it. pytorch/vision#807 (fmassa), Seanny123/da-rnn#14.
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
        out += identity
        return out


torch.manual_seed(0)
block = Block(4)
loss = block(torch.randn(2, 4, 8, 8)).mean()
loss.backward()
print(f"loss={loss.item():.4f}")
