# Reproduction of https://github.com/pytorch/pytorch/issues/15428 (ChunML: the first layer of self.residual modifies x in place).
import torch
from torch import nn

torch.manual_seed(0)


class Block(nn.Module):
    def __init__(self, in_chan, out_chan, stride=1):
        super(Block, self).__init__()
        self.in_chan, self.out_chan, self.stride = in_chan, out_chan, stride
        self.residual = nn.Sequential(
            nn.ReLU(inplace=True),
            nn.Conv2d(in_chan, out_chan, 3, stride, 1),
            nn.BatchNorm2d(out_chan),
        )
        self.shortcut = nn.Conv2d(in_chan, out_chan, 1, stride)

    def forward(self, x):
        if not self.stride == 1 or not self.in_chan == self.out_chan:
            sc = self.shortcut(x)
        else:
            sc = x
        resd = self.residual(x)
        out = resd + sc
        return out


net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), Block(4, 8, 2))
x = torch.randn(2, 3, 8, 8)
loss = net(x).mean()
loss.backward()
print(loss.item())
