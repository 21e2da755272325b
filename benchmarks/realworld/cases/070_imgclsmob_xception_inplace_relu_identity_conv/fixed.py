# Reproduction of https://github.com/osmr/imgclsmob/issues/13 (pytorch/pytorchcv/models/xception.py: DwsConvBlock
# starts with `self.activ = nn.ReLU(inplace=True)`; XceptionUnit runs identity_conv(x) before self.body(x)).
import torch
import torch.nn as nn

torch.manual_seed(0)


class DwsConv(nn.Module):
    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.dw_conv = nn.Conv2d(in_channels, in_channels, 3, padding=1, groups=in_channels, bias=False)
        self.pw_conv = nn.Conv2d(in_channels, out_channels, 1, bias=False)

    def forward(self, x):
        return self.pw_conv(self.dw_conv(x))


class DwsConvBlock(nn.Module):
    def __init__(self, in_channels, out_channels, activate):
        super().__init__()
        self.activate = activate
        if self.activate:
            self.activ = nn.ReLU(inplace=False)
        self.conv = DwsConv(in_channels, out_channels)
        self.bn = nn.BatchNorm2d(out_channels)

    def forward(self, x):
        if self.activate:
            x = self.activ(x)
        x = self.conv(x)
        x = self.bn(x)
        return x


class XceptionUnit(nn.Module):
    def __init__(self, in_channels, out_channels, stride, reps, start_with_relu=True, grow_first=True):
        super().__init__()
        self.resize_identity = (in_channels != out_channels) or (stride != 1)
        if self.resize_identity:
            self.identity_conv = nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                                               nn.BatchNorm2d(out_channels))
        self.body = nn.Sequential()
        for i in range(reps):
            if (grow_first and (i == 0)) or ((not grow_first) and (i == reps - 1)):
                in_channels_i, out_channels_i = in_channels, out_channels
            elif grow_first:
                in_channels_i, out_channels_i = out_channels, out_channels
            else:
                in_channels_i, out_channels_i = in_channels, in_channels
            activate = start_with_relu if (i == 0) else True
            self.body.add_module("block{}".format(i + 1), DwsConvBlock(in_channels_i, out_channels_i, activate))
        if stride != 1:
            self.body.add_module("pool", nn.MaxPool2d(kernel_size=3, stride=stride, padding=1))

    def forward(self, x):
        if self.resize_identity:
            identity = self.identity_conv(x)
        else:
            identity = x
        x = self.body(x)
        x = x + identity
        return x


net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8),
                    XceptionUnit(8, 16, stride=2, reps=2, start_with_relu=True),
                    XceptionUnit(16, 16, stride=1, reps=2), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
criterion = nn.CrossEntropyLoss()
loss = criterion(net(torch.randn(2, 3, 16, 16)), torch.tensor([1, 7]))
optimizer.zero_grad()
loss.backward()
optimizer.step()
print(loss.item())
