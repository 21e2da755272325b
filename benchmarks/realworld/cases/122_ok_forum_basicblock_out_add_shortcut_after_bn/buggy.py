# Reproduction of https://discuss.pytorch.org/t/when-inplace-operation-are-allowed-and-when-not/169583 (the poster's
# ResNet BasicBlock, found on GitHub: `out += self.shortcut(x)` runs without error in training, because the tensor it
# writes is a BatchNorm output that no backward needs; a correct program. Two blocks, one SGD step on CPU).
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_planes, planes, stride=1,
                 shortcut_enabled=True,
                 device='cpu'
                 ):
        super(BasicBlock, self).__init__()

        self.shortcut_enabled = shortcut_enabled

        self.conv1 = nn.Conv2d(in_planes, planes,
                               kernel_size=3,
                               stride=stride, padding=1, bias=False,
                               device=device)
        self.bn1 = nn.BatchNorm2d(planes, device=device)
        self.conv2 = nn.Conv2d(planes, planes,
                               kernel_size=3,
                               stride=1, padding=1, bias=False,
                               device=device)
        self.bn2 = nn.BatchNorm2d(planes, device=device)

        if self.shortcut_enabled:
            self.shortcut = nn.Sequential()
            if stride != 1 or in_planes != self.expansion * planes:
                self.shortcut = nn.Sequential(nn.Conv2d(in_planes, self.expansion * planes, kernel_size=1, stride=stride,
                                                        bias=False, device=device),
                                              nn.BatchNorm2d(self.expansion * planes, device=device))

    def forward(self, x, verbose=0):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.shortcut_enabled:
            out += self.shortcut(x)
        out = F.relu(out)
        return out


model = nn.Sequential(BasicBlock(3, 8, stride=2), BasicBlock(8, 8), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                      nn.Linear(8, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
criterion = nn.CrossEntropyLoss()
inputs = torch.randn(4, 3, 16, 16)
targets = torch.randint(0, 10, (4,))

model.train()
optimizer.zero_grad()
loss = criterion(model(inputs), targets)
loss.backward()
optimizer.step()

model.eval()
with torch.no_grad():
    print(loss.item(), model(inputs).argmax(1).tolist())
