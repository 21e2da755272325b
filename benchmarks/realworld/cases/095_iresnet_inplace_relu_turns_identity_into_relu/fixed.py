# Reproduction of https://github.com/iduta/iresnet/pull/2 (models/iresnet.py BasicBlock: in the first middle block
# the block starts with `out = self.relu(x)` while `identity = x` is kept for the shortcut; shrunk to CIFAR size).
import torch
import torch.nn as nn

torch.manual_seed(0)


def conv3x3(in_planes, out_planes, stride=1):
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None, start_block=False, end_block=False,
                 exclude_bn0=False):
        super(BasicBlock, self).__init__()
        if not start_block and not exclude_bn0:
            self.bn0 = nn.BatchNorm2d(inplanes)
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        if start_block:
            self.bn2 = nn.BatchNorm2d(planes)
        if end_block:
            self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride
        self.start_block = start_block
        self.end_block = end_block
        self.exclude_bn0 = exclude_bn0

    def forward(self, x):
        identity = x

        if self.start_block:
            out = self.conv1(x)
        elif self.exclude_bn0:
            out = torch.relu(x)
            out = self.conv1(out)
        else:
            out = self.bn0(x)
            out = self.relu(out)
            out = self.conv1(out)

        out = self.bn1(out)
        out = self.relu(out)
        out = self.conv2(out)

        if self.start_block:
            out = self.bn2(out)

        if self.downsample is not None:
            identity = self.downsample(x)

        out += identity

        if self.end_block:
            out = self.bn2(out)
            out = self.relu(out)

        return out


class iResNet(nn.Module):
    def __init__(self, num_classes=10):
        super(iResNet, self).__init__()
        self.conv1 = nn.Conv2d(3, 16, kernel_size=3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU(inplace=True)
        down = nn.Sequential(nn.Conv2d(16, 32, 1, stride=2, bias=False), nn.BatchNorm2d(32))
        self.layer1 = nn.Sequential(BasicBlock(16, 32, stride=2, downsample=down, start_block=True),
                                    BasicBlock(32, 32, exclude_bn0=True),
                                    BasicBlock(32, 32, end_block=True))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer1(x)
        return self.fc(torch.flatten(self.avgpool(x), 1))


model = iResNet()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
loss = nn.CrossEntropyLoss()(model(torch.randn(2, 3, 8, 8)), torch.tensor([3, 5]))
optimizer.zero_grad()
loss.backward()
optimizer.step()
print(loss.item())
