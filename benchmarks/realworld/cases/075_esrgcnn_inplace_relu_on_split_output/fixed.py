# Reproduction of https://github.com/hellloxiaotian/ESRGCNN/issues/2 (esrgcnn/model/esrgcnn.py: the block splits the
# conv output into distilled and remaining channels and rectifies the remainder with an in-place ReLU; shrunk).
import torch
import torch.nn as nn

torch.manual_seed(0)


class Block(nn.Module):
    def __init__(self, channels=16, distillation_rate=0.25):
        super().__init__()
        self.dc = int(channels * distillation_rate)
        self.rc = channels - self.dc
        self.c1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.c2 = nn.Conv2d(self.rc, channels, 3, padding=1)
        self.c3 = nn.Conv2d(self.dc * 2, channels, 1)
        self.ReLU = nn.ReLU(inplace=False)

    def forward(self, x):
        out1 = self.c1(x)
        dist1, remain1 = torch.split(out1, (self.dc, self.rc), dim=1)
        out1_r = self.ReLU(remain1)
        out2 = self.c2(out1_r)
        dist2, remain2 = torch.split(out2, (self.dc, self.rc), dim=1)
        return self.c3(torch.cat([dist1, dist2], dim=1)) + x


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.entry = nn.Conv2d(3, 16, 3, padding=1)
        self.b1 = Block()
        self.exit = nn.Sequential(nn.Conv2d(16, 3 * 4, 3, padding=1), nn.PixelShuffle(2))

    def forward(self, x):
        return self.exit(self.b1(self.entry(x)))


net = Net()
optimizer = torch.optim.Adam(net.parameters(), lr=1e-4)
lr, hr = torch.randn(2, 3, 8, 8), torch.randn(2, 3, 16, 16)
loss = nn.L1Loss()(net(lr), hr)
optimizer.zero_grad()
loss.backward()
optimizer.step()
print(loss.item())
