"""The fix for 05: the branch's first ReLU out of place (the upstream fix); the second one stays in place.

    gradguard run --mode forensic examples/hygiene/05_resblock_inplace_relu_fixed.py
"""

import torch
from torch import nn


class ResBlock(nn.Module):
    def __init__(self, in_channel, channel):
        super().__init__()
        self.conv = nn.Sequential(
            nn.ReLU(),
            nn.Conv2d(in_channel, channel, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(channel, in_channel, 1),
        )

    def forward(self, input):
        out = self.conv(input)
        out += input
        return out


torch.manual_seed(0)
block = ResBlock(4, 8)
x = torch.randn(2, 4, 8, 8, requires_grad=True)
h = x * 1.0  # an activation, as inside the VQ-VAE encoder
out = block(h)
out.sum().backward()

expected = block.conv[3](torch.relu(block.conv[1](torch.relu(x))))
print("skip path adds the input as it was:", torch.allclose(out, expected + x))
