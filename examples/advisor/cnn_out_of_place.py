"""A small ResNet-style CNN written out-of-place, with named intermediates (a common style), and the
in-place memory advisor run on one training step (SGD with momentum).

    python examples/advisor/cnn_out_of_place.py
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

import gradguard


class Block(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        c1 = self.conv1(x)
        n1 = self.bn1(c1)
        a1 = F.relu(n1)
        c2 = self.conv2(a1)
        n2 = self.bn2(c2)
        s = n2 + x  # residual
        return F.relu(s)


class SmallCNN(nn.Module):
    def __init__(self, channels=32, classes=10):
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.block1 = Block(channels)
        self.block2 = Block(channels)
        self.head = nn.Linear(channels, classes)

    def forward(self, x):
        stem = self.stem(x)
        act = F.relu(stem)
        b1 = self.block1(act)
        b2 = self.block2(b1)
        pooled = F.adaptive_avg_pool2d(b2, 1).flatten(1)
        logits = self.head(pooled)
        return logits


def main(repeats=3):
    torch.manual_seed(0)
    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    images = torch.randn(16, 3, 32, 32)
    labels = torch.randint(0, 10, (16,))

    def train_step():
        opt.zero_grad()
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        opt.step()
        return loss.detach()

    report = gradguard.advise(train_step, repeats=repeats)
    print(report)
    return report


if __name__ == "__main__":
    main()
