# Correct program. The in-place uses fmassa calls safe in https://github.com/pytorch/vision/issues/807 (torchvision resnet.py BasicBlock).
import torch
from torch import nn

torch.manual_seed(0)


class BasicBlock(nn.Module):
    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)
        out = self.conv2(out)
        out = self.bn2(out)
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        out = self.relu(out)
        return out


net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(inplace=True), BasicBlock(4, 4),
                    BasicBlock(4, 8, 2, nn.Sequential(nn.Conv2d(4, 8, 1, 2, bias=False), nn.BatchNorm2d(8))))
opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
for _ in range(2):
    loss = net(torch.randn(2, 3, 8, 8)).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print(loss.item())
