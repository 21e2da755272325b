# Reproduction of https://github.com/wy1iu/sphereface/issues/2 (the margin inner product layer normalises its weight
# by overwriting it in forward, so no gradient flows through the normalisation; written as the PyTorch ports of
# SphereFace's AngleLinear write it).
import torch
import torch.nn as nn
from torch.nn import Parameter

torch.manual_seed(0)


class AngleLinear(nn.Module):
    def __init__(self, in_features, out_features, m=4):
        super(AngleLinear, self).__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = Parameter(torch.Tensor(in_features, out_features))
        self.weight.data.uniform_(-1, 1).renorm_(2, 1, 1e-5).mul_(1e5)
        self.m = m
        self.mlambda = [lambda x: x ** 0, lambda x: x ** 1, lambda x: 2 * x ** 2 - 1, lambda x: 4 * x ** 3 - 3 * x,
                        lambda x: 8 * x ** 4 - 8 * x ** 2 + 1]

    def forward(self, input):
        x = input  # size=(B,F)
        w = self.weight  # size=(F,Classnum)
        w.data = w.data.renorm(2, 1, 1e-5).mul(1e5)  # normalize weight by overwriting
        xlen = x.pow(2).sum(1).pow(0.5)  # size=B
        cos_theta = x.mm(w)  # size=(B,Classnum)
        cos_theta = cos_theta / xlen.view(-1, 1)
        cos_theta = cos_theta.clamp(-1, 1)
        cos_m_theta = self.mlambda[self.m](cos_theta)
        theta = cos_theta.data.acos()
        k = (self.m * theta / 3.14159265).floor()
        phi_theta = ((-1.0) ** k) * cos_m_theta - 2 * k
        cos_theta = cos_theta * xlen.view(-1, 1)
        phi_theta = phi_theta * xlen.view(-1, 1)
        return cos_theta, phi_theta


class AngleLoss(nn.Module):
    def __init__(self, lamb=5.0):
        super(AngleLoss, self).__init__()
        self.lamb = lamb

    def forward(self, input, target):
        cos_theta, phi_theta = input
        index = torch.zeros_like(cos_theta, dtype=torch.bool).scatter_(1, target.view(-1, 1), True)
        output = torch.where(index, cos_theta - cos_theta / (1 + self.lamb) + phi_theta / (1 + self.lamb), cos_theta)
        return nn.functional.cross_entropy(output, target)


net = nn.Sequential(nn.Linear(16, 8), nn.PReLU(), AngleLinear(8, 5))
criterion = AngleLoss()
optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
for step in range(2):
    x, y = torch.randn(6, 16), torch.randint(0, 5, (6,))
    loss = criterion(net(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(loss.item())
